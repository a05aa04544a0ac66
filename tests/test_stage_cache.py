"""Stage caching is scoped to the home: two homes with identical inputs, run in one process (Prefect
fixes its result storage at import, so they share it), each get their own stage run and outputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.cache import key_from_parameter, stage_key
from traceops import config


def test_cache_key_names_the_home(tmp_path: Path) -> None:
    key = stage_key("route", ["same inputs"])
    first = key_from_parameter(None, {"key": key, "home": str(tmp_path / "a")})
    assert first == key_from_parameter(None, {"key": key, "home": str(tmp_path / "a" / ".." / "a")})
    assert first != key_from_parameter(None, {"key": key, "home": str(tmp_path / "b")})
    assert first.startswith(key)


@pytest.mark.slow
def test_same_inputs_in_two_homes_run_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    from flows.runtime import prepare
    from flows.synthesize import synthesize_flow

    results = {}
    for name in ("a", "b"):
        home = tmp_path / name
        monkeypatch.setenv("TRACEOPS_HOME", str(home))
        paths = prepare(home).paths
        results[name] = synthesize_flow(home=str(home), capabilities=["tool_call_format"],
                                        overrides={"train_size": 4, "val_size": 2, "test_size": 2})
        run = MlflowClient(paths.mlflow_uri).get_run(results[name]["mlflow_run"])
        assert run.data.tags["traceops.stage"] == "synthesize"
        assert (paths.environments / "tool_call_format" / "manifest.json").is_file()
    assert results["a"]["mlflow_run"] != results["b"]["mlflow_run"]
    assert results["a"]["env_version"] == results["b"]["env_version"]
    assert config.load(tmp_path / "b").paths.home == (tmp_path / "b").resolve()
