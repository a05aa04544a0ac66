"""Content hashes over canonical JSON: the identity of trajectories, files and folders."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

import orjson


def _normalize(value: Any) -> Any:
    """Make equal data serialize equally: integral floats become ints, NaN becomes None."""
    kind = type(value)
    if kind is str or kind is bool or value is None:  # the common case, first and cheap
        return value
    if kind is int:  # JSON readers turn integers past 64 bits into floats: hash them the same way
        return value if -(2**63) <= value < 2**64 else float(value)
    if kind is dict:
        return {k if type(k) is str else str(k): _normalize(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [_normalize(v) for v in value]
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return None
        if value.is_integer() and abs(value) < 2**63:  # larger ints would not fit JSON's int64
            return int(value)
        return round(value, 12)
    if isinstance(value, dict):
        return {str(k): _normalize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalize(v) for v in value]
    return value


def canonical_json(value: Any) -> str:
    """Sorted-key, compact, normalized JSON: the same data always gives the same string."""
    return canonical_bytes(value).decode("utf-8")


def canonical_bytes(value: Any) -> bytes:
    """UTF-8 bytes of ``canonical_json`` (orjson: about 8x faster than the json module here)."""
    return orjson.dumps(_normalize(value), option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS,
                        default=str)


def content_hash(value: Any, length: int = 16) -> str:
    """Hex sha256 prefix of the canonical JSON of ``value``."""
    return hashlib.sha256(canonical_bytes(value)).hexdigest()[:length]


def file_hash(path: str | Path, chunk: int = 1 << 20) -> str:
    """Full hex sha256 of a file's bytes, streamed."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def folder_hash(path: str | Path, pattern: str = "*") -> str:
    """Hex sha256 over the relative paths and byte hashes of every file under ``path`` matching
    ``pattern`` (a ``Path.rglob`` pattern)."""
    root = Path(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in root.rglob(pattern) if p.is_file()):
        digest.update(file.relative_to(root).as_posix().encode())
        digest.update(file_hash(file).encode())
    return digest.hexdigest()
