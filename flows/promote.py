"""The promote flow: `traceops promote` and the nightly flow's last stage."""

from __future__ import annotations

from prefect import flow

from traceops import config
from traceops.results import EvalResult, PromoteResult, RouteResult, VersionRef
from traceops.tasks.evaluate import EVAL_JSON
from traceops.tasks.promote import promote_task


@flow(name="traceops-promote")
def promote_flow(home: str | None = None, evaluation: EvalResult | str | None = None,
                 composite: RouteResult | VersionRef | None = None,
                 parent_run_id: str | None = None) -> PromoteResult:
    """Gate tonight's composite against the champion (or the base model on the first night) and move
    the aliases: ``champion`` (old champion -> ``previous``) when every gate passes, else ``challenger``.

    ``evaluation`` is the evaluate flow's result or an eval.json path (default: the home's
    data/eval/eval.json); ``composite`` the route flow's result or the registered composite version to
    promote (default: the composite version eval.json records).
    """
    settings = config.load(home)
    if evaluation is None:
        eval_json = str(settings.paths.eval / EVAL_JSON)
    else:
        eval_json = evaluation.eval_json if isinstance(evaluation, EvalResult) else evaluation
    ref = composite.composite if isinstance(composite, RouteResult) else composite
    version = ref.version if ref is not None else None
    return promote_task(eval_json=eval_json, version=version, home=home, parent_run_id=parent_run_id)
