"""Shared fixtures: every test runs against a temporary state home, never the project's own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Prefect fixes its settings when first imported, which in a test session happens before any flow's
# ``prepare`` can set them. The in-process flows start Prefect's ephemeral API server, which migrates a
# fresh SQLite database first; on a loaded 2-core CI machine that took over Prefect's default 20 s and
# failed a test, so the session gets the same generous start-up wait as ``prepare`` gives real runs.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "300")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh, empty traceops home; TRACEOPS_HOME points at it for the test's duration."""
    root = tmp_path / "home"
    root.mkdir()
    monkeypatch.setenv("TRACEOPS_HOME", str(root))
    monkeypatch.setenv("PREFECT_HOME", str(root / ".prefect"))
    return root


@pytest.fixture(scope="session")
def embedded_model_dir() -> Path:
    """The converted embedded SmolLM2-135M-Instruct folder (converted into the traceops cache once)."""
    from traceops.model.embedded import embedded_model_dir as converted_dir

    return converted_dir()


@pytest.fixture(scope="session")
def tiny_model_dir(embedded_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-init 2-layer Llama (hidden 64) with SmolLM2's tokenizer and chat template, saved as a
    safetensors folder: real forward passes in milliseconds. Seeded, so its outputs are repeatable."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(embedded_model_dir))
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, initializer_range=0.2,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    folder = tmp_path_factory.mktemp("tiny-model")
    model.save_pretrained(str(folder), safe_serialization=True)
    tokenizer.save_pretrained(str(folder))
    return folder
