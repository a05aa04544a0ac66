"""The environments-folder reader shared by training and evaluation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from traceops.envs.families import UnknownCapabilityError, get_family
from traceops.envs.folder import (
    import_environment,
    manifest_environment,
    read_manifest,
    read_task_specs,
    split_path,
)
from traceops.errors import ConfigError, InputError


def test_split_path_prefers_the_top_level_file(tmp_path: Path) -> None:
    assert split_path(tmp_path, "train") is None
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "train.jsonl").write_text("{}\n")
    assert split_path(tmp_path, "train") == tmp_path / "tasks" / "train.jsonl"
    (tmp_path / "train.jsonl").write_text("{}\n")
    assert split_path(tmp_path, "train") == tmp_path / "train.jsonl"


def test_task_specs_keep_line_numbers_and_name_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "test.jsonl"
    path.write_text('{"a": 1}\n\n{"b": 2}\n', encoding="utf-8")
    assert list(read_task_specs(path)) == [(1, {"a": 1}), (3, {"b": 2})]
    path.write_text('{"a": 1}\n[1, 2]\n', encoding="utf-8")
    with pytest.raises(InputError, match="JSON object") as caught:
        list(read_task_specs(path))
    assert caught.value.record == 2 and caught.value.file == str(path)
    path.write_text('{"a": 1}\n{"a": \n', encoding="utf-8")
    specs = read_task_specs(path)
    assert next(specs) == (1, {"a": 1})  # lazy: a later bad line does not stop earlier specs
    with pytest.raises(InputError, match="not valid JSON"):
        next(specs)


def test_manifest_reading_and_environment_resolution(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="missing; run it"):
        read_manifest(tmp_path, "run it")
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(InputError, match="regenerate"):
        read_manifest(tmp_path, "run it")
    (tmp_path / "manifest.json").write_text(json.dumps({"capability": "tool_selection"}))
    manifest = read_manifest(tmp_path, "run it")
    family_class = get_family("tool_selection").env_class
    assert manifest_environment(manifest, "m") is family_class
    assert manifest_environment({}, "m", capability="tool_selection") is family_class
    with pytest.raises(InputError, match="names neither"):
        manifest_environment({}, "m")
    with pytest.raises(UnknownCapabilityError):
        manifest_environment({"capability": "telepathy"}, "m")
    path = f"{family_class.__module__}:{family_class.__name__}"
    assert manifest_environment({"environment": path, "capability": "x"}, "m") is family_class


def test_import_environment_refuses_what_is_not_an_environment() -> None:
    with pytest.raises(ConfigError, match="must look like"):
        import_environment("NoModule", "m")
    with pytest.raises(ConfigError, match="cannot import"):
        import_environment("traceops.no_such_module:Env", "m")
    with pytest.raises(ConfigError, match="not an Environment subclass"):
        import_environment("traceops.envs.folder:MANIFEST_NAME", "m")
