"""Promotion gates: does tonight's candidate replace the champion? Pure: moving MLflow aliases is the
orchestration layer's job.

Rules (``params.yaml`` section ``promote``):

- ``margin`` (0.02): the candidate's overall success must beat the champion's by at least this much,
  compared on the capabilities both were evaluated on;
- ``max_capability_regression`` (0.05): no capability's success may drop by more than this against the
  champion;
- ``repeat_failure_not_worse`` (true): the candidate's repeat-failure rate on the replayed logged
  failures must not exceed the champion's.

First night (no champion): the candidate must beat the *base* model overall by ``margin`` and, with
``repeat_failure_not_worse``, not repeat more logged failures than the base model does. The reports
compared should come from the same night's environments and replays (re-evaluate the champion).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from traceops.errors import ConfigError
from traceops.evaluation.report import EvalReport, regression
from traceops.registry import CHALLENGER, CHAMPION

EPS = 1e-9  # success rates are ratios of small integers: compare with a tolerance, not exactly


@dataclass(frozen=True)
class Gates:
    """Thresholds of the promotion rules (see the module docstring)."""

    margin: float = 0.02
    max_capability_regression: float = 0.05
    repeat_failure_not_worse: bool = True

    @classmethod
    def from_params(cls, params: Mapping[str, Any] | None) -> Gates:
        """Gates from a ``params.yaml`` mapping; unknown keys and out-of-range values are errors."""
        values = dict(params or {})
        flag = values.get("repeat_failure_not_worse", cls.repeat_failure_not_worse)
        if not isinstance(flag, bool):
            raise ConfigError(f"params.yaml promote.repeat_failure_not_worse is {flag!r}; use true or false")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"params.yaml promote: unknown key(s) {unknown}; known: {sorted(known)}")
        try:
            gates = cls(
                margin=float(values.get("margin", cls.margin)),
                max_capability_regression=float(
                    values.get("max_capability_regression", cls.max_capability_regression)
                ),
                repeat_failure_not_worse=flag,
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"params.yaml promote: {exc}; margin and max_capability_regression are "
                "numbers, repeat_failure_not_worse is true or false"
            ) from exc
        if not -1.0 <= gates.margin <= 1.0:
            raise ConfigError(f"params.yaml promote.margin is {gates.margin}; use a value in [-1, 1]")
        if not 0.0 <= gates.max_capability_regression <= 1.0:
            raise ConfigError(
                f"params.yaml promote.max_capability_regression is "
                f"{gates.max_capability_regression}; use a value in [0, 1]"
            )
        return gates


@dataclass(frozen=True)
class Decision:
    """The verdict: promote or not, the alias the candidate gets, a sentence per rule, and each check."""

    promote: bool
    alias: str
    reasons: list[str] = field(default_factory=list)
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return asdict(self)


def _check(passed: bool, value: float | None, threshold: float | None, **extra: Any) -> dict[str, Any]:
    return {"passed": bool(passed), "value": value, "threshold": threshold, **extra}


def _margin_check(
    candidate: EvalReport, reference: EvalReport, role: str, margin: float
) -> tuple[dict[str, Any], str]:
    if candidate.envs is None or reference.envs is None:
        missing = "candidate" if candidate.envs is None else role
        return (
            _check(False, None, margin),
            f"Overall success cannot be compared: the {missing} has no environment evaluation; "
            "evaluate both on the same environments.",
        )
    reg = regression(candidate.envs, reference.envs)
    if reg["overall"] is None:
        return (
            _check(False, None, margin),
            f"Overall success cannot be compared: no capability was evaluated for both the candidate "
            f"and the {role}; evaluate the {role} on tonight's environments.",
        )
    mine, theirs, delta = reg["overall"]["candidate"], reg["overall"]["champion"], reg["overall"]["delta"]
    passed = delta >= margin - EPS
    shared = len(reg["shared"])
    return (
        _check(passed, delta, margin, candidate=mine, reference=theirs, shared=reg["shared"]),
        f"Overall success {mine:.3f} vs {role} {theirs:.3f} on {shared} shared "
        f"capabilit{'y' if shared == 1 else 'ies'}: {delta:+.3f}, needs at least {margin:+.3f} "
        f"({'passed' if passed else 'failed'}).",
    )


def _regression_check(
    candidate: EvalReport, champion: EvalReport, limit: float
) -> tuple[dict[str, Any], str]:
    if candidate.envs is None or champion.envs is None:
        return (
            _check(False, None, limit),
            "Per-capability regression cannot be checked: an environment evaluation is missing.",
        )
    reg = regression(candidate.envs, champion.envs)
    drops = {c: -r["delta"] for c, r in reg["capabilities"].items() if r["delta"] is not None}
    if not drops:
        return (
            _check(False, None, limit),
            "Per-capability regression cannot be checked: no capability was evaluated for both.",
        )
    worst = max(sorted(drops), key=lambda c: drops[c])
    drop = max(drops[worst], 0.0)
    passed = drop <= limit + EPS
    over = sorted(c for c, d in drops.items() if d > limit + EPS)
    if passed:
        text = (
            f"Largest per-capability drop against the champion is {drop:.3f} ({worst}), within the "
            f"allowed {limit:.3f} (passed)."
        )
    else:
        listed = ", ".join(
            f"{c} {reg['capabilities'][c]['champion']:.3f} -> {reg['capabilities'][c]['candidate']:.3f}"
            for c in over
        )
        text = (
            f"Success dropped by more than {limit:.3f} against the champion on {len(over)} "
            f"capabilit{'y' if len(over) == 1 else 'ies'}: {listed} (failed)."
        )
    return _check(passed, drop, limit, capability=worst, regressed=over), text


def _repeat_check(candidate: EvalReport, reference: EvalReport, role: str) -> tuple[dict[str, Any], str]:
    mine, theirs = candidate.repeat_failure_rate, reference.repeat_failure_rate
    if theirs is None:
        return (
            _check(True, mine, None, applied=False),
            f"Repeat-failure rate not compared: the {role} has no replay of logged failures.",
        )
    if mine is None:
        return (
            _check(False, None, theirs),
            f"Repeat-failure rate missing for the candidate while the {role}'s is {theirs:.3f}; "
            "replay the logged failures with the candidate (failed).",
        )
    passed = mine <= theirs + EPS
    replayed = candidate.replay.replayed if candidate.replay else 0
    return (
        _check(passed, mine, theirs),
        f"Repeat-failure rate {mine:.3f} vs {role} {theirs:.3f} over {replayed} replayed logged "
        f"failure{'s' if replayed != 1 else ''}: {'not worse' if passed else 'worse'} "
        f"({'passed' if passed else 'failed'}).",
    )


def decide(
    candidate: EvalReport, champion: EvalReport | None, base: EvalReport, gates: Gates | None = None
) -> Decision:
    """Apply the gates; the candidate becomes ``champion`` when every applied check passes, else
    ``challenger``. Every reason is a sentence with the numbers behind it."""
    gates = gates or Gates()
    first_night = champion is None
    reference, role = (base, "base model") if champion is None else (champion, "champion")
    checks: dict[str, dict[str, Any]] = {}
    reasons: list[str] = []
    if first_night:
        reasons.append("No champion yet (first night): the candidate is compared with the base model.")
    name = "beats_base" if first_night else "beats_champion"
    checks[name], text = _margin_check(candidate, reference, role, gates.margin)
    reasons.append(text)
    if champion is not None:
        checks["capability_regression"], text = _regression_check(
            candidate, champion, gates.max_capability_regression
        )
        reasons.append(text)
    if gates.repeat_failure_not_worse:
        checks["repeat_failure_not_worse"], text = _repeat_check(candidate, reference, role)
        reasons.append(text)
    promote = all(c["passed"] for c in checks.values())
    failed = [n for n, c in checks.items() if not c["passed"]]
    reasons.append(
        f"Promoted to {CHAMPION}: all {len(checks)} checks passed."
        if promote
        else f"Kept as {CHALLENGER}: {len(failed)} of {len(checks)} checks failed ({', '.join(failed)})."
    )
    return Decision(
        promote=promote, alias=CHAMPION if promote else CHALLENGER, reasons=reasons, checks=checks
    )
