"""`traceops rollback`: champion moves back to `previous` (or --to), who/why/when are tagged on both versions
and logged as an MLflow run, the lineage shows it, and a rollback with nothing to go back to says so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlflow
import pytest
from random_adapters import random_adapter
from test_registry import make_composite
from typer.testing import CliRunner

from traceops import config, registry
from traceops.cli import app
from traceops.errors import ConfigError
from traceops.lineage import current_lineage, lineage, render_tree
from traceops.mlflow_models.registration import register_composite
from traceops.rollback import ROLLED_BACK, RollbackError
from traceops.tags import (
    TAG_ROLLBACK_AT,
    TAG_ROLLBACK_BY,
    TAG_ROLLBACK_FROM,
    TAG_ROLLBACK_REASON,
    TAG_ROLLBACK_RUN,
    TAG_ROLLED_BACK_TO,
)
from traceops.tasks.rollback import rollback_run
from traceops.tasks.tracking import stage_run

NAME = registry.COMPOSITE_MODEL


@pytest.fixture(scope="module")
def registered(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A home whose traceops.composite has versions 1-3, promoted in turn: champion 3, previous 2."""
    root = tmp_path_factory.mktemp("rollback")
    home = root / "home"
    home.mkdir()
    settings = config.load(home)
    adapters = {cap: random_adapter(tiny_model_dir, root / cap, seed)
                for seed, cap in enumerate(["tool_selection", "state_tracking"], start=1)}
    composite = make_composite(tiny_model_dir, adapters, root / "composite")
    tags = current_lineage(settings.paths, str(tiny_model_dir), diagnosis_run="")
    registry.configure(settings.paths)
    for _ in range(3):
        with stage_run(settings, "route"):
            ref = register_composite(composite, tags, {"traceops.router": "1"})
        registry.promote_aliases(NAME, ref.version, promoted=True)
    return {"home": home, "settings": settings}


def aliases() -> dict[str, str]:
    model = mlflow.MlflowClient().get_registered_model(NAME)
    return {k: str(v) for k, v in (model.aliases or {}).items()}


def rollback_runs(settings: config.Settings) -> list[Any]:
    found = mlflow.MlflowClient().get_experiment_by_name(registry.experiment_name("rollback"))
    return [] if found is None else mlflow.MlflowClient().search_runs([found.experiment_id])


def test_rollback_moves_champion_back_and_records_who_why_when(
        registered: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    settings = registered["settings"]
    monkeypatch.setenv("TRACEOPS_USER", "oncall-ana")
    registry.configure(settings.paths)
    assert aliases() == {"champion": "3", "previous": "2"}

    result = rollback_run(settings, NAME, "refund tool calls broke after v3")
    assert (result.rolled_back.version, result.champion.version, result.by) == ("3", "2", "oncall-ana")
    # previous named the restored version: removed, so a second plain rollback cannot re-promote v3.
    assert aliases() == result.aliases == {"champion": "2", ROLLED_BACK: "3"}
    lost = registry.version_tags(registry.get_version(NAME, "3"))
    regained = registry.version_tags(registry.get_version(NAME, "2"))
    for tags in (lost, regained):
        assert tags[TAG_ROLLBACK_BY] == "oncall-ana"
        assert tags[TAG_ROLLBACK_REASON] == "refund tool calls broke after v3"
        assert tags[TAG_ROLLBACK_AT] == result.at and tags[TAG_ROLLBACK_RUN] == result.mlflow_run
    assert lost[TAG_ROLLED_BACK_TO] == "2" and TAG_ROLLBACK_FROM not in lost
    assert regained[TAG_ROLLBACK_FROM] == "3" and TAG_ROLLED_BACK_TO not in regained
    (run,) = rollback_runs(settings)
    assert run.info.run_id == result.mlflow_run and run.info.status == "FINISHED"
    assert run.data.params["from_version"] == "3" and run.data.params["to_version"] == "2"
    assert run.data.tags[TAG_ROLLBACK_BY] == "oncall-ana"
    logged = json.loads(mlflow.artifacts.load_text(f"runs:/{run.info.run_id}/rollback.json"))
    assert logged == result.model_dump(mode="json")

    # The champion's lineage shows the rollback and reaches the run that recorded it.
    tree = lineage(settings.paths, f"{NAME}@champion")
    (node,) = [n for n in tree["tree"]["children"] if n["kind"] == "rollback"]
    assert node["ok"] and node["by"] == "oncall-ana" and "from version 3" in node["detail"]
    assert node["children"][0]["run_id"] == result.mlflow_run
    assert "rollback rollback: champion again by rollback from version 3 by oncall-ana" in render_tree(tree)
    gone = lineage(settings.paths, f"{NAME}@{ROLLED_BACK}")
    assert any("rolled back: champion moved to version 2" in n["detail"] for n in gone["tree"]["children"])

    # Nothing left to roll back to without --to; refused rollbacks leave no run behind.
    with pytest.raises(RollbackError, match="nothing to roll back to.*pass --to VERSION"):
        rollback_run(settings, NAME, "again")
    with pytest.raises(RollbackError, match="already is the champion"):
        rollback_run(settings, NAME, "same", to="2")
    with pytest.raises(ConfigError, match="versions 1, 2, 3"):
        rollback_run(settings, NAME, "missing", to="9")
    with pytest.raises(RollbackError, match="needs a reason"):
        rollback_run(settings, NAME, "  ", to="1")
    with pytest.raises(RollbackError, match="no champion to roll back"):
        rollback_run(settings, "traceops.adapter.tool_selection", "none registered")
    assert len(rollback_runs(settings)) == 1

    # --to rolls forward too; each version's tags describe the latest rollback that moved it.
    forward = rollback_run(settings, NAME, "fixed upstream", to="3")
    assert aliases() == {"champion": "3", ROLLED_BACK: "2"}
    restored = registry.version_tags(registry.get_version(NAME, "3"))
    assert restored[TAG_ROLLBACK_FROM] == "2" and TAG_ROLLED_BACK_TO not in restored
    assert restored[TAG_ROLLBACK_RUN] == forward.mlflow_run


def test_rollback_command_prints_json_last(registered: dict[str, Any],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    home = str(registered["home"])
    monkeypatch.setenv("TRACEOPS_USER", "cli-user")
    registry.configure(registered["settings"].paths)
    before = registry.get_alias(NAME, "champion")
    target = "1" if before.version != "1" else "2"
    out = CliRunner().invoke(app, ["rollback", "--to", target, "--reason", "canary regressed", "--home", home,
                                   "--json"])
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["champion"] == {"name": NAME, "version": target}
    assert result["rolled_back"]["version"] == before.version and result["by"] == "cli-user"
    assert result["aliases"]["champion"] == target
    refused = CliRunner().invoke(app, ["rollback", "traceops.router", "--reason", "x", "--home", home,
                                       "--json"])
    assert refused.exit_code == 2
    error = json.loads(refused.stdout.strip().splitlines()[-1])
    assert error["type"] == "RollbackError" and "no champion" in error["error"]
    missing = CliRunner().invoke(app, ["rollback", "--home", home])
    assert missing.exit_code != 0 and "--reason" in missing.output
