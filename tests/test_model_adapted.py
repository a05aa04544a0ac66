"""ChatModels over trained weights prompt exactly as training did: token ids of every turn equal the
training text's prefix, and the composite and adapter generate through HF generate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from random_adapters import random_adapter

from traceops.agent import run_episodes
from traceops.envs.synthesize import synthesize
from traceops.errors import ModelError
from traceops.evaluate import OracleModel, env_factory, evaluate_envs, load_tasks
from traceops.model.adapted import (
    load_adapter_model,
    load_base_model,
    load_composite_model,
    training_conversation,
)
from traceops.model.base import GenerationConfig
from traceops.model.chat_template import DEFAULT_SYSTEM_PROMPT, load_tokenizer
from traceops.model.toolcalls import render_prompt
from traceops.train.data import demonstration, grpo_rows, load_environment_set
from traceops.train.sft import assistant_mask

CAPABILITIES = ["tool_call_format", "argument_grounding", "policy_adherence", "error_recovery"]


@pytest.fixture(scope="module")
def env_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("adapted") / "environments"
    result = synthesize(CAPABILITIES, [], root, {"train_size": 2, "val_size": 1, "test_size": 2}, seed=0)
    assert result.passed
    return root


@pytest.fixture(scope="module")
def adapter_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_adapter(tiny_model_dir, tmp_path_factory.mktemp("lora") / "adapter", seed=1)


class Recorder:
    """A model that plays the oracle and records every conversation the agent loop sends it."""

    def __init__(self, oracle: OracleModel) -> None:
        self.oracle = oracle
        self.info = oracle.info
        self.seen: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = []

    def generate(self, conversations: list[list[dict[str, Any]]], tools: list[dict[str, Any]] | None = None,
                 config: GenerationConfig | None = None) -> list[str]:
        self.seen += [(conversation, tools) for conversation in conversations]
        return self.oracle.generate(conversations, tools, config)


@pytest.mark.parametrize("capability", CAPABILITIES)
def test_evaluation_prompts_are_the_training_token_prefixes(
    capability: str, env_root: Path, adapter_dir: Path, tiny_model_dir: Path
) -> None:
    """At every assistant turn of an oracle episode run through the agent loop, the adapter model's
    prompt ids equal the SFT sequence's ids up to that turn's target; the loop scores the episode 1.0
    like the demonstration, and the first prompt equals the GRPO prompt row."""
    model = load_adapter_model(tiny_model_dir, adapter_dir, batch_size=2)
    factory, tasks = env_factory(env_root, capability), load_tasks(env_root, capability, "train", limit=1)
    recorder = Recorder(OracleModel([(factory, tasks)]))
    (trajectory,) = run_episodes(recorder, factory, tasks, max_turns=8, domain=f"env:{capability}")
    assert trajectory.outcome.reward == 1.0

    training_tokenizer = load_tokenizer(str(tiny_model_dir))
    env = factory()
    messages = demonstration(env, tasks[0])  # raises unless the demonstration scores 1.0
    ids, mask = assistant_mask(training_tokenizer, messages, env.tool_specs())
    starts = [i for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1])]
    assert len(starts) == len(recorder.seen) == sum(m["role"] == "assistant" for m in messages)
    naive_differs = False
    for (conversation, tools), start in zip(recorder.seen, starts, strict=True):
        prompt = model.prompt_ids(conversation, tools)
        # The generation prompt ends with "<|im_start|>assistant\n"; the target starts right after it.
        assert prompt == ids[:start + 1], f"turn at token {start} differs from training"
        naive = training_tokenizer(render_prompt(model.tokenizer, conversation, tools),
                                   add_special_tokens=False)["input_ids"]
        naive_differs |= naive != prompt
    # Rendering the agent's structured history directly would not match what training showed.
    assert naive_differs

    if len(starts) == 1 or capability == "tool_call_format":
        env_set = load_environment_set(env_root / capability)
        row = grpo_rows(env_set, training_tokenizer, multi_turn=False)[0]
        assert model.prompt(recorder.seen[0][0], recorder.seen[0][1]) == row["prompt"]


def test_oracle_scores_one_through_the_evaluation_loop(env_root: Path) -> None:
    oracle = OracleModel.for_envs(env_root, CAPABILITIES, split="test")
    result = evaluate_envs(oracle, env_root, CAPABILITIES, max_turns=8)
    assert result.success == {c: 1.0 for c in CAPABILITIES}


def test_training_conversation_matches_the_training_form() -> None:
    history = [
        {"role": "user", "content": "Find Ann"},
        {"role": "assistant", "content": "Looking.",
         "tool_calls": [{"id": "c1", "name": "find", "arguments": {"name": "Ann"}}]},
        {"role": "tool", "name": "find", "tool_call_id": "c1", "content": "id 7"},
        {"role": "assistant", "content": " Ann is 7. "},
    ]
    assert training_conversation(history) == [
        {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
        {"role": "user", "content": "Find Ann"},
        {"role": "assistant", "content": 'Looking.\n<tool_call>{"name": "find", "arguments": {"name": "Ann"}}'
                                         "</tool_call>"},
        {"role": "tool", "content": "id 7"},
        {"role": "assistant", "content": "Ann is 7."},
    ]


def test_adapter_model_merged_equals_unmerged_and_differs_from_base(
    tiny_model_dir: Path, adapter_dir: Path
) -> None:
    conversations = [[{"role": "user", "content": "Hello there"}],
                     [{"role": "user", "content": "List orders"}]]
    config = GenerationConfig(max_new_tokens=6)
    merged = load_adapter_model(tiny_model_dir, adapter_dir, batch_size=2)
    unmerged = load_adapter_model(tiny_model_dir, adapter_dir, batch_size=2, merge=False)
    base = load_base_model(tiny_model_dir, batch_size=2)
    ids = [merged.tokenizer(merged.prompt(c), add_special_tokens=False, return_tensors="pt")["input_ids"]
           for c in conversations]
    with torch.inference_mode():
        for prompt in ids:
            a, b = merged.model(prompt).logits, unmerged.model(prompt).logits
            # Merging reorders float32 sums: logits of magnitude ~8 differ by ~1e-4 on some CPUs.
            assert torch.allclose(a, b, atol=1e-3)
            assert not torch.allclose(a, base.model(prompt).logits, atol=0.1)
    texts = merged.generate(conversations, config=config)
    assert len(texts) == 2 and all(isinstance(t, str) for t in texts)
    assert merged.info.extra["kind"] == "adapter" and merged.info.weights_hash != base.info.weights_hash
    assert "+lora:" in merged.info.model_id
    # The base is prompted with the training template too: tools render as Qwen2.5's <tools> block.
    tools = [{"type": "function", "function": {"name": "ping", "description": "Ping",
                                               "parameters": {"type": "object", "properties": {}}}}]
    assert "<tools>" in base.prompt(conversations[0], tools) and DEFAULT_SYSTEM_PROMPT in base.prompt(
        conversations[0], tools)


def test_composite_model_generates_like_the_moe_it_loads(
    tiny_model_dir: Path, adapter_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    from traceops.moe import build_moe, save_moe

    second = random_adapter(tiny_model_dir, tmp_path / "second", seed=2)
    moe = build_moe(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)),
                    {"first": adapter_dir, "second": second}, top_k=1)
    folder = save_moe(moe, tmp_path / "composite")
    chat = load_composite_model(tiny_model_dir, folder, batch_size=2)
    assert chat.composite is not None and chat.info.extra["experts"] == ["first", "second"]
    conversation = [{"role": "user", "content": "Cancel order 5"}]
    config = GenerationConfig(max_new_tokens=5)
    (completion,) = chat.complete([conversation], config=config)
    prompt = chat.tokenizer(chat.prompt(conversation), add_special_tokens=False, return_tensors="pt")
    with torch.inference_mode():
        direct = moe.generate(**prompt, max_new_tokens=5, do_sample=False,
                              pad_token_id=chat.tokenizer.pad_token_id)
    expected = direct[0, prompt["input_ids"].shape[1]:].tolist()
    eos = chat.tokenizer.eos_token_id
    expected = expected[:expected.index(eos)] if eos in expected else expected
    assert completion.completion_tokens == len(expected)
    assert completion.text == chat.tokenizer.decode(expected, skip_special_tokens=True)


def test_composite_prefix_cache_is_exact_in_token_and_request_mode(
    tiny_model_dir: Path, adapter_dir: Path, tmp_path: Path
) -> None:
    """Token routing reads each token's own block input, so the shared-prefix KV cache gives the tokens
    of uncached generation, turn after turn. A request-mode composite decides every row's route first and
    generates each route's rows under that fixed gate from that route's cached prefix (top-1), or each
    batch under its rows' own mixes (top-2): the same tokens as uncached generation, whose prefill
    decides."""
    from transformers import AutoModelForCausalLM

    from traceops.model.adapted import TrainedChatModel
    from traceops.moe import build_moe, save_moe

    second = random_adapter(tiny_model_dir, tmp_path / "second", seed=2)
    experts = {"first": adapter_dir, "second": second}
    system = "You are a retail support agent. Look orders up before you answer, and follow the policy. "
    texts = ("Cancel order 5", "Where is my parcel?", "hi", "Refund the blue shoes, order 77 please",
             "zzzz", "What is your returns policy for opened electronics?")
    conversations = [[{"role": "system", "content": system}, {"role": "user", "content": text}]
                     for text in texts]
    config = GenerationConfig(max_new_tokens=8)
    for mode, top_k in (("token", 1), ("request", 1), ("request", 2)):
        base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
        moe = build_moe(base, experts, top_k=top_k, mode=mode)
        for router in moe.routers.values():  # a sharper router than the random init: rows route apart
            router.proj.weight.data.mul_(50.0)
        folder = save_moe(moe, tmp_path / f"composite-{mode}-{top_k}")
        chat = load_composite_model(tiny_model_dir, folder, batch_size=3)
        assert chat.prefix_cache
        plain = TrainedChatModel.from_objects(chat.model, chat.tokenizer, chat.info, batch_size=3)
        first = chat.complete(conversations, config=config)
        assert first == plain.complete(conversations, config=config)
        turn = [c + [{"role": "assistant", "content": done.text}, {"role": "user", "content": "and?"}]
                for c, done in zip(conversations, first, strict=True)]
        assert chat.complete(turn, config=config) == plain.complete(turn, config=config)
        assert (chat._prefix is not None) == (top_k == 1)  # the generation cache was really used
        # One conversation alone: its whole prompt but the last token is the shared prefix, which
        # extends the prefix the request decision stored for the batch.
        assert chat.complete(turn[:1], config=config) == plain.complete(turn[:1], config=config)
        if mode == "request" and top_k == 1:
            prompts = [chat.prompt(c) for c in turn]
            encoded = chat.tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left",
                                     add_special_tokens=False)
            with torch.inference_mode():
                routes = {tuple(row) for row in chat.composite.request_gates(
                    encoded["input_ids"], encoded["attention_mask"]).tolist()}
            assert len(routes) > 1  # more than one group: the grouping was exercised
            assert len(chat._prefixes) > 1  # one cached prefix per route


def test_bad_folders_are_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="not a PEFT adapter folder"):
        load_adapter_model(tiny_model_dir, tmp_path)
    with pytest.raises(ModelError, match="no config.json"):
        load_base_model(tmp_path)
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
    (tmp_path / "adapter_model.safetensors").write_bytes(b"")
    with pytest.raises(ModelError, match="does not load onto base"):
        load_adapter_model(tiny_model_dir, tmp_path)
