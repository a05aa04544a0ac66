"""Promotion gates: does tonight's candidate replace the champion? Pure: moving MLflow aliases is the
orchestration layer's job.

Every comparison is paired: the candidate and its reference were evaluated on the same test tasks, and
each gate reads the 95% paired bootstrap interval of the success difference (``regression()``), never
the point estimate alone, so a handful of tasks cannot promote on noise. Rules (``params.yaml`` section
``promote``):

- ``margin`` (0.02): the lower bound of the candidate's overall gain over the champion must be above
  this, compared on the capabilities both were evaluated on;
- ``max_capability_regression`` (0.05): no capability's interval may admit a drop of more than this
  against the champion (its lower bound must be at least ``-max_capability_regression``);
- ``repeat_failure_not_worse`` (true): the candidate's repeat-failure rate on the replayed logged
  failures must not exceed the champion's;
- ``max_real_regression`` (0.05): on the held-out real requests (logged requests training never saw,
  the agent's logged successes among them), the lower bound of the candidate's paired difference from
  the champion (the base on a first night) must be above ``-max_real_regression``: a regression on what
  the agent already did right blocks promotion. Fewer paired requests than ``min_paired_tasks`` is too
  small to conclude and fails like the margin rule; a night with no graded held-out request on either
  side does not apply the check and says so.

First night (no champion): the lower bound of the candidate's overall gain over the *base* model must be
above 0 and, with ``repeat_failure_not_worse``, it must not repeat more logged failures than the base
does. When the point estimate clears a bar but its interval does not, the reason says the evaluation is
too small to conclude and the candidate stays ``challenger``. The reports compared should come from
the same night's environments and replays (re-evaluate the champion).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from traceops.errors import ConfigError
from traceops.evaluation.report import EvalReport, regression
from traceops.evaluation.requests import compare_requests
from traceops.registry import CHALLENGER, CHAMPION

EPS = 1e-9  # success rates are ratios of small integers: compare with a tolerance, not exactly


@dataclass(frozen=True)
class Gates:
    """Thresholds of the promotion rules (see the module docstring)."""

    margin: float = 0.02
    max_capability_regression: float = 0.05
    repeat_failure_not_worse: bool = True
    min_paired_tasks: int = 16
    max_real_regression: float = 0.05

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
                min_paired_tasks=int(values.get("min_paired_tasks", cls.min_paired_tasks)),
                max_real_regression=float(values.get("max_real_regression", cls.max_real_regression)),
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"params.yaml promote: {exc}; margin and max_capability_regression are "
                "numbers, min_paired_tasks a whole number, repeat_failure_not_worse true or false"
            ) from exc
        if gates.min_paired_tasks < 1:
            raise ConfigError(
                f"params.yaml promote.min_paired_tasks is {gates.min_paired_tasks}; use at least 1"
            )
        if not -1.0 <= gates.margin <= 1.0:
            raise ConfigError(f"params.yaml promote.margin is {gates.margin}; use a value in [-1, 1]")
        if not 0.0 <= gates.max_capability_regression <= 1.0:
            raise ConfigError(
                f"params.yaml promote.max_capability_regression is "
                f"{gates.max_capability_regression}; use a value in [0, 1]"
            )
        if not 0.0 <= gates.max_real_regression <= 1.0:
            raise ConfigError(
                f"params.yaml promote.max_real_regression is {gates.max_real_regression}; use a value "
                "in [0, 1]"
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


MORE_TASKS = (
    "evaluate more test tasks per capability (params.yaml evaluate.limit, or `traceops evaluate --full`) "
    "before promoting on it"
)


def _interval(row: dict[str, Any]) -> str:
    if row.get("low") is None:
        return "no interval"
    return f"95% interval [{row['low']:+.3f}, {row['high']:+.3f}]"


def _margin_check(
    candidate: EvalReport, reference: EvalReport, role: str, threshold: float, min_tasks: int
) -> tuple[dict[str, Any], str]:
    if candidate.envs is None or reference.envs is None:
        missing = "candidate" if candidate.envs is None else role
        return (
            _check(False, None, threshold),
            f"Overall success cannot be compared: the {missing} has no environment evaluation; "
            "evaluate both on the same environments.",
        )
    reg = regression(candidate.envs, reference.envs)
    if reg["overall"] is None:
        return (
            _check(False, None, threshold),
            f"Overall success cannot be compared: no capability was evaluated for both the candidate "
            f"and the {role}; evaluate the {role} on tonight's environments.",
        )
    row = reg["overall"]
    mine, theirs, delta = row["candidate"], row["champion"], row["delta"]
    low, tasks = row["low"], row["tasks"]
    # A percentile bootstrap over very few tasks understates its own uncertainty (3 wins of 4 tasks
    # give a lower bound of +0.25, though a sign test calls that chance): below min_tasks, no verdict.
    enough = tasks >= min_tasks
    passed = enough and low is not None and low > threshold + EPS
    # The point estimate clears the bar but the evidence does not: too few tasks to tell from chance.
    inconclusive = not passed and delta > threshold + EPS
    shared = len(reg["shared"])
    text = (
        f"Overall success {mine:.3f} vs {role} {theirs:.3f} on {shared} shared "
        f"capabilit{'y' if shared == 1 else 'ies'} ({tasks} paired task{'' if tasks == 1 else 's'}): "
        f"{delta:+.3f}, {_interval(row)}; the lower bound must be above {threshold:+.3f} "
        f"({'passed' if passed else 'failed'})."
    )
    if inconclusive:
        few = "" if enough else f" (fewer than the {min_tasks} paired tasks an interval needs)"
        text = (
            f"{text[:-1]}: the gain over the {role} cannot be told from chance on {tasks} "
            f"task{'' if tasks == 1 else 's'}{few}; {MORE_TASKS}."
        )
    return (
        _check(passed, low, threshold, delta=delta, low=low, high=row["high"], tasks=tasks,
               candidate=mine, reference=theirs, shared=reg["shared"], inconclusive=inconclusive),
        text,
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
    rows = reg["capabilities"]
    # The largest drop each capability's interval admits: the negated lower bound of its difference.
    drops = {c: -r["low"] for c, r in rows.items() if r.get("low") is not None}
    if not drops:
        return (
            _check(False, None, limit),
            "Per-capability regression cannot be checked: no capability was evaluated for both.",
        )
    worst = max(sorted(drops), key=lambda c: drops[c])
    drop = max(0.0, drops[worst])  # 0.0 first: max keeps it over a -0.0 from an exact [0, 0]
    passed = drop <= limit + EPS
    over = sorted(c for c, d in drops.items() if d > limit + EPS)
    # Of those, the ones whose measured drop is within the limit: too few tasks to rule a drop out.
    unclear = [c for c in over if rows[c]["delta"] is not None and -rows[c]["delta"] <= limit + EPS]
    if passed:
        text = (
            f"No capability can have dropped by more than {limit:.3f} against the champion: the "
            f"largest drop the 95% intervals admit is {drop:.3f} ({worst}) (passed)."
        )
    else:
        listed = ", ".join(
            f"{c} {rows[c]['champion']:.3f} -> {rows[c]['candidate']:.3f} "
            f"({_interval(rows[c])} over {rows[c]['tasks']} tasks)"
            for c in over
        )
        text = (
            f"Success may have dropped by more than {limit:.3f} against the champion on {len(over)} "
            f"capabilit{'y' if len(over) == 1 else 'ies'}: {listed} (failed)."
        )
        if unclear:
            text = (
                f"{text[:-1]}; the measured drop on {', '.join(unclear)} is within the limit but cannot "
                f"be told from chance, so {MORE_TASKS}."
            )
    return (
        _check(passed, drop, limit, capability=worst, regressed=over, inconclusive=bool(unclear)),
        text,
    )


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


MORE_REQUESTS = (
    "hold out more logged requests with a reference (params.yaml evaluate.requests: heldout_fraction, "
    "limit, or a references file) before promoting on them"
)


def _real_requests_check(
    candidate: EvalReport, reference: EvalReport, role: str, limit: float, min_tasks: int
) -> tuple[dict[str, Any], str]:
    compared = compare_requests(candidate.requests, reference.requests)
    row = compared["overall"] if compared else None
    if row is None:
        graded = max(r.requests.graded() if r.requests else 0 for r in (candidate, reference))
        if graded == 0:
            return (
                _check(True, None, -limit, applied=False),
                "Held-out real requests not compared: none with a reference was graded tonight "
                f"(logged successes or evaluate.requests.references give them); {MORE_REQUESTS}.",
            )
        return (
            _check(False, None, -limit, inconclusive=True),
            f"Held-out real requests cannot be compared: the candidate and the {role} were not graded "
            "on the same requests; evaluate both in the same night (failed).",
        )
    low, tasks, delta = row["low"], row["tasks"], row["delta"]
    enough = tasks >= min_tasks
    passed = enough and low is not None and low > -limit + EPS
    inconclusive = not passed and delta is not None and delta > -limit + EPS
    text = (
        f"Held-out real requests: success {row['candidate']:.3f} vs {role} {row['champion']:.3f} on "
        f"{tasks} paired request{'' if tasks == 1 else 's'} over {len(compared['shared'])} "
        f"domain{'' if len(compared['shared']) == 1 else 's'}: {delta:+.3f}, {_interval(row)}; the lower "
        f"bound must be above {-limit:+.3f} ({'passed' if passed else 'failed'})."
    )
    if inconclusive:
        few = "" if enough else f" (fewer than the {min_tasks} paired requests an interval needs)"
        text = (f"{text[:-1]}: a drop of more than {limit:.3f} cannot be ruled out on {tasks} "
                f"request{'' if tasks == 1 else 's'}{few}; {MORE_REQUESTS}.")
    return (
        _check(passed, low, -limit, delta=delta, low=low, high=row["high"], tasks=tasks,
               candidate=row["candidate"], reference=row["champion"], shared=compared["shared"],
               inconclusive=inconclusive),
        text,
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
    # Displacing a champion must be worth the churn (margin); on the first night there is none to
    # displace, so a gain over the base that chance does not explain is enough.
    threshold = 0.0 if first_night else gates.margin
    checks[name], text = _margin_check(candidate, reference, role, threshold, gates.min_paired_tasks)
    reasons.append(text)
    if champion is not None:
        checks["capability_regression"], text = _regression_check(
            candidate, champion, gates.max_capability_regression
        )
        reasons.append(text)
    if gates.repeat_failure_not_worse:
        checks["repeat_failure_not_worse"], text = _repeat_check(candidate, reference, role)
        reasons.append(text)
    real, text = _real_requests_check(
        candidate, reference, role, gates.max_real_regression, gates.min_paired_tasks
    )
    if real.get("applied", True):  # not applied (no graded held-out request): said, not counted
        checks["real_requests"] = real
    reasons.append(text)
    promote = all(c["passed"] for c in checks.values())
    failed = [n for n, c in checks.items() if not c["passed"]]
    unclear = [n for n in failed if checks[n].get("inconclusive")]
    reasons.append(
        f"Promoted to {CHAMPION}: all {len(checks)} checks passed."
        if promote
        else f"Kept as {CHALLENGER}: {len(failed)} of {len(checks)} checks failed ({', '.join(failed)})"
        + (
            f"; the evaluation is too small to conclude ({', '.join(unclear)}), not evidence "
            "against the candidate."
            if unclear
            else "."
        )
    )
    return Decision(
        promote=promote, alias=CHAMPION if promote else CHALLENGER, reasons=reasons, checks=checks
    )
