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
