"""Stage caching is scoped to the home: two homes with identical inputs, run in one process (Prefect
fixes its result storage at import, so they share it), each get their own stage run and outputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from traceops import config
from traceops.hashing import folder_hash
from traceops.tasks.cache import code_version, key_from_parameter, stage_key


def test_cache_key_names_the_home(tmp_path: Path) -> None:
    key = stage_key("route", ["same inputs"])
    first = key_from_parameter(None, {"key": key, "home": str(tmp_path / "a")})
    assert first == key_from_parameter(None, {"key": key, "home": str(tmp_path / "a" / ".." / "a")})
    assert first != key_from_parameter(None, {"key": key, "home": str(tmp_path / "b")})
    assert first.startswith(key)


@pytest.mark.slow
def test_same_inputs_in_two_homes_run_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    from traceops.flows.runtime import prepare
    from traceops.flows.synthesize import synthesize_flow

    results = {}
    for name in ("a", "b"):
        home = tmp_path / name
        monkeypatch.setenv("TRACEOPS_HOME", str(home))
        paths = prepare(home).paths
        results[name] = synthesize_flow(home=str(home), capabilities=["tool_call_format"],
                                        overrides={"train_size": 4, "val_size": 2, "test_size": 2})
        run = MlflowClient(paths.mlflow_uri).get_run(results[name].mlflow_run)
        assert run.data.tags["traceops.stage"] == "synthesize"
        assert (paths.environments / "tool_call_format" / "manifest.json").is_file()
    assert results["a"].mlflow_run != results["b"].mlflow_run
    assert results["a"].env_version == results["b"].env_version
    assert config.load(tmp_path / "b").paths.home == (tmp_path / "b").resolve()


def test_keys_follow_the_code_version(tmp_path: Path) -> None:
    # The version is the package's Python sources only: compiled caches and data files do not count.
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "a.py").write_text("x = 1\n")
    (package / "sub" / "b.py").write_text("y = 2\n")
    before = folder_hash(package, "*.py")
    (package / "sub" / "b.cpython-311.pyc").write_bytes(b"\0compiled")
    (package / "notes.txt").write_text("not code")
    assert folder_hash(package, "*.py") == before
    (package / "sub" / "b.py").write_text("y = 3\n")
    assert folder_hash(package, "*.py") != before
    import traceops

    assert code_version() == folder_hash(Path(traceops.__file__).parent, "*.py")
    assert stage_key("route", [1]) == stage_key("route", [1]) != stage_key("route", [2])
