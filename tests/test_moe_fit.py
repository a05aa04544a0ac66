"""Router fitting: two synthetic capabilities, a tiny random Llama, real PEFT adapters."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from traceops.errors import ConfigError, InputError
from traceops.moe import RouteConfig, build_moe, evaluate_routing, fit_router
from traceops.moe.decision import prompt_means, prompt_targets
from traceops.moe.fit import _batch, _encode, _lm_loss, _routed_lm_loss, _split_head

WORDS_A = [f"alpha{i}" for i in range(30)]
WORDS_B = [f"beta{i}" for i in range(30)]
SPECIALS = ["<pad>", "<unk>", "<eos>", "user", "assistant", ":"]


def word_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(SPECIALS + WORDS_A + WORDS_B)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>",
                                        eos_token="<eos>")
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} <eos> {% endfor %}"
        "{% if add_generation_prompt %}assistant : {% endif %}"
    )
    return tokenizer


def tiny_llama(vocab: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, eos_token_id=2)
    return LlamaForCausalLM(config).eval()


def adapter(base: LlamaForCausalLM, folder: Path, seed: int) -> Path:
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    model = get_peft_model(copy.deepcopy(base), config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    model.save_pretrained(str(folder))
    return folder


def dataset(words: list[str], n: int, seed: int, chats: int = 0) -> list:
    rng = random.Random(seed)
    texts: list = [" ".join(rng.choice(words) for _ in range(rng.randint(6, 12))) for _ in range(n)]
    # Chat conversations: the LM loss then covers the answer only. Their template tokens are shared by
    # both capabilities, so they cannot be routed by token identity: the accuracy test uses texts.
    texts += [[{"role": "user", "content": " ".join(rng.choices(words, k=5))},
               {"role": "assistant", "content": " ".join(rng.choices(words, k=4))}] for _ in range(chats)]
    return texts


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory):
    tokenizer = word_tokenizer()
    base = tiny_llama(len(tokenizer))
    root = tmp_path_factory.mktemp("fit")
    dirs = {"lookup": adapter(base, root / "lookup", 1), "refusal": adapter(base, root / "refusal", 2)}
    examples = {"lookup": dataset(WORDS_A, 30, 0), "refusal": dataset(WORDS_B, 30, 1)}
    return tokenizer, base, dirs, examples


@pytest.mark.slow
def test_fit_router_learns_to_route_each_capability_to_its_expert(setup):
    tokenizer, base, dirs, examples = setup
    moe = build_moe(copy.deepcopy(base), dirs, top_k=2)
    frozen = {n: p.detach().clone() for n, p in moe.model.named_parameters() if "moe_router" not in n}
    # SGD alone, no probe phase.
    config = RouteConfig(steps=30, batch_size=8, learning_rate=5e-2, seed=0, probe_steps=0).fit_config()
    result = fit_router(moe, tokenizer, examples, config)
    assert result.routing_accuracy > 0.9
    assert result.sequence_accuracy > 0.9
    assert result.initial_routing_accuracy < 0.8
    assert set(result.per_capability_accuracy) == {"lookup", "refusal"}
    assert len(result.losses["route"]) == 30 and result.losses["route"][-1] < result.losses["route"][0]
    assert result.n_heldout == 2 * 6 and result.n_train == 2 * 24
    # Only the routers moved; requires_grad flags are restored.
    for name, param in moe.model.named_parameters():
        if "moe_router" not in name:
            assert torch.equal(param, frozen[name]), name
    assert all(p.requires_grad for p in moe.model.parameters())
    # Unseen examples route to their capability's expert; shares over experts + null sum to 1.
    unseen = {"lookup": dataset(WORDS_A, 4, 9), "refusal": dataset(WORDS_B, 4, 8)}
    report = evaluate_routing(moe, tokenizer, unseen)
    for capability, row in report.items():
        assert row["expert"] == capability and row["token_accuracy"] > 0.9
        assert sum(row["share"].values()) == pytest.approx(1.0, abs=1e-5)
        assert row["share"][capability] > 0.5


def test_fit_router_is_seeded_and_takes_conversations(setup):
    tokenizer, base, dirs, _ = setup
    examples = {"lookup": dataset(WORDS_A, 4, 0, chats=3), "refusal": dataset(WORDS_B, 4, 1, chats=3)}
    results = []
    for _ in range(2):
        moe = build_moe(copy.deepcopy(base), dirs)
        config = RouteConfig(steps=3, batch_size=4, learning_rate=5e-3, seed=7).fit_config()
        results.append(fit_router(moe, tokenizer, examples, config))
    assert results[0].losses == results[1].losses
    assert results[0].n_train + results[0].n_heldout == 14
    assert all(value > 0 for value in results[0].losses["lm"])


def test_encode_labels_every_assistant_turn_and_keeps_the_tail() -> None:
    tokenizer = word_tokenizer()
    chat = [{"role": "user", "content": "alpha1 alpha2"}, {"role": "assistant", "content": "beta1"},
            {"role": "user", "content": "alpha3"}, {"role": "assistant", "content": "beta2 beta3"}]
    row = {"messages": chat, "tools": "[]"}  # an SFT row, as traceops.train.data.sft_rows writes them
    encoded = _encode(tokenizer, row, expert=1, max_length=64, where="row")
    words = tokenizer.convert_ids_to_tokens(encoded.input_ids)
    labelled = [w for w, label in zip(words, encoded.labels, strict=True) if label != -100]
    # The answers (with their end-of-turn token), not the prompts or the "assistant :" headers.
    assert labelled == ["beta1", "<eos>", "beta2", "beta3", "<eos>"]
    assert encoded.expert == 1
    short = _encode(tokenizer, row, expert=1, max_length=6, where="row")
    assert short.input_ids == encoded.input_ids[-6:] and short.labels == encoded.labels[-6:]
    # Decision prompts: the conversation up to each assistant turn, generation prompt included, as the
    # agent loop renders them; a conversation cut to its tail has lost their head and has none.
    prompts = [tokenizer.apply_chat_template(chat[:i], tokenize=True, add_generation_prompt=True)
               for i in (1, 3)]
    prompts = [list(p["input_ids"] if hasattr(p, "keys") else p) for p in prompts]
    assert encoded.decision_ends == [len(p) for p in prompts]
    assert all(encoded.input_ids[:len(p)] == p for p in prompts)
    assert short.decision_ends == []
    with pytest.raises(InputError):
        _encode(tokenizer, {"messages": []}, expert=0, max_length=8, where="bad")


def test_lm_loss_on_labelled_positions_equals_the_full_logits_loss(setup) -> None:
    tokenizer, base, dirs, _ = setup
    moe = build_moe(copy.deepcopy(base), dirs)
    assert _split_head(moe.model) is not None  # the shortcut is taken for a Llama
    rows = [[{"role": "user", "content": "alpha1 alpha2 alpha3"},
             {"role": "assistant", "content": "beta4 beta5"}],
            [{"role": "user", "content": "beta1"}, {"role": "assistant", "content": "alpha7"}]]
    encoded = [_encode(tokenizer, r, 0, 64, "r") for r in rows]
    batch = _batch(encoded, tokenizer.pad_token_id, torch.device("cpu"))
    with torch.no_grad():
        full = moe(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
        expected = _lm_loss(full.logits, batch["labels"])
        got = _routed_lm_loss(moe, batch)
    assert float(expected) > 0
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_probe_phase_alone_routes_each_capability_and_freezes_the_rest(setup):
    tokenizer, base, dirs, examples = setup
    moe = build_moe(copy.deepcopy(base), dirs, top_k=2)
    frozen = {n: p.detach().clone() for n, p in moe.model.named_parameters() if "moe_router" not in n}
    config = RouteConfig(steps=0, probe_steps=100, probe_tokens=8, batch_size=8, seed=0).fit_config()
    result = fit_router(moe, tokenizer, examples, config)
    assert result.losses["route"] == []  # no SGD step: the probes alone
    assert result.probe_samples > 0 and result.probe_seconds > 0
    assert result.probe_train_accuracy is not None and result.probe_train_accuracy > 0.9
    assert result.initial_routing_accuracy < 0.8
    assert result.probe_routing_accuracy == result.routing_accuracy > 0.9
    for name, param in moe.model.named_parameters():
        if "moe_router" not in name:
            assert torch.equal(param, frozen[name]), name


def test_fit_with_neither_probe_nor_steps_is_refused():
    with pytest.raises(ConfigError, match="nothing would fit"):
        RouteConfig(steps=0, probe_steps=0)


def test_prompt_means_are_the_mean_normalized_input_over_each_prompt() -> None:
    hidden = torch.randn(2, 5, 8)
    ends = torch.tensor([[2, 5], [3, 0]])
    got = prompt_means(hidden, ends)
    normed = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + 1e-6)
    expected = torch.stack([normed[0, :2].mean(0), normed[0, :5].mean(0), normed[1, :3].mean(0)])
    torch.testing.assert_close(got, expected)
    assert prompt_targets(torch.tensor([1, 0]), ends).tolist() == [1, 1, 0]


def shared_prefix_chats(words: list[str], n: int, seed: int) -> list:
    """Conversations whose long system prompt is the same for every capability: only the user turns
    and answers (a few tokens) tell the capability, as on agent prompts with shared tool schemas."""
    rng = random.Random(seed)
    system = " ".join(WORDS_A[i % 30] if i % 2 else WORDS_B[i % 30] for i in range(40))
    return [[{"role": "system", "content": system},
             {"role": "user", "content": " ".join(rng.choices(words, k=3))},
             {"role": "assistant", "content": " ".join(rng.choices(words, k=3))},
             {"role": "user", "content": " ".join(rng.choices(words, k=2))},
             {"role": "assistant", "content": " ".join(rng.choices(words, k=2))}] for _ in range(n)]


@pytest.mark.slow
def test_fit_supervises_the_request_decision_on_whole_prompts(setup):
    tokenizer, base, dirs, _ = setup
    examples = {"lookup": shared_prefix_chats(WORDS_A, 20, 0), "refusal": shared_prefix_chats(WORDS_B, 20, 1)}
    moe = build_moe(copy.deepcopy(base), dirs, top_k=1, mode="request")
    config = RouteConfig(steps=4, batch_size=4, learning_rate=5e-3, probe_steps=100, probe_tokens=8, seed=0)
    result = fit_router(moe, tokenizer, examples, config.fit_config())
    # Two decision prompts per held-out conversation (one per assistant turn).
    assert result.decision_prompts == 2 * result.n_heldout == 16
    assert result.initial_decision_accuracy is not None and result.initial_decision_accuracy < 0.9
    assert result.probe_decision_accuracy is not None and result.decision_accuracy is not None
    assert result.decision_accuracy > 0.9
    # The measure is the composite's own request decision: the gate a prefill of the prompt fixes.
    chat = examples["refusal"][0][:3]
    ids = tokenizer.apply_chat_template(chat[:2], tokenize=True, add_generation_prompt=True)
    ids = torch.tensor([list(ids["input_ids"] if hasattr(ids, "keys") else ids)])
    gate = moe.request_gates(ids)
    assert moe.experts[int(gate[0].argmax())] == "refusal"


@pytest.mark.parametrize("routing", ["own", "base"])
def test_probe_runs_a_shared_start_once_with_the_samples_of_whole_rows(setup, routing):
    from traceops.moe.fit import _probe_batches, _route_forward
    from traceops.moe.probe import collect_block_inputs, shared_start

    tokenizer, base, dirs, _ = setup
    moe = build_moe(copy.deepcopy(base), dirs, top_k=1, mode="request")
    chats = {0: shared_prefix_chats(WORDS_A, 5, 0), 1: shared_prefix_chats(WORDS_B, 5, 1)}
    items = [_encode(tokenizer, chat, expert, 512, f"{expert}[{i}]")
             for expert, rows in chats.items() for i, chat in enumerate(rows)]
    batches = _probe_batches(items, tokenizer.pad_token_id, 4, moe.device)
    # One capability per batch: the 40-word system prompt and the template around it are shared.
    assert [int(b["target"].unique().numel()) for b in batches] == [1] * 4
    assert all(shared_start(b, routing, moe.model) > 40 for b in batches)
    mixed = _batch(items[3:7], tokenizer.pad_token_id, moe.device)
    # Rows of two experts share the system prompt, but not the gate their start would run under.
    assert shared_start(mixed, "own", moe.model) == 0 and shared_start(mixed, "base", moe.model) > 40
    whole, shared = (collect_block_inputs(moe, batches + [mixed], _route_forward, 16, (routing,), seed=3,
                                          share_start=share) for share in (False, True))
    assert torch.equal(whole.targets, shared.targets) and whole.count == 10 * 16 + 4 * 16
    for layer, features in whole.features.items():
        torch.testing.assert_close(shared.features[layer], features, rtol=1e-4, atol=1e-4)
    if routing == "base":  # the decision prompts' means read the start too
        assert whole.decisions is not None and shared.decisions is not None
        assert torch.equal(whole.decisions.targets, shared.decisions.targets)
        for layer, features in whole.decisions.features.items():
            torch.testing.assert_close(shared.decisions.features[layer], features, rtol=1e-4, atol=1e-4)


def test_probe_store_reuses_an_unchanged_capabilitys_samples_with_the_same_fit(setup, tmp_path):
    from traceops.moe.probe_cache import ProbeStore

    tokenizer, base, dirs, _ = setup
    config = RouteConfig(steps=0, probe_steps=10, probe_tokens=8, seed=0).fit_config()
    assert config.probe_routings == ("base",)  # request mode: adapter-independent samples, cacheable

    def fit(examples, store):
        moe = build_moe(copy.deepcopy(base), dirs, top_k=1, mode="request", base_weights_hash="tiny@0")
        calls = []
        moe.model.get_decoder().register_forward_pre_hook(lambda module, args: calls.append(1))
        return fit_router(moe, tokenizer, examples, config, probe_store=store), len(calls)

    examples = {"lookup": shared_prefix_chats(WORDS_A, 6, 0), "refusal": shared_prefix_chats(WORDS_B, 6, 1)}
    fresh, fresh_calls = fit(examples, None)
    first, first_calls = fit(examples, ProbeStore(tmp_path))
    entries = {path.name for path in tmp_path.iterdir()}
    assert len(entries) == 4  # per capability: the probe samples and the held-out decision prompts
    store = ProbeStore(tmp_path)
    again, again_calls = fit(examples, store)
    assert store.used == {name.split(".")[0] for name in entries}
    # The same samples, so the same routers; only the held-out measures ran the model.
    for result in (first, again):
        assert (result.routing_accuracy, result.decision_accuracy, result.probe_train_accuracy) == (
            fresh.routing_accuracy, fresh.decision_accuracy, fresh.probe_train_accuracy)
    assert first_calls == fresh_calls > again_calls
    # One capability's demonstrations change: only its entries are collected again; prune drops the old.
    changed = {**examples, "lookup": shared_prefix_chats(WORDS_A, 6, 5)}
    store = ProbeStore(tmp_path)
    fit(changed, store)
    assert store.prune() and len(list(tmp_path.iterdir())) == 4
    assert len({path.name for path in tmp_path.iterdir()} & entries) == 2


def logged_chats(words: list[str], n: int, seed: int) -> list:
    """Logged requests as the keep-base draw renders them: the shared system prompt, a user turn, the
    reply."""
    return [chat[:3] for chat in shared_prefix_chats(words, n, seed)]


@pytest.mark.parametrize("separable", [True, False])
def test_keep_base_examples_route_the_bases_successes_to_the_null_expert_when_held_out_ones_do(
        setup, separable):
    tokenizer, base, dirs, _ = setup
    examples = {"lookup": shared_prefix_chats(WORDS_A, 12, 0), "refusal": shared_prefix_chats(WORDS_B, 12, 1)}
    # The base's successes: requests in words of their own (separable), or drawn like the failures.
    successes = WORDS_A[20:] if separable else WORDS_A[:20]
    logged = {"null": logged_chats(successes, 40, 2), "lookup": logged_chats(WORDS_A[:20], 40, 3)}
    moe = build_moe(copy.deepcopy(base), dirs, top_k=1, mode="request", null_expert=True)
    config = RouteConfig(probe_steps=150, probe_tokens=8, seed=0, keep_base=True).fit_config()
    result = fit_router(moe, tokenizer, examples, config, logged=logged)
    verdict = result.keep_base
    assert verdict is not None
    assert verdict["heldout_prompts"] == {"lookup": 8, "null": 8}
    assert verdict["train_prompts"] == {"lookup": 32, "null": 32}
    assert verdict["kept"] is separable, verdict
    null = moe.config.num_experts
    prompt = logged["null"][0][:2]
    ids = tokenizer.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True)
    ids = torch.tensor([list(ids["input_ids"] if hasattr(ids, "keys") else ids)])
    chosen = int(moe.request_gates(ids)[0].argmax()) if moe.request_gates(ids)[0].sum() else null
    if separable:
        assert verdict["recall"]["null"] >= 0.8 and verdict["reason"] is None
        assert chosen == null  # the base answers what it answered right
        assert result.decision_accuracy is not None and result.decision_accuracy >= 0.8
    else:
        assert "routed to it" in verdict["reason"]
        assert chosen != null
        # Refitted from the same start without them: the routers a fit without keep-base examples gives.
        plain = build_moe(copy.deepcopy(base), dirs, top_k=1, mode="request", null_expert=True)
        fit_router(plain, tokenizer, examples, config)
        for path, router in moe.routers.items():
            torch.testing.assert_close(router.proj.weight, plain.routers[path].proj.weight)


def test_keep_base_needs_a_null_expert_and_a_probe_phase(setup):
    tokenizer, base, dirs, examples = setup
    assert not RouteConfig(null_expert=False).keeps_base
    assert not RouteConfig(probe_steps=0, steps=1).keeps_base
    assert RouteConfig().keeps_base and not RouteConfig(keep_base=False).keeps_base
    moe = build_moe(copy.deepcopy(base), dirs, top_k=1, null_expert=False)
    with pytest.raises(ConfigError, match="null expert"):
        fit_router(moe, tokenizer, examples, RouteConfig(probe_steps=10).fit_config(), logged={})
