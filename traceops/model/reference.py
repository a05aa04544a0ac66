"""Base-model references: a base model is referenced by ``<model id>@<weights sha256>``, never logged.

A spec is ``embedded`` (the bundled model, converted into each machine's cache) or a local transformers
folder; ``resolve_base_model`` turns it into the folder and the reference, so any machine can check
that it holds the same weights a version was trained on.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from traceops.errors import ConfigError, ModelError
from traceops.hashing import file_hash, folder_hash
from traceops.model.embedded import EMBEDDED_MODEL_ID, embedded_model_dir, embedded_weights_hash


def resolve_base_model(spec: str) -> tuple[Path, str]:
    """The folder and ``<model id>@<weights sha256>`` of a base model: ``embedded`` or a local HF folder."""
    if spec in ("embedded", EMBEDDED_MODEL_ID):
        folder = embedded_model_dir()
        return folder, f"{EMBEDDED_MODEL_ID}@{embedded_weights_hash(folder)}"
    folder = Path(spec).expanduser().resolve()
    if not (folder / "config.json").is_file():
        raise ModelError(f"unknown base model '{spec}': not 'embedded' and not a transformers model folder "
                         "with a config.json; pass --base-model embedded or a local model folder")
    weights = sorted(folder.glob("*.safetensors"))
    digest = folder_hash(folder) if not weights else _files_digest(weights)
    return folder, f"{folder.name}@{digest}"


def _files_digest(files: list[Path]) -> str:
    """sha256 over the weight files' own hashes, in name order."""
    joined = "".join(f"{f.name}:{file_hash(f)}\n" for f in files)
    return hashlib.sha256(joined.encode()).hexdigest()


def base_spec(ref: str, recorded: str | None, base_model: str | None) -> str:
    """The spec a logged model resolves its base with at load time, checked against ``ref`` (the
    lineage's ``<model id>@<weights sha256>``).

    ``embedded`` stays portable (the converted folder lives in each machine's cache); any other base is
    the folder the artifacts were trained on (``recorded``: PEFT and save_moe write it) or the explicit
    ``base_model``.
    """
    if base_model is None and ref.startswith(f"{EMBEDDED_MODEL_ID}@"):
        return "embedded"
    spec = base_model or recorded
    if not spec:
        raise ConfigError(f"cannot tell which base model '{ref}' is: the artifacts record no base model "
                          "path; pass base_model= to the register call")
    _folder, resolved = resolve_base_model(spec)
    if resolved != ref:
        raise ConfigError(f"base model '{spec}' resolves to {resolved}, but the lineage says {ref}; "
                          "register with the base model the artifacts were trained on")
    return spec
