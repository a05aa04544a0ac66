"""Reading one capability's synthesized environments folder (``data/environments/<capability>/``).

The folder holds ``manifest.json``, naming either an ``"environment": "package.module:ClassName"``
import path (any ``Environment`` subclass) or the ``capability`` whose built-in family gives the
class, and one JSONL file of task specs per split, ``<split>.jsonl`` or ``tasks/<split>.jsonl``; each
line is the keyword arguments of ``reset``. Training (``traceops.train.data``) and evaluation
(``traceops.evaluation.envs``) both read folders through these functions.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from traceops.envs.base import Environment
from traceops.errors import ConfigError, InputError

MANIFEST_NAME = "manifest.json"


def import_environment(path: str, where: str) -> type[Environment]:
    """The class named by ``module:Class`` (or ``module.Class``), checked to be an Environment subclass."""
    module_name, _, class_name = path.partition(":") if ":" in path else path.rpartition(".")
    if not module_name or not class_name:
        raise ConfigError(f"{where}: 'environment' must look like 'package.module:ClassName', got {path!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{where}: cannot import environment module '{module_name}' ({exc}); install "
                          "traceops or regenerate the environments with `traceops synthesize`") from exc
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise ConfigError(f"{where}: '{path}' is not an Environment subclass")
    return cls


def read_manifest(folder: Path, missing_hint: str) -> Any:
    """The parsed ``manifest.json`` of ``folder`` (any JSON value; callers check its shape).

    A missing file is a ConfigError ending in ``missing_hint``; invalid JSON is an InputError.
    """
    path = Path(folder) / MANIFEST_NAME
    if not path.is_file():
        raise ConfigError(f"{path} is missing; {missing_hint}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON ({exc}); regenerate it", file=str(path)) from exc


def manifest_environment(manifest: dict[str, Any], where: str,
                         capability: str | None = None) -> type[Environment]:
    """The environment class a manifest names: its import path, else the family of its capability
    (``capability`` when the manifest names none). Unknown capabilities raise the family registry's error.
    """
    env_path = manifest.get("environment")
    if isinstance(env_path, str):
        return import_environment(env_path, where)
    name = manifest.get("capability")
    name = name if isinstance(name, str) else capability
    if name is None:
        raise InputError("names neither the capability (a built-in family) nor an environment class",
                         file=where, field="capability")
    from traceops.envs.families import get_family

    return get_family(name).env_class


def environment_capabilities(root: str | Path) -> list[str]:
    """The capabilities synthesized under an environments root (its folders with a ``manifest.json``),
    sorted; empty when ``root`` does not exist (each caller says what that means for it)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / MANIFEST_NAME).is_file())


def split_path(folder: Path, split: str) -> Path | None:
    """The JSONL file of ``split`` (``<split>.jsonl``, else ``tasks/<split>.jsonl``), or None."""
    for path in (Path(folder) / f"{split}.jsonl", Path(folder) / "tasks" / f"{split}.jsonl"):
        if path.is_file():
            return path
    return None


def read_task_specs(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """The task specs of a split file with their line numbers, lazily; blank lines are skipped.

    Errors name the file and line: invalid JSON, or a line that is not a JSON object.
    """
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            task = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"not valid JSON ({exc})", file=str(path), record=number) from exc
        if not isinstance(task, dict):
            raise InputError("a task spec must be a JSON object of reset() arguments",
                             file=str(path), record=number)
        yield number, task
