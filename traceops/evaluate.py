"""Evaluation: success, pass^k, repeat-failure rate and regression against the champion (pure).

- ``evaluate_envs``: a model on the held-out split of each capability's synthesized environments;
- ``replay_failed``: a model on the bundled-domain tasks that failed in the ingested logs, with the
  capability gap of every new failure (repeat-failure rate);
- ``regression``: per-capability deltas against the champion;
- ``EvalReport``: one model's results, flat metrics for MLflow and a full JSON record
  (``evaluate_model`` builds one: environments, replay and regression in one call);
- ``render_eval_html``: the comparison page of several models.

The implementation lives in ``traceops.evaluation``; this module is the stable import path.
"""

from __future__ import annotations

from traceops.evaluation.envs import (
    TRIAL_SEED_STRIDE,
    env_factory,
    evaluate_envs,
    list_capabilities,
    load_tasks,
)
from traceops.evaluation.html import render_eval_html
from traceops.evaluation.metrics import CapabilityEval, EnvEval, is_success, pass_hat_k
from traceops.evaluation.oracle import OracleModel
from traceops.evaluation.replay import (
    ReplayEval,
    ReplayTask,
    failed_by_domain,
    failed_from_attributions,
    gap_of,
    replay_failed,
)
from traceops.evaluation.report import EvalReport, read_reports, regression, write_reports
from traceops.evaluation.runner import evaluate_model

__all__ = [
    "TRIAL_SEED_STRIDE",
    "CapabilityEval",
    "EnvEval",
    "EvalReport",
    "OracleModel",
    "ReplayEval",
    "ReplayTask",
    "env_factory",
    "evaluate_envs",
    "evaluate_model",
    "failed_by_domain",
    "failed_from_attributions",
    "gap_of",
    "is_success",
    "list_capabilities",
    "load_tasks",
    "pass_hat_k",
    "read_reports",
    "regression",
    "render_eval_html",
    "replay_failed",
    "write_reports",
]
