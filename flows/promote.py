"""The promote flow: `traceops promote` and the nightly flow's last stage."""

from __future__ import annotations

from typing import Any

from prefect import flow

from tasks.evaluate import EVAL_JSON
from tasks.promote import promote_task
from traceops import config


@flow(name="traceops-promote")
def promote_flow(home: str | None = None, evaluation: dict[str, Any] | None = None,
                 composite: dict[str, Any] | None = None, parent_run_id: str | None = None) -> dict[str, Any]:
    """Gate tonight's composite against the champion (or the base model on the first night) and move
    the aliases: ``champion`` (old champion -> ``previous``) when every gate passes, else ``challenger``.

    ``evaluation`` is the evaluate flow's result (default: the home's data/eval/eval.json);
    ``composite`` the route flow's result, whose ``composite`` ref names the version to promote
    (default: the composite version eval.json records). Returns ``{"promoted", "alias", "champion",
    "reasons", "checks", "candidate", "changed", "mlflow_run"}``.
    """
    settings = config.load(home)
    eval_json = (evaluation or {}).get("eval_json") or str(settings.paths.eval / EVAL_JSON)
    ref = (composite or {}).get("composite") or {}
    version = str(ref["version"]) if ref.get("version") is not None else None
    return promote_task(eval_json=eval_json, version=version, home=home, parent_run_id=parent_run_id)
