"""LocalChatModel on the tiny random-init Llama: batching, determinism, stop strings, safe loading."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from traceops.errors import ModelError
from traceops.model import load_model
from traceops.model.base import GenerationConfig
from traceops.model.embedded import safetensors_hash
from traceops.model.local import LocalChatModel
from traceops.model.toolcalls import render_prompt

PROMPTS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}],
    [{"role": "user", "content": "x y z"}],
    [{"role": "user", "content": "Tell me a long story about a cat, a dog and an old lighthouse keeper."}],
]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> LocalChatModel:
    import torch

    torch.set_num_threads(2)
    return LocalChatModel(tiny_model_dir, batch_size=4)


def test_info_hashes_the_safetensors(tiny: LocalChatModel, tiny_model_dir: Path) -> None:
    assert tiny.info.weights_hash == safetensors_hash(tiny_model_dir)
    assert len(tiny.info.weights_hash) == 64 and tiny.info.extra["backend"] == "local"
    assert "LocalChatModel(" in repr(tiny)


def test_batched_greedy_equals_one_at_a_time(tiny: LocalChatModel) -> None:
    config = GenerationConfig(max_new_tokens=12)
    batched = tiny.complete(PROMPTS, None, config)
    single = [tiny.complete([prompt], None, config)[0] for prompt in PROMPTS]
    assert [c.text for c in batched] == [c.text for c in single]
    assert [c.prompt_tokens for c in batched] == [c.prompt_tokens for c in single]
    # Different prompts of different lengths were really padded together and still differ.
    assert len({c.prompt_tokens for c in batched}) > 1 and len({c.text for c in batched}) > 1


def test_batch_size_chunks_do_not_change_greedy_output(tiny_model_dir: Path, tiny: LocalChatModel) -> None:
    config = GenerationConfig(max_new_tokens=8)
    chunked = LocalChatModel.from_objects(tiny.model, tiny.tokenizer, tiny.info, batch_size=3)
    assert chunked.generate(PROMPTS, None, config) == tiny.generate(PROMPTS, None, config)


def test_sampling_is_seeded_and_leaves_global_rng_alone(tiny: LocalChatModel) -> None:
    import torch

    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    first = tiny.generate(PROMPTS[:2], None, GenerationConfig(max_new_tokens=10, temperature=1.0, seed=7))
    after = torch.rand(1)
    again = tiny.generate(PROMPTS[:2], None, GenerationConfig(max_new_tokens=10, temperature=1.0, seed=7))
    other = tiny.generate(PROMPTS[:2], None, GenerationConfig(max_new_tokens=10, temperature=1.0, seed=8))
    assert first == again and first != other
    assert torch.equal(before, after)


def test_length_and_stop_strings(tiny: LocalChatModel) -> None:
    base = tiny.complete(PROMPTS[:1], None, GenerationConfig(max_new_tokens=10))[0]
    assert base.finish_reason == "length" and base.completion_tokens == 10
    words = base.text.split()
    assert len(words) >= 3, base.text
    stop = words[2]
    cut = tiny.complete(PROMPTS[:1], None, GenerationConfig(max_new_tokens=10, stop=(stop,)))[0]
    assert cut.finish_reason == "stop" and stop not in cut.text
    assert base.text.startswith(cut.text) and cut.completion_tokens <= base.completion_tokens


def test_tools_change_the_prompt(tiny: LocalChatModel) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
                                                                                      "properties": {}}}}]
    with_tools = tiny.complete(PROMPTS[:1], tools, GenerationConfig(max_new_tokens=1))[0]
    without = tiny.complete(PROMPTS[:1], None, GenerationConfig(max_new_tokens=1))[0]
    assert with_tools.prompt_tokens > without.prompt_tokens


def _retail_tools(count: int | None = None) -> list[dict]:
    from traceops.domains import get_domain

    return get_domain("retail").make_env().tool_specs()[:count]


def _prefilled_tokens(model: LocalChatModel) -> list[int]:
    """Records how many input positions each forward pass of ``model`` computes."""
    seen: list[int] = []

    def record(_module: object, _args: object, kwargs: dict) -> None:
        seen.append(kwargs["input_ids"].numel())

    model.model.register_forward_pre_hook(record, with_kwargs=True)
    return seen


SHARED = [
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Be brief."},
     {"role": "user", "content": "Tell me a long story about a cat, a dog and an old lighthouse keeper."}],
]


def test_prefix_cache_gives_the_tokens_of_plain_generation(tiny_model_dir: Path) -> None:
    import torch

    torch.set_num_threads(2)
    cached = LocalChatModel(tiny_model_dir, batch_size=3)
    plain = LocalChatModel.from_objects(cached.model, cached.tokenizer, cached.info, batch_size=3)
    assert cached.prefix_cache and not plain.prefix_cache
    tools = _retail_tools(5)  # their JSON schemas: a prefix of ~600 tokens shared by every row
    config = GenerationConfig(max_new_tokens=12)
    expected = plain.complete(SHARED, tools, config)
    prefilled = _prefilled_tokens(cached)
    first = cached.complete(SHARED, tools, config)
    assert first == expected and min(c.prompt_tokens for c in first) > 500
    computed_first = sum(prefilled)
    # A later turn starts with the same prefix: reused, and still the same tokens as without the cache.
    turn = [conversation + [{"role": "assistant", "content": c.text}, {"role": "user", "content": "and?"}]
            for conversation, c in zip(SHARED, first, strict=True)]
    expected_turn = plain.complete(turn, tools, config)
    prefilled.clear()
    assert cached.complete(turn, tools, config) == expected_turn
    assert sum(prefilled) < computed_first - 500
    # One at a time (batch 1), and sampled under a seed: the same as without the cache.
    single = LocalChatModel.from_objects(cached.model, cached.tokenizer, cached.info, batch_size=1,
                                         prefix_cache=True)
    assert single.complete(SHARED, tools, config) == first
    sampled = GenerationConfig(max_new_tokens=8, temperature=1.0, seed=3)
    assert cached.generate(SHARED, tools, sampled) == plain.generate(SHARED, tools, sampled)


def test_a_row_with_other_tools_is_generated_apart_from_the_shared_prefix(tiny_model_dir: Path) -> None:
    from traceops.model.base import ToolsEach

    cached = LocalChatModel(tiny_model_dir, batch_size=4)
    plain = LocalChatModel.from_objects(cached.model, cached.tokenizer, cached.info, batch_size=4)
    tools = _retail_tools(5)
    conversations = [*SHARED, PROMPTS[0]]
    offered = ToolsEach((tools, tools, tools, None))  # the last row offers none: it shares ~0 tokens
    config = GenerationConfig(max_new_tokens=12)
    prompts = [render_prompt(cached.tokenizer, c, t)
               for c, t in zip(conversations, offered.lists, strict=True)]
    rows = [list(ids) for ids in cached.tokenizer(prompts, add_special_tokens=False)["input_ids"]]
    assert cached.generation_batches(rows, 12) == [range(0, 3), range(3, 4)]
    expected = plain.complete(conversations, offered, config)
    prefilled = _prefilled_tokens(cached)
    assert cached.complete(conversations, offered, config) == expected
    # The three rows' ~600 shared tokens were computed once, not again for each row behind a short prefix.
    assert len(rows[0]) > 500 and sum(prefilled) < 2 * len(rows[0])


def test_prefix_cache_follows_weight_changes(tiny_model_dir: Path) -> None:
    import torch

    cached = LocalChatModel(tiny_model_dir, batch_size=3)
    plain = LocalChatModel.from_objects(cached.model, cached.tokenizer, cached.info, batch_size=3)
    tools = _retail_tools(3)
    config = GenerationConfig(max_new_tokens=10)
    before = cached.complete(SHARED, tools, config)
    with torch.no_grad():  # an optimizer step on the attention, say: the prefix's keys/values change
        for layer in cached.model.model.layers:
            layer.self_attn.k_proj.weight.mul_(-3.0)
            layer.self_attn.v_proj.weight.mul_(2.5)
    after = plain.complete(SHARED, tools, config)
    assert after != before  # the change matters, so a stale prefix cache would show
    assert cached.complete(SHARED, tools, config) == after


@pytest.mark.slow
def test_prefix_cache_on_the_embedded_model(embedded_model_dir: Path) -> None:
    import torch

    torch.set_num_threads(2)
    cached = load_model("embedded", batch_size=2)
    assert isinstance(cached, LocalChatModel) and cached.prefix_cache
    plain = LocalChatModel.from_objects(cached.model, cached.tokenizer, cached.info, batch_size=2)
    tools = _retail_tools(3)
    prompts = [[{"role": "system", "content": "You are a store's support agent."},
                {"role": "user", "content": "What's the status of my order #W4016146?"}],
               [{"role": "system", "content": "You are a store's support agent."},
                {"role": "user", "content": "Please cancel order #W2378156, I ordered by mistake."}]]
    config = GenerationConfig(max_new_tokens=16)
    expected = plain.complete(prompts, tools, config)
    assert cached.complete(prompts, tools, config) == expected  # prefix computed
    assert cached.complete(prompts, tools, config) == expected  # prefix reused
    assert all(c.text.strip() for c in expected)


def test_load_model_folder(tiny_model_dir: Path) -> None:
    model = load_model(str(tiny_model_dir))
    assert isinstance(model, LocalChatModel) and model.info.model_id == str(tiny_model_dir)


def test_pickle_only_folder_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "pickled"
    shutil.copytree(tiny_model_dir, folder)
    for weights in folder.glob("*.safetensors"):
        weights.rename(weights.with_suffix(".bin"))
    with pytest.raises(ModelError, match="safetensors"):
        LocalChatModel(folder)


def test_unknown_specs_fail_at_once(tiny_model_dir: Path, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelError, match="embedded"):
        load_model("no-such-org/no-such-model-traceops")
    with pytest.raises(ModelError, match="not a Hugging Face Hub id"):
        load_model(str(tmp_path / "missing" / "folder"))
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ModelError, match="got a file"):
        load_model(str(tmp_path / "file.txt"))
    with pytest.raises(ModelError, match="dtype"):
        load_model(str(tiny_model_dir), dtype="float13")


def test_models_load_with_hub_kernels_off(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the `kernels` package installed, transformers would swap layers for kernels fetched from the
    Hub (offline on a GPU that fails); traceops' loaders turn them off, USE_HUB_KERNELS=YES opts back in."""
    pytest.importorskip("kernels")
    from transformers import AutoModelForCausalLM

    from traceops.model.adapted import _load_base as load_adapted_base
    from traceops.model.hub_kernels import kernel_kwargs
    from traceops.train.adapter import _load_base as load_training_base
    from traceops.train.budgets import get_budget

    monkeypatch.delenv("USE_HUB_KERNELS", raising=False)
    assert AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).use_kernels  # transformers' default
    models = [LocalChatModel(tiny_model_dir).model, load_adapted_base(tiny_model_dir),
              load_training_base(tiny_model_dir, get_budget("tiny"))]
    for model in models:
        model.train()  # training mode is where transformers re-kernelizes
        assert model.use_kernels is False
    monkeypatch.setenv("USE_HUB_KERNELS", "yes")
    assert kernel_kwargs() == {}
