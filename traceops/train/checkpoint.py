"""Checkpoints and resumption of one adapter's training folder.

Layout of ``out_dir``::

    checkpoints/sft/checkpoint-<step>/    HF Trainer checkpoints (adapter, optimizer, trainer_state.json)
    checkpoints/grpo/checkpoint-<step>/
    sft_adapter/                          the finished SFT adapter (GRPO starts from it)
    adapter/                              the final adapter (PEFT format), the stage's output
    eval_before.json                      base-model evaluation, reused when a run resumes

A phase is finished when its adapter folder holds ``adapter_config.json`` and
``adapter_model.safetensors``: they are written into a temporary sibling and renamed into place.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from transformers.trainer_utils import get_last_checkpoint

from traceops.atomic import atomic_folder, atomic_write_text

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def phase_dir(out_dir: Path, phase: str) -> Path:
    """Where the HF Trainer of ``phase`` (``sft`` or ``grpo``) writes its checkpoints."""
    return Path(out_dir) / "checkpoints" / phase


def is_complete(checkpoint: Path) -> bool:
    """True when the HF Trainer finished writing ``checkpoint``: it writes trainer_state.json last."""
    return read_json(Path(checkpoint) / "trainer_state.json") is not None


def last_checkpoint(folder: Path) -> Path | None:
    """The newest complete ``checkpoint-<step>`` folder under ``folder``, or None.

    A process killed while saving leaves a partial newest folder; it is skipped (and removed, so the
    resumed trainer can write that step again) in favour of the previous complete one.
    """
    folder = Path(folder)
    while folder.is_dir():
        found = get_last_checkpoint(str(folder))
        if not found:
            return None
        if is_complete(Path(found)):
            return Path(found)
        shutil.rmtree(found, ignore_errors=True)
    return None


def checkpoint_step(checkpoint: Path | None) -> int | None:
    """The global step recorded in a checkpoint's ``trainer_state.json``."""
    if checkpoint is None:
        return None
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return int(state["global_step"])


def is_adapter(folder: Path) -> bool:
    """True when ``folder`` holds a complete PEFT adapter."""
    return all((Path(folder) / name).is_file() for name in ADAPTER_FILES)


def save_adapter(model: Any, tokenizer: Any, folder: Path) -> Path:
    """Save a PeftModel's adapter (and the tokenizer with its chat template) atomically into ``folder``."""
    folder = Path(folder)
    with atomic_folder(folder) as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
    return folder


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file, or None when it is absent or unreadable."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write a JSON object atomically."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
