"""The evaluation stage's pure core: which models play which role, its parameters, and one call that
evaluates every role on the same environments and replays.

Roles: ``base`` (the base model, prompted like the adapters), ``adapter:<capability>``, ``generic``
(one LoRA trained on every capability), ``composite`` (tonight's MoE-LoRA) and ``champion`` (the
registered champion composite, re-evaluated on tonight's environments so the comparison is fair).
Every role runs with the same greedy settings, task limit and replay set; trained roles are compared
against the champion (regression), or against nothing on the first night.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from traceops.errors import ConfigError
from traceops.evaluation.cache import EvalCache, role_weights_id
from traceops.evaluation.replay import Failed
from traceops.evaluation.report import EvalReport, regression
from traceops.evaluation.requests import RequestSet, compare_requests
from traceops.evaluation.runner import evaluate_cached
from traceops.graders import Grader
from traceops.heldout import RequestParams
from traceops.memory import release_memory
from traceops.model.base import ChatModel, GenerationConfig
from traceops.registry import CHAMPION  # the champion role is the version holding that alias

BASE, GENERIC, COMPOSITE = "base", "generic", "composite"
ADAPTER_PREFIX = "adapter:"
KINDS = ("base", "adapter", "composite")


def adapter_role(capability: str) -> str:
    """The role name of a capability's adapter: ``adapter:<capability>``."""
    return f"{ADAPTER_PREFIX}{capability}"


@dataclass(frozen=True)
class EvalParams:
    """Settings of the evaluation stage (``params.yaml`` section ``evaluate``; defaults are the CPU
    nightly's).

    ``limit`` test tasks per capability (None: the whole split; 16 by default, the fewest for a success
    rate's 95% interval to be narrower than about +-0.25 and for paired comparisons to conclude
    anything); ``k`` for pass^k with ``trials``
    (default ``k``) trials per task; ``max_turns`` assistant turns per episode (the longest oracle
    demonstration of the built-in families has 8); ``max_new_tokens`` per turn at least (a turn gets
    room for the longest right reply where that is more, ``traceops.evaluation.room``; generation also
    stops at end of turn); ``replay`` the
    logged failures of a bundled domain, at most ``replay_limit`` distinct tasks (None: all) with
    ``replay_max_turns``, by the roles in ``replay_roles`` (a retail prompt is ~2,500 tokens: replaying
    every logged failure with every model does not fit a CPU night; base = before, composite = after,
    champion = the gate's reference); ``adapters_on``: ``all`` evaluates each adapter on every
    capability, ``own`` only on its own (the cut when the night runs out of time).
    """

    limit: int | None = 16
    k: int = 1
    trials: int | None = None
    max_turns: int = 8
    max_new_tokens: int = 96
    batch_size: int = 8
    replay: bool = True
    replay_limit: int | None = 16
    replay_max_turns: int = 12
    replay_roles: tuple[str, ...] = (BASE, COMPOSITE, CHAMPION)
    adapters_on: str = "all"
    seed: int = 0
    requests: RequestParams = field(default_factory=RequestParams)  # held-out real requests

    @classmethod
    def from_params(cls, params: Mapping[str, Any] | None, full: bool = False) -> EvalParams:
        """Parameters from a ``params.yaml`` mapping; unknown keys and bad values are errors.
        ``full`` (``traceops evaluate --full``): every test task, whatever ``limit`` says."""
        values = dict(params or {})
        if full:
            values["limit"] = None
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"params.yaml evaluate: unknown key(s) {unknown}; known: {sorted(known)}")
        try:
            chosen = cls(**{**asdict(cls()), **values})
            chosen = replace(
                chosen,
                limit=None if chosen.limit is None else int(chosen.limit),
                k=int(chosen.k),
                trials=None if chosen.trials is None else int(chosen.trials),
                max_turns=int(chosen.max_turns),
                max_new_tokens=int(chosen.max_new_tokens),
                batch_size=int(chosen.batch_size),
                replay_limit=None if chosen.replay_limit is None else int(chosen.replay_limit),
                replay_max_turns=int(chosen.replay_max_turns),
                replay_roles=tuple(str(r) for r in chosen.replay_roles),
                seed=int(chosen.seed),
                requests=RequestParams.from_params(chosen.requests),
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"params.yaml evaluate: {exc}; limit is a number or null, k/trials/"
                              "max_turns/max_new_tokens/batch_size are whole numbers") from exc
        if not isinstance(chosen.replay, bool):
            raise ConfigError(f"params.yaml evaluate.replay is {chosen.replay!r}; use true or false")
        if chosen.adapters_on not in ("all", "own"):
            raise ConfigError(f"params.yaml evaluate.adapters_on is {chosen.adapters_on!r}; use all or own")
        small = {n: getattr(chosen, n) for n in ("k", "max_turns", "max_new_tokens", "batch_size",
                                                 "replay_max_turns") if getattr(chosen, n) < 1}
        for name in ("limit", "replay_limit"):
            if getattr(chosen, name) is not None and getattr(chosen, name) < 1:
                small[name] = getattr(chosen, name)
        if small:
            raise ConfigError(f"params.yaml evaluate: {small} must be at least 1 (limits may be null)")
        if chosen.trials is not None and chosen.trials < chosen.k:
            raise ConfigError(f"params.yaml evaluate: trials ({chosen.trials}) must be at least "
                              f"k ({chosen.k})")
        return chosen

    def generation(self) -> GenerationConfig:
        """Greedy decoding, capped per turn: every role is decoded alike."""
        return GenerationConfig(max_new_tokens=self.max_new_tokens, temperature=0.0, seed=self.seed)

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (MLflow params, cache key)."""
        data = asdict(self)
        data["replay_roles"] = list(self.replay_roles)
        return data


@dataclass(frozen=True)
class RoleSpec:
    """One model to evaluate: its ``kind`` (base, adapter or composite), the folder of its trained
    weights (None for the base), the registered version it came from, and the capability it was
    trained for (adapters)."""

    role: str
    kind: str
    path: str | None = None
    ref: dict[str, str] | None = None
    capability: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"role {self.role}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind != "base" and not self.path:
            raise ConfigError(f"role {self.role}: a {self.kind} needs the folder of its weights")

    def identity(self) -> tuple[Any, ...]:
        """What makes two roles the same evaluation: the weights (registered version, else folder)
        and, for an adapter, the capability that decides where it is evaluated."""
        weights = (self.ref.get("name"), self.ref.get("version")) if self.ref else self.path
        return (self.kind, weights, self.capability)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RoleSpec:
        return cls(**{f.name: data.get(f.name) for f in fields(cls)})


def load_role_model(spec: RoleSpec, base_model_dir: str | Path, batch_size: int) -> ChatModel:
    """The ChatModel of a role, prompted exactly as training did (``traceops.model.adapted``)."""
    from traceops.model.adapted import load_adapter_model, load_base_model, load_composite_model

    if spec.kind == "base":
        return load_base_model(base_model_dir, batch_size=batch_size)
    if spec.kind == "adapter":
        return load_adapter_model(base_model_dir, str(spec.path), batch_size=batch_size)
    return load_composite_model(base_model_dir, str(spec.path), batch_size=batch_size)


def role_capabilities(spec: RoleSpec, capabilities: Sequence[str], params: EvalParams) -> list[str]:
    """The capabilities a role is evaluated on: all of them, or only its own for an adapter when
    ``adapters_on`` is ``own``."""
    if spec.kind == "adapter" and params.adapters_on == "own" and spec.capability:
        return [c for c in capabilities if c == spec.capability]
    return list(capabilities)


def scored_capabilities(specs: Sequence[RoleSpec], available: Sequence[str],
                        not_trained: Mapping[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The capabilities tonight's evaluation scores, and the others with the reason they are not.

    With at least one adapter role, only the capabilities that have one tonight (trained or reused):
    a capability deferred by the train stage's plan has nothing of its own to compare, and scoring it
    with every other model costs a night's evaluation of it for no verdict. ``not_trained`` gives the
    train stage's reason per capability (its plan's ``deferred``). Without adapter roles, everything
    under the environments root is scored."""
    own = {s.capability for s in specs if s.kind == "adapter" and s.capability}
    if not own:
        return list(available), {}
    reasons = dict(not_trained or {})
    skipped = {c: f"no adapter tonight ({reasons.get(c) or 'not trained'})"
               for c in available if c not in own}
    return [c for c in available if c in own], skipped


def replay_sample(failed: Sequence[Failed], limit: int | None) -> list[Failed]:
    """At most ``limit`` distinct logged-failure tasks (every logged gap of each kept), taken round-robin
    over the logged gaps in task-id order, so every gap is represented; deterministic."""
    gaps: dict[str, list[str]] = {}
    for task_id, capability in sorted(failed, key=lambda f: (f[0], f[1] or "")):
        queue = gaps.setdefault(capability or "", [])
        if task_id not in queue:
            queue.append(task_id)
    chosen: list[str] = []
    while any(gaps.values()) and (limit is None or len(chosen) < limit):
        for capability in sorted(gaps):
            queue = gaps[capability]
            while queue and queue[0] in chosen:
                queue.pop(0)
            if queue and (limit is None or len(chosen) < limit):
                chosen.append(queue.pop(0))
    keep = set(chosen)
    return [f for f in failed if f[0] in keep]


def evaluate_roles(
    specs: Sequence[RoleSpec],
    base_model_dir: str | Path,
    env_root: str | Path,
    capabilities: Sequence[str],
    params: EvalParams,
    domain: str | None = None,
    failed: Sequence[Failed] = (),
    load: Callable[[RoleSpec], ChatModel] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    requests: RequestSet | None = None,
    graders: Mapping[str, Grader] | None = None,
    cache: EvalCache | None = None,
) -> tuple[dict[str, EvalReport], dict[str, float]]:
    """Evaluate every role on ``capabilities`` (held-out split) and, with ``domain``, the roles in
    ``params.replay_roles`` on the replay of ``replay_sample(failed, params.replay_limit)``; then add
    each trained role's regression against the ``champion`` role when there is one.

    One model is loaded at a time (``load``, default ``load_role_model``) and freed before the next;
    ``progress(role, done, total)`` is called as each role finishes. With ``requests`` (the held-out
    real requests, ``evaluation.requests.select_requests``) every role also replays them, graded by
    ``graders`` (domain -> grader). ``cache`` (``evaluation.cache``) serves every part it already holds
    for a role's weights and keeps what is computed; a role found whole there is not even loaded.
    Returns the reports in ``specs`` order and the seconds each role took.
    """
    from traceops.model.adapted import base_info

    loader = load or (lambda spec: load_role_model(spec, base_model_dir, params.batch_size))
    cache = cache or EvalCache(None)
    base_weights = base_info(Path(base_model_dir))[1]
    sample = replay_sample(failed, params.replay_limit)
    reports: dict[str, EvalReport] = {}
    seconds: dict[str, float] = {}
    done: list[RoleSpec] = []
    for spec in specs:
        if spec.role in reports:
            raise ConfigError(f"role {spec.role} is listed twice; give each model one role")
        started = time.perf_counter()
        twin = next((s.role for s in done if s.identity() == spec.identity()), None)
        if twin is not None:
            # The same weights under another role (champion == tonight's composite): same results.
            reports[spec.role] = replace(reports[twin], name=spec.role)
            seconds[spec.role] = 0.0
            done.append(spec)
            if progress is not None:
                progress(spec.role, len(done), len(specs))
            continue
        reports[spec.role] = evaluate_cached(
            spec.role,
            lambda spec=spec: loader(spec),
            role_weights_id(spec.kind, spec.path, base_weights),
            cache,
            env_root=env_root,
            capabilities=role_capabilities(spec, capabilities, params),
            domain=domain if params.replay and failed and spec.role in params.replay_roles else None,
            failed=sample,
            k=params.k,
            trials=params.trials,
            max_turns=params.max_turns,
            replay_max_turns=params.replay_max_turns,
            config=params.generation(),
            limit=params.limit,
            batch_size=params.batch_size,
            requests=requests,
            graders=graders,
            grader_specs={d: params.requests.grader_spec(d) for d in requests.domains} if requests else None,
        )
        release_memory()  # free one model's weights before loading the next (memory, not speed)
        seconds[spec.role] = round(time.perf_counter() - started, 2)
        done.append(spec)
        if progress is not None:
            progress(spec.role, len(done), len(specs))
    champion = reports.get(CHAMPION)
    if champion is not None and champion.envs is not None:
        for role, report in reports.items():
            if role not in (CHAMPION, BASE) and report.envs is not None:
                reports[role] = replace(report, regression=regression(report.envs, champion.envs))
    return reports, seconds


def comparisons(
    reports: Mapping[str, EvalReport],
    candidate: str = COMPOSITE,
    references: Sequence[str] = (CHAMPION, BASE),
) -> dict[str, dict[str, Any]]:
    """The paired comparisons of ``candidate`` with each reference role evaluated tonight, keyed
    ``"<candidate> vs <reference>"``: ``regression()`` of the two (per-capability and overall deltas
    with paired bootstrap 95% intervals). Roles missing an environment evaluation are left out."""
    mine = reports.get(candidate)
    out: dict[str, dict[str, Any]] = {}
    for reference in references:
        theirs = reports.get(reference)
        if mine is not None and mine.envs is not None and theirs is not None and theirs.envs is not None:
            out[f"{candidate} vs {reference}"] = regression(mine.envs, theirs.envs)
    return out


def request_comparisons(
    reports: Mapping[str, EvalReport],
    candidate: str = COMPOSITE,
    references: Sequence[str] = (CHAMPION, BASE),
) -> dict[str, dict[str, Any]]:
    """The paired comparisons of ``candidate`` with each reference role on the held-out real requests
    (``compare_requests``), keyed ``"<candidate> vs <reference>"``; roles without them are left out."""
    mine = reports.get(candidate)
    out: dict[str, dict[str, Any]] = {}
    for reference in references:
        theirs = reports.get(reference)
        if mine is None or theirs is None:
            continue
        compared = compare_requests(mine.requests, theirs.requests)
        if compared is not None:
            out[f"{candidate} vs {reference}"] = compared
    return out
