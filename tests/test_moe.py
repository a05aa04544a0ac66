"""Correctness of the stacked MoE-LoRA on a random-init tiny Llama with real PEFT adapters."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LlamaConfig, LlamaForCausalLM

from traceops.errors import ConfigError, InputError
from traceops.moe import build_moe, load_moe, read_config, save_moe
from traceops.moe.layer import moe_lora_delta
from traceops.moe.router import masked_mean, request_scores, topk_gate

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# name -> (rank, alpha, rslora): different ranks exercise padding, rsLoRA a different scaling rule.
ADAPTERS = {"alpha": (4, 8, False), "beta": (8, 16, False), "gamma": (2, 4, True)}
VOCAB = 96


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return LlamaForCausalLM(config).eval()


def make_adapter(base: LlamaForCausalLM, folder: Path, rank: int, alpha: int, rslora: bool, seed: int,
                 targets: list[str] = TARGETS, **extra: object) -> Path:
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, use_rslora=rslora, lora_dropout=0.0,
                        **extra)
    peft_model = get_peft_model(copy.deepcopy(base), config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name or "lora_A" in name:  # B starts at zero in PEFT: make every delta real
                param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    peft_model.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def base() -> LlamaForCausalLM:
    return tiny_llama()


@pytest.fixture(scope="module")
def adapters(base: LlamaForCausalLM, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {name: make_adapter(base, root / name, r, a, rs, seed=i)
            for i, (name, (r, a, rs)) in enumerate(ADAPTERS.items())}


def prompt_ids(batch: int = 2, length: int = 7, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def randomize_routers(moe, seed: int = 3, std: float = 1.0) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in moe.router_parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * std)


@pytest.mark.parametrize("compute", ["dense", "auto"])
def test_single_expert_with_gate_one_equals_peft_lora(base, adapters, compute):
    moe = build_moe(copy.deepcopy(base), adapters)
    moe.compute = compute
    ids = prompt_ids()
    for name, folder in adapters.items():
        reference = PeftModel.from_pretrained(copy.deepcopy(base), str(folder)).eval()
        with torch.no_grad():
            expected = reference(input_ids=ids).logits
            with moe.forced({name: 1.0}):
                got = moe(input_ids=ids).logits
        assert (got - expected).abs().max().item() < 1e-5, name
    with torch.no_grad(), moe.forced({}):  # all weight on the null expert: the base model itself
        assert (moe(input_ids=ids).logits - base(input_ids=ids).logits).abs().max().item() < 1e-5


def _peft_delta(folder: Path, module: str, x: torch.Tensor) -> torch.Tensor:
    """A LoRA delta computed straight from the adapter files, independently of traceops."""
    config = json.loads((folder / "adapter_config.json").read_text())
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    a = tensors[f"base_model.model.{module}.lora_A.weight"]
    b = tensors[f"base_model.model.{module}.lora_B.weight"]
    rank = a.shape[0]
    scale = config["lora_alpha"] / (math.sqrt(rank) if config["use_rslora"] else rank)
    return x @ a.T @ b.T * scale


@pytest.mark.parametrize("null_expert", [False, True])
def test_top_k_equal_to_all_experts_is_the_dense_weighted_sum(base, adapters, null_expert):
    experts = len(adapters) + int(null_expert)
    moe = build_moe(copy.deepcopy(base), adapters, top_k=experts, null_expert=null_expert)
    randomize_routers(moe)
    router = moe.routers["model.layers.1"]
    hidden = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        gate = router.route(hidden)
        assert torch.allclose(gate, router.logits(hidden).softmax(-1), atol=1e-6)
        for module in ("model.layers.1.self_attn.v_proj", "model.layers.1.mlp.down_proj"):
            layer = moe.layers[module]
            x = torch.randn(2, 5, layer.in_features, generator=torch.Generator().manual_seed(6))
            expected = layer.base(x) + sum(gate[..., i:i + 1] * _peft_delta(folder, module, x)
                                           for i, folder in enumerate(adapters.values()))
            assert (layer(x) - expected).abs().max().item() < 1e-5


def test_top_k_gate_is_static_and_renormalized():
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.0]])
    gate = topk_gate(logits, 2)
    assert gate.shape == logits.shape
    assert torch.count_nonzero(gate).item() == 2
    assert torch.allclose(gate.sum(-1), torch.ones(1))
    assert gate[0, 1] > gate[0, 3] > 0 and gate[0, 0] == 0 and gate[0, 2] == 0


def test_generation_routes_like_the_full_forward_and_matches_without_cache(base, adapters):
    moe = build_moe(copy.deepcopy(base), adapters, top_k=2)
    randomize_routers(moe)
    ids = prompt_ids(batch=2, length=6)
    settings = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, output_logits=True,
                    return_dict_in_generate=True)
    with torch.no_grad():
        with moe.trace() as gen_trace:
            cached = moe.generate(ids, attention_mask=torch.ones_like(ids), use_cache=True, **settings)
        uncached = moe.generate(ids, attention_mask=torch.ones_like(ids), use_cache=False, **settings)
        assert torch.equal(cached.sequences, uncached.sequences)
        full_ids = cached.sequences
        with moe.trace() as full_trace:
            full = moe(input_ids=full_ids, attention_mask=torch.ones_like(full_ids)).logits
    # Step logits: incremental decoding with KV cache equals one full-sequence forward.
    for step, logits in enumerate(cached.logits):
        assert (logits - full[:, ids.shape[1] - 1 + step]).abs().max().item() < 1e-5
    # Routing: every position's gate in every layer is the same in both paths.
    assert len(gen_trace.calls) == 6 and gen_trace.calls[1].past_length == ids.shape[1]
    full_gates = full_trace.calls[0].gates
    for call in gen_trace.calls:
        for layer, gate in call.gates.items():
            span = full_gates[layer][:, call.past_length: call.past_length + call.length]
            assert torch.equal(gate > 0, span > 0)
            assert (gate - span).abs().max().item() < 1e-5
    summary = gen_trace.summary()
    assert summary["tokens"] == 2 * (6 + 5)
    shares = [v for k, v in summary.items() if k.startswith("share/")]
    assert abs(sum(shares) - 1.0) < 1e-6
    assert abs(sum(v for k, v in summary.items() if k.startswith("selected/")) - 2.0) < 1e-6
    records = gen_trace.tokens()
    assert len(records) == 2 * (6 + 5)
    assert all(len(layer["experts"]) == 2 and abs(sum(layer["weights"]) - 1) < 1e-5
               for r in records for layer in r["layers"])


def test_request_mode_keeps_the_prompt_decision_while_decoding(base, adapters):
    moe = build_moe(copy.deepcopy(base), adapters, top_k=2, mode="request")
    randomize_routers(moe)
    ids = prompt_ids(batch=2, length=6)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding must not enter the prompt decision
    with torch.no_grad():
        with moe.trace() as trace:
            moe.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
        # The decision: the routers on the base model's block inputs (every weight on the null expert),
        # each block's prompt-pooled scores combined into one choice for the whole model.
        with moe.forced({}), moe.collect_logits() as logits:
            moe(input_ids=ids, attention_mask=mask)
    expected = topk_gate(request_scores([logits[i] for i in sorted(logits)], mask), 2)
    per_block = {int(masked_mean(lg, mask).argmax(-1)[0]) for lg in logits.values()}
    assert len(logits) == len(moe.routers) and len(per_block) > 1  # the blocks alone would disagree
    for layer in logits:
        for call in trace.calls:
            gate = call.gates[layer]
            assert torch.allclose(gate, expected[:, None, :].expand_as(gate), atol=1e-6)
    assert trace.summary()["tokens"] == 2 * (6 + 3) - 2


def test_request_scores_average_the_blocks_probabilities_over_the_prompt():
    mask = torch.tensor([[0, 1, 1]])  # the padded position must not count
    vote = torch.tensor([[[0.0, 0.0, 50.0], [2.0, 0.0, 0.0], [2.0, 0.0, 0.0]]])
    blocks = [vote, vote.clone(), torch.tensor([[[0.0, 0.0, 0.0], [0.0, 30.0, 0.0], [0.0, 30.0, 0.0]]])]
    scores = request_scores(blocks, mask)
    assert scores.shape == (1, 3)
    # Two blocks lean to expert 0, one is sure of expert 1: the mean probability picks expert 0, where a
    # mean of log-probabilities would let the one confident block veto the other two.
    assert int(scores.argmax(-1)) == 0
    assert int(torch.stack([masked_mean(b, mask).log_softmax(-1) for b in blocks]).mean(0).argmax(-1)) == 1
    assert torch.allclose(scores.exp().sum(-1), torch.ones(1))


class _SyncCounter(TorchDispatchMode):
    """Counts the aten ops that force a device->host sync or give data-dependent shapes."""

    SYNC = ("_local_scalar_dense", "nonzero", "masked_select", "index_select", "item")

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(name in str(func) for name in self.SYNC):
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("mode", ["token", "request"])
def test_dense_forward_adds_no_host_sync_or_dynamic_shapes(base, adapters, mode):
    moe = build_moe(copy.deepcopy(base), adapters, mode=mode)
    moe.compute = "dense"
    ids = prompt_ids()
    mask = torch.ones_like(ids)
    with torch.no_grad():
        with _SyncCounter() as base_ops:
            base(input_ids=ids, attention_mask=mask)
        with _SyncCounter() as moe_ops:
            moe(input_ids=ids, attention_mask=mask)
    # A request-mode prefill is two base passes (the decision's base-only pass, then the routed one).
    assert moe_ops.count == base_ops.count * (2 if mode == "request" else 1)


def test_sparse_request_mode_plans_once_per_decision_not_per_step(base, adapters):
    moe = build_moe(copy.deepcopy(base), adapters, top_k=2, mode="request")
    moe.compute = "sparse"
    randomize_routers(moe)
    ids = prompt_ids(batch=3, length=6)
    settings = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0)

    def extra_syncs(new_tokens: int) -> int:
        with torch.no_grad():
            with _SyncCounter() as base_ops:
                base.generate(ids, min_new_tokens=new_tokens, max_new_tokens=new_tokens, **settings)
            with _SyncCounter() as moe_ops:
                moe.generate(ids, min_new_tokens=new_tokens, max_new_tokens=new_tokens, **settings)
        return moe_ops.count - base_ops.count

    # The plan's host syncs are paid once, at the decision: every further decoding step costs none.
    assert extra_syncs(2) == extra_syncs(6)
    layer = moe.layers["model.layers.0.self_attn.q_proj"]
    assert layer._gathered is not None and layer._gathered[0] is moe.state.fixed_plan[-1]


def test_router_and_layer_compile_as_one_graph(base, adapters):
    moe = build_moe(copy.deepcopy(base), adapters)
    router = moe.routers["model.layers.0"]
    layer = moe.layers["model.layers.0.self_attn.q_proj"]

    def step(hidden: torch.Tensor, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        logits = router.logits(hidden)
        token_gate = topk_gate(logits, 2)
        request_gate = topk_gate(masked_mean(logits, mask), 2)[:, None, :]
        gate = (token_gate + request_gate)[..., :3].unsqueeze(-1)
        return layer.base(x) + moe_lora_delta(x, layer.lora_A, layer.lora_B, gate)

    compiled = torch.compile(step, fullgraph=True, backend="eager")
    hidden, x = torch.randn(2, 5, 64), torch.randn(2, 5, 64)
    mask = torch.ones(2, 5)
    with torch.no_grad():
        assert torch.allclose(compiled(hidden, x, mask), step(hidden, x, mask), atol=1e-6)


def test_save_load_round_trip_gives_identical_logits(base, adapters, tmp_path):
    moe = build_moe(copy.deepcopy(base), adapters, top_k=2)
    randomize_routers(moe, seed=11)
    folder = save_moe(moe, tmp_path / "composite")
    assert sorted(p.name for p in folder.iterdir()) == ["moe_config.json", "moe_model.safetensors"]
    loaded = load_moe(copy.deepcopy(base), folder)
    assert read_config(folder).to_dict() == moe.config.to_dict()
    assert loaded.config.ranks == {"alpha": 4, "beta": 8, "gamma": 2} and loaded.config.rank == 8
    ids = prompt_ids()
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, moe(input_ids=ids).logits)


def test_remove_restores_the_base_model(base, adapters):
    model = copy.deepcopy(base)
    moe = build_moe(model, adapters)
    ids = prompt_ids()
    restored = moe.remove()
    with torch.no_grad():
        assert torch.equal(restored(input_ids=ids).logits, base(input_ids=ids).logits)
    assert not any("moe_router" in name for name, _ in restored.named_modules())


def test_build_rejects_incompatible_adapters(base, adapters, tmp_path):
    other = make_adapter(base, tmp_path / "qv", 4, 8, False, seed=9, targets=["q_proj", "v_proj"])
    with pytest.raises(ConfigError, match="different modules"):
        build_moe(copy.deepcopy(base), {**adapters, "qv": other})
    dora = make_adapter(base, tmp_path / "dora", 4, 8, False, seed=9, use_dora=True)
    with pytest.raises(InputError, match="use_dora"):
        build_moe(copy.deepcopy(base), {"dora": dora})
    with pytest.raises(InputError, match="adapter_config.json"):
        build_moe(copy.deepcopy(base), {"empty": tmp_path})
    with pytest.raises(ConfigError, match="reserved"):
        build_moe(copy.deepcopy(base), {"null": adapters["alpha"]})
    with pytest.raises(ConfigError, match="top_k"):
        build_moe(copy.deepcopy(base), adapters, top_k=5)


def test_route_config_defaults_are_the_nightly_settings_with_help_for_every_field():
    from dataclasses import fields

    from traceops.moe import RouteConfig

    route = RouteConfig()
    assert (route.top_k, route.mode, route.seed, route.null_expert) == (1, "request", 0, True)
    assert (route.steps, route.batch_size, route.learning_rate, route.probe_steps) == (0, 4, 2e-2, 200)
    assert (route.train_examples, route.heldout_fraction, route.val_examples) == (8, 0.2, 4)
    assert all(spec.metadata.get("help", "").strip() for spec in fields(RouteConfig))
    # The fit settings come from the route settings: FitConfig has no second set of defaults for them.
    fit = route.fit_config()
    assert all(getattr(fit, name) == getattr(route, name) for name in (
        "steps", "batch_size", "learning_rate", "max_length", "route_weight", "lm_weight", "balance_weight",
        "z_weight", "heldout_fraction", "seed", "probe_steps", "probe_tokens", "probe_max_length",
        "decision_weight"))
    assert RouteConfig(train_examples=None).train_examples is None
    # A request-mode composite decides on base-only block inputs: its probes read those alone.
    assert fit.probe_routings == ("base",)
    assert RouteConfig(mode="token").fit_config().probe_routings == ("own", "base")


@pytest.mark.parametrize(("settings", "message"), [
    ({"top_k": 0}, "route.top_k must be at least 1, got 0; send e.g. 1"),
    ({"mode": "sequence"}, "route.mode must be one of token, request"),
    ({"null_expert": "yes"}, "route.null_expert must be true or false"),
    ({"steps": 2.5}, "route.steps must be an integer, got 2.5; send e.g. 0"),
    ({"learning_rate": "2e-2"}, "write 2.0e-2 or 0.02"),
    ({"learning_rate": 0}, "route.learning_rate must be above 0"),
    ({"heldout_fraction": 1.0}, "route.heldout_fraction must be below 1"),
    ({"train_examples": 0}, "route.train_examples must be at least 1"),
    ({"steps": 0, "probe_steps": 0}, "nothing would fit the routers; set either above 0"),
])
def test_route_config_refuses_bad_values_saying_what_to_send(settings, message):
    from traceops.moe import RouteConfig

    with pytest.raises(ConfigError) as caught:
        RouteConfig(**settings)
    assert message in str(caught.value)


def test_route_config_from_params_merges_in_order_and_refuses_unknown_keys():
    from traceops.moe import RouteConfig

    assert RouteConfig.from_params(None) == RouteConfig.from_params({}) == RouteConfig()
    import yaml

    repo_params = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    RouteConfig.from_params(repo_params["route"])  # the nightly's own route section is valid
    # defaults < params.yaml's route section < overrides < explicit top_k/mode
    merged = RouteConfig.from_params({"top_k": 2, "mode": "token", "steps": 5},
                                     {"top_k": 3, "batch_size": 2}, mode="request")
    assert merged == RouteConfig(top_k=3, mode="request", steps=5, batch_size=2)
    assert RouteConfig.from_params({"top_k": 2}, {"top_k": 3}, top_k=1).top_k == 1
    assert RouteConfig.from_params({"seed": 4}).to_dict() == {**RouteConfig().to_dict(), "seed": 4}
    with pytest.raises(ConfigError, match="params.yaml route: unknown route parameter.s. stepz; known: "
                                          "balance_weight, batch_size"):
        RouteConfig.from_params({"stepz": 5})
    with pytest.raises(ConfigError, match="overrides: unknown route parameter.s. topk"):
        RouteConfig.from_params({}, {"topk": 2})


def _logits(moe, ids: torch.Tensor, compute: str, gate=None) -> torch.Tensor:
    moe.compute = compute
    with torch.no_grad():
        if gate is None:
            return moe(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        with moe.forced(gate):
            return moe(input_ids=ids, attention_mask=torch.ones_like(ids)).logits


@pytest.mark.parametrize("null_expert", [False, True])
@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize(("mode", "kinds"), [("token", {"tokens"}), ("request", {"rows", "shared", "base"})])
def test_sparse_paths_equal_the_dense_path(base, adapters, mode, kinds, top_k, null_expert):
    moe = build_moe(copy.deepcopy(base), adapters, top_k=top_k, mode=mode, null_expert=null_expert)
    randomize_routers(moe)
    ids = prompt_ids(batch=3, length=24)
    dense = _logits(moe, ids, "dense")
    assert all(router.plan is None for router in moe.routers.values())
    sparse = _logits(moe, ids, "sparse")
    assert {router.plan.kind for router in moe.routers.values()} <= kinds
    assert (sparse - dense).abs().max().item() < 1e-5
    with moe.trace() as trace:
        auto = _logits(moe, ids, "auto")
    assert (auto - dense).abs().max().item() < 1e-5
    if null_expert and top_k == 1 and mode == "token":  # some tokens took the null expert: the base alone
        assert trace.summary()["share/null"] > 0


@pytest.mark.parametrize(("gate", "kind"), [
    (torch.tensor([0.0, 1.0, 0.0]), "shared"),  # one expert for the whole batch: one LoRA's matmul pair
    (torch.tensor([0.6, 0.0, 0.4]), "shared"),
    ({}, "base"),  # every weight on the null expert
    (torch.tensor([[0.0, 1.0, 0.0], [0.7, 0.0, 0.3], [0.0, 0.0, 0.0]]), "rows"),  # a row on the null expert
    (torch.tensor([[0.2, 0.3, 0.5], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]), "rows"),
    (torch.rand(3, 24, 3, generator=torch.Generator().manual_seed(7)).round(), "tokens"),  # a gate per token
])
def test_sparse_forced_gates_equal_the_dense_path(base, adapters, gate, kind):
    moe = build_moe(copy.deepcopy(base), adapters, mode="request")
    ids = prompt_ids(batch=3, length=24)
    dense = _logits(moe, ids, "dense", gate)
    sparse = _logits(moe, ids, "sparse", gate)
    assert {router.plan.kind for router in moe.routers.values()} == {kind}
    assert (sparse - dense).abs().max().item() < 1e-5
    if kind == "base":
        with torch.no_grad():
            assert (sparse - base(input_ids=ids).logits).abs().max().item() < 1e-5


@pytest.mark.parametrize("mode", ["token", "request"])
def test_sparse_generation_equals_dense_generation(base, adapters, mode):
    moe = build_moe(copy.deepcopy(base), adapters, top_k=2, mode=mode)
    randomize_routers(moe)
    ids = prompt_ids(batch=3, length=6)
    settings = dict(attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False, pad_token_id=0,
                    output_logits=True, return_dict_in_generate=True)
    runs = {}
    for compute in ("dense", "sparse"):
        moe.compute = compute
        with torch.no_grad():
            runs[compute] = moe.generate(ids, **settings)
    assert torch.equal(runs["dense"].sequences, runs["sparse"].sequences)
    for dense, sparse in zip(runs["dense"].logits, runs["sparse"].logits, strict=True):
        assert (dense - sparse).abs().max().item() < 1e-5


def test_router_gradients_take_the_dense_path_and_match_it(base, adapters):
    moe = build_moe(copy.deepcopy(base), adapters, top_k=2)
    randomize_routers(moe)
    ids = prompt_ids(batch=2, length=24)
    grads = {}
    for compute in ("dense", "sparse"):
        moe.compute = compute
        for param in moe.router_parameters():
            param.requires_grad_(True)
            param.grad = None
        moe(input_ids=ids).logits.logsumexp(-1).mean().backward()
        # A gate that needs a gradient is never folded into a plan, whatever the setting.
        assert all(router.plan is None for router in moe.routers.values())
        grads[compute] = [param.grad.clone() for param in moe.router_parameters()]
    assert all(g.abs().sum() > 0 for g in grads["dense"])
    assert all(torch.allclose(d, s) for d, s in zip(grads["dense"], grads["sparse"], strict=True))
    with torch.no_grad():  # without a gradient the same setting computes only the selected experts
        moe(input_ids=ids)
    assert all(router.plan is not None for router in moe.routers.values())


def test_compute_setting_is_checked_and_restored(base, adapters):
    moe = build_moe(copy.deepcopy(base), adapters)
    assert moe.compute == "auto"
    with moe.computing("dense"):
        assert moe.compute == "dense"
    assert moe.compute == "auto"
    with pytest.raises(ConfigError, match="auto, dense, sparse"):
        moe.compute = "fast"


def test_forced_gate_plan_follows_in_place_edits_and_inference_tensors(base, adapters):
    moe = build_moe(copy.deepcopy(base), adapters, mode="request")
    ids = prompt_ids(batch=3, length=24)
    gate = torch.tensor([1.0, 0.0, 0.0])
    first = _logits(moe, ids, "sparse", gate)
    gate[:] = torch.tensor([0.0, 0.0, 1.0])  # the same tensor, edited: a new plan, not the cached one
    assert (_logits(moe, ids, "sparse", gate) - _logits(moe, ids, "dense", gate)).abs().max().item() < 1e-5
    assert (first - _logits(moe, ids, "dense", torch.tensor([1.0, 0.0, 0.0]))).abs().max().item() < 1e-5
    with torch.inference_mode():  # a gate made under inference mode has no version counter
        rows = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 0.0]])
        sparse, dense = _logits(moe, ids, "sparse", rows), _logits(moe, ids, "dense", rows)
    assert (sparse - dense).abs().max().item() < 1e-5
