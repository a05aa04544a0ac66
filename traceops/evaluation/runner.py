"""Evaluate one model end to end: held-out environments, replay of logged failures, regression."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

from traceops.evaluation.cache import EvalCache
from traceops.evaluation.envs import evaluate_envs
from traceops.evaluation.metrics import EnvEval
from traceops.evaluation.replay import Failed, replay_failed
from traceops.evaluation.report import EvalReport, regression
from traceops.evaluation.requests import RequestSet
from traceops.graders import Grader
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


def _split_identity(env_root: str | Path, capability: str, split: str, limit: int | None) -> dict | None:
    """What a capability's evaluation depends on in its folder: the task specs evaluated (after the
    limit) and the manifest. None when it cannot be cached: the folder or split is unreadable
    (``evaluate_envs`` then reports why) or the manifest names an environment class outside traceops,
    which ``code_identity`` does not cover."""
    from traceops.envs.folder import MANIFEST_NAME
    from traceops.errors import TraceopsError
    from traceops.evaluation.envs import load_tasks
    from traceops.hashing import content_hash, file_hash

    manifest = Path(env_root) / capability / MANIFEST_NAME
    try:
        tasks = load_tasks(env_root, capability, split, limit)
        text = manifest.read_text(encoding="utf-8")
    except (TraceopsError, OSError):
        return None
    environment = json.loads(text).get("environment") if text.lstrip().startswith("{") else None
    if isinstance(environment, str) and not environment.startswith("traceops."):
        return None
    return {"capability": capability, "split": split, "tasks": content_hash(tasks, length=32),
            "manifest": file_hash(manifest)}


def evaluate_cached(
    name: str,
    load: Callable[[], ChatModel],
    weights: str,
    cache: EvalCache,
    *,
    env_root: str | Path,
    capabilities: Sequence[str],
    domain: str | None = None,
    failed: Sequence[Failed] = (),
    k: int = 1,
    trials: int | None = None,
    max_turns: int = 8,
    replay_max_turns: int = 12,
    config: GenerationConfig,
    limit: int | None = None,
    batch_size: int = 8,
    requests: RequestSet | None = None,
    graders: Mapping[str, Grader] | None = None,
    grader_specs: Mapping[str, str] | None = None,
) -> EvalReport:
    """``evaluate_model``'s report (test split of ``capabilities``, replay when ``domain`` is given) plus
    the held-out ``requests``, reading every part ``cache`` holds for the role's ``weights``
    (``cache.role_weights_id``) and computing only the rest; ``load`` is called only when something
    is missing. A cached part is exactly what a fresh run gives (see ``evaluation.cache``)."""
    from traceops.evaluation.metrics import CapabilityEval
    from traceops.evaluation.replay import ReplayEval
    from traceops.evaluation.requests import grade_replies, replies_identity, request_replies

    split = "test"
    generation = asdict(config)
    n_trials = k if trials is None else trials
    run = {"generation": generation, "batch_size": batch_size}
    model: ChatModel | None = None

    def loaded() -> ChatModel:
        nonlocal model
        if model is None:
            model = load()
            cache.put(info_key, {"model_id": model.info.model_id, "weights_hash": model.info.weights_hash})
        return model

    info_key = cache.key("info", weights)
    keys: dict[str, str | None] = {}
    for capability in dict.fromkeys(capabilities):
        identity = _split_identity(env_root, capability, split, limit)
        keys[capability] = None if identity is None else cache.key(
            "envs", weights, **identity, k=k, trials=n_trials, max_turns=max_turns, **run)
    found = {c: CapabilityEval.from_dict(v) for c, key in keys.items()
             if key is not None and (v := cache.get(key)) is not None}
    missing = [c for c in keys if c not in found]
    fresh = (evaluate_envs(loaded(), env_root, missing, split=split, k=k, max_turns=max_turns,
                           config=config, limit=limit, trials=trials, batch_size=batch_size)
             if missing else None)
    for capability, result in (fresh.capabilities.items() if fresh else []):
        if keys[capability] is not None:
            cache.put(str(keys[capability]), result.to_dict())

    replay = None
    if domain is not None:
        replay_key = cache.key("replay", weights, domain=domain, failed=[list(f) for f in failed],
                               max_turns=replay_max_turns, **run)
        stored = cache.get(replay_key)
        if stored is not None:
            replay = ReplayEval.from_dict(stored)
        else:
            replay = replay_failed(loaded(), domain, failed, max_turns=replay_max_turns, config=config,
                                   batch_size=batch_size)
            cache.put(replay_key, replay.to_dict())

    request_eval = None
    if requests is not None:
        replies_key = cache.key("requests", weights, requests=replies_identity(requests), **run)
        texts = cache.get(replies_key)
        if texts is None:
            texts = request_replies(loaded(), requests, config, batch_size)
            cache.put(replies_key, texts)
        request_eval = grade_replies(requests, texts, graders or {}, grader_specs)

    # Everything came from the cache: the model's id and weights hash did too (stored when it loaded).
    info = cache.get(info_key) if model is None else None
    if info is None:
        info = {"model_id": loaded().info.model_id, "weights_hash": loaded().info.weights_hash}
    computed = fresh.capabilities if fresh is not None else {}
    envs = EnvEval(
        model_id=str(info["model_id"]), split=split, k=k, trials=n_trials,
        temperature=float(config.temperature), seed=int(config.seed),
        capabilities={c: found.get(c) or computed[c] for c in keys if c in found or c in computed},
        skipped=dict(fresh.skipped) if fresh is not None else {},
    )
    return EvalReport(name=name, model_id=str(info["model_id"]), weights_hash=str(info["weights_hash"]),
                      envs=envs, replay=replay, requests=request_eval)
