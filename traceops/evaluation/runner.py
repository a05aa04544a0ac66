"""Evaluate one model end to end: held-out environments, replay of logged failures, regression."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from traceops.evaluation.envs import evaluate_envs
from traceops.evaluation.metrics import EnvEval
from traceops.evaluation.replay import Failed, replay_failed
from traceops.evaluation.report import EvalReport, regression
from traceops.model.base import ChatModel, GenerationConfig


def evaluate_model(
    name: str,
    model: ChatModel,
    *,
    env_root: str | Path | None = None,
    capabilities: Sequence[str] | None = None,
    domain: str | None = None,
    failed: Sequence[Failed] = (),
    champion: EnvEval | None = None,
    split: str = "test",
    k: int = 1,
    trials: int | None = None,
    max_turns: int = 8,
    replay_max_turns: int = 12,
    config: GenerationConfig | None = None,
    limit: int | None = None,
    batch_size: int = 8,
) -> EvalReport:
    """``EvalReport`` of ``model`` under the role ``name``: ``evaluate_envs`` when ``env_root`` is given,
    ``replay_failed`` when ``domain`` is given, and the regression against ``champion``'s environment
    evaluation when both exist. A part that is not asked for is absent from the report."""
    envs = None
    if env_root is not None:
        envs = evaluate_envs(
            model,
            env_root,
            capabilities,
            split=split,
            k=k,
            max_turns=max_turns,
            config=config,
            limit=limit,
            trials=trials,
            batch_size=batch_size,
        )
    replay = None
    if domain is not None:
        replay = replay_failed(
            model, domain, failed, max_turns=replay_max_turns, config=config, batch_size=batch_size
        )
    reg = regression(envs, champion) if envs is not None and champion is not None else None
    return EvalReport(
        name=name,
        model_id=model.info.model_id,
        weights_hash=model.info.weights_hash,
        envs=envs,
        replay=replay,
        regression=reg,
    )
