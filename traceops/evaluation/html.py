"""A self-contained HTML page comparing models: inline SVG bar charts and tables, nothing fetched.

Every text that comes from data (model names, capability ids, reasons) is HTML-escaped.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from traceops.evaluation.intervals import format_gain, format_rate, verdict
from traceops.evaluation.report import EvalReport

PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#76b7b2",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)
CSS = """body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}
th:first-child,td:first-child{text-align:left}.pass{color:#1a7f37}.fail{color:#c62828}.wide{color:#8a6d00}
svg text{font-size:11px}"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def grouped_bars(
    groups: Sequence[str],
    series: Sequence[str],
    values: Mapping[tuple[str, str], float | None],
    title: str,
    plot: float = 160.0,
) -> str:
    """An SVG grouped bar chart of values in [0, 1]: one group per ``groups`` item, one bar per series,
    ``plot`` pixels high. Missing values draw no bar and are marked "n/a"; each bar's tooltip (its SVG
    ``title``) gives the exact value."""
    bar, gap, top = 14, 18, 28
    group_width = max(len(series), 1) * bar + gap
    # Group labels are rotated -30 degrees: leave room for the longest one below and to the left.
    longest = max((len(str(g)) for g in groups), default=0) * 6.5
    left = max(44.0, longest * 0.87 - group_width / 2 + 12)
    axis = top + plot
    legend_top = axis + longest * 0.5 + 36
    width = max(left + len(groups) * group_width + 20, left + len(title) * 6.5 + 10)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" '
        f'height="{legend_top + 20 * len(series):.0f}" role="img" aria-label="{_e(title)}">',
        f'<text x="{left:.1f}" y="16" font-weight="bold">{_e(title)}</text>',
    ]
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        y = top + plot * (1 - tick)
        parts.append(
            f'<line x1="{left:.1f}" x2="{width - 10:.1f}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e0e0e0"/>'
        )
        parts.append(f'<text x="{left - 4:.1f}" y="{y + 4:.1f}" text-anchor="end">{tick:.2f}</text>')
    for g, group in enumerate(groups):
        x0 = left + g * group_width + gap / 2
        for s, name in enumerate(series):
            value = values.get((group, name))
            x = x0 + s * bar
            if value is None:
                parts.append(
                    f'<text x="{x + bar / 2:.1f}" y="{axis - 2:.1f}" text-anchor="middle" '
                    f'font-size="8" fill="#999">n/a</text>'
                )
                continue
            h = plot * max(0.0, min(1.0, float(value)))
            parts.append(
                f'<rect x="{x:.1f}" y="{axis - h:.1f}" width="{bar - 2}" height="{h:.1f}" '
                f'fill="{PALETTE[s % len(PALETTE)]}"><title>{_e(name)} / {_e(group)}: '
                f"{value:.3f}</title></rect>"
            )
        cx, ly = x0 + len(series) * bar / 2, axis + 12
        parts.append(
            f'<text x="{cx:.1f}" y="{ly:.1f}" text-anchor="end" '
            f'transform="rotate(-30 {cx:.1f} {ly:.1f})">{_e(group)}</text>'
        )
    for s, name in enumerate(series):
        y = legend_top + 20 * s
        parts.append(
            f'<rect x="{left:.1f}" y="{y - 10:.1f}" width="12" height="12" '
            f'fill="{PALETTE[s % len(PALETTE)]}"/>'
        )
        parts.append(f'<text x="{left + 18:.1f}" y="{y:.1f}">{_e(name)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def _ci(low: float | None, high: float | None) -> str:
    return "n/a" if low is None or high is None else f"[{low:.3f}, {high:.3f}]"


def _interval_table(reports: Mapping[str, EvalReport], capabilities: Sequence[str]) -> str:
    """Success per capability and overall, each with its 95% Wilson interval and task count."""
    names = list(reports)
    rows = []
    for capability in [*capabilities, "overall"]:
        cells = []
        for report in reports.values():
            envs = report.envs
            if envs is None:
                cells.append("n/a")
            elif capability == "overall":
                cells.append(format_rate(envs.success_overall, envs.success_overall_ci))
            elif capability in envs.capabilities:
                result = envs.capabilities[capability]
                cells.append(f"{format_rate(result.success, result.success_ci)} of {result.n_tasks}")
            else:
                cells.append("n/a")
        rows.append(f"<tr><td>{_e(capability)}</td>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    return (
        "<table><tr><th>capability</th>" + "".join(f"<th>{_e(n)}</th>" for n in names) + "</tr>"
        + "".join(rows) + "</table>"
    )


MORE_TEST_TASKS = ("evaluate more test tasks per capability (params.yaml evaluate.limit, or "
                   "<code>traceops evaluate --full</code>)")
MORE_REQUESTS = ("hold out more logged requests with a reference (params.yaml evaluate.requests: "
                 "heldout_fraction, limit, references)")


def _comparison_section(comparisons: Mapping[str, Mapping[str, Any]], column: str = "capability",
                        more: str = MORE_TEST_TASKS) -> str:
    """Each paired comparison (``stage.comparisons``): the difference per capability (``column``; a
    domain for the real requests) and overall with its paired bootstrap interval, and whether the
    interval is too wide to conclude (then what to do: ``more``)."""
    if not comparisons:
        return "<p>No paired comparison (the composite, base or champion was not evaluated).</p>"
    parts = []
    for title, reg in comparisons.items():
        rows = [(c, r) for c, r in sorted(reg.get("capabilities", {}).items())]
        if reg.get("overall"):
            rows.append(("overall", reg["overall"]))
        body = "".join(
            f"<tr><td>{_e(c)}</td><td>{_e(r.get('tasks', 'n/a'))}</td>"
            f"<td>{_e(format_gain(r.get('delta'), r.get('low'), r.get('high')))}</td>"
            f'<td class="{_verdict_css(r)}">{_e(verdict(r.get("low"), r.get("high")))}</td></tr>'
            for c, r in rows
        )
        wide = [c for c, r in rows if verdict(r.get("low"), r.get("high")) == "too wide to conclude"]
        note = (
            f'<p class="wide">Too few tasks to tell {_e(title)} apart on: {_e(", ".join(wide))}; '
            f"{more} before reading a winner into these numbers.</p>"
            if wide
            else ""
        )
        parts.append(
            f"<h3>{_e(title)}</h3><table><tr><th>{_e(column)}</th><th>paired tasks</th>"
            f"<th>difference [95% interval]</th><th>verdict</th></tr>{body}</table>{note}"
        )
    method = next(iter(comparisons.values())).get("interval") or {}
    parts.append(
        f"<p>Intervals: {_e(method.get('method', 'paired bootstrap'))}, "
        f"{_e(method.get('resamples', 'n/a'))} resamples, seed {_e(method.get('seed', 'n/a'))}.</p>"
    )
    return "".join(parts)


def _requests_section(reports: Mapping[str, EvalReport],
                      comparisons: Mapping[str, Mapping[str, Any]]) -> str:
    """Success on the held-out real requests per domain and model (95% Wilson interval, graded count),
    the grader of each domain, what was not replayed and why, grader failures, and the paired
    comparisons on the same requests (``stage.request_comparisons``)."""
    evaluated = {name: r.requests for name, r in reports.items() if r.requests is not None}
    if not evaluated:
        return "<p>Held-out real requests were not evaluated.</p>"
    domains = sorted({d for e in evaluated.values() for d in e.domains})
    rows = []
    for domain in [*domains, "overall"]:
        cells = []
        for requests in evaluated.values():
            if domain == "overall":
                cells.append(format_rate(requests.success_overall, requests.success_overall_ci))
            elif domain in requests.domains:
                rate = format_rate(requests.success(domain), requests.success_ci(domain))
                cells.append(f"{rate} of {requests.graded(domain)}")
            else:
                cells.append("n/a")
        rows.append(f"<tr><td>{_e(domain)}</td>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    table = ("<table><tr><th>domain</th>" + "".join(f"<th>{_e(n)}</th>" for n in evaluated) + "</tr>"
             + "".join(rows) + "</table>")
    first = next(iter(evaluated.values()))
    graders = ", ".join(f"{d}: {g}" for d, g in sorted(first.graders.items())) or "n/a"
    skipped = "; ".join(f"{n} {reason}" for reason, n in first.skipped.items()) or "none"
    problems = {name: len(e.problems) for name, e in evaluated.items() if e.problems}
    failing = (f"<p class=\"fail\">Grader failures (recorded, not scored): "
               f"{_e(', '.join(f'{n}: {c}' for n, c in problems.items()))}; see eval.json.</p>"
               if problems else "")
    return (f"{table}<p>Graders: {_e(graders)}. Not replayed: {_e(skipped)}.</p>{failing}"
            + _comparison_section(comparisons, column="domain", more=MORE_REQUESTS))


def _verdict_css(row: Mapping[str, Any]) -> str:
    return {"better": "pass", "worse": "fail"}.get(verdict(row.get("low"), row.get("high")), "wide")


def _summary_table(reports: Mapping[str, EvalReport]) -> str:
    head = (
        "model",
        "model id",
        "success (macro)",
        "95% interval",
        "success (micro)",
        "pass^k",
        "k",
        "mean reward",
        "re-failure",
        "repeat-failure",
        "replayed",
        "not replayable",
        "skipped capabilities",
    )
    rows = []
    for name, report in reports.items():
        row = report.to_dict()
        skipped = ", ".join(sorted(report.envs.skipped)) if report.envs else ""
        cells = (
            name,
            report.model_id,
            _fmt(row["success.overall"]),
            _ci(row["success.overall.low"], row["success.overall.high"]),
            _fmt(row["success.micro"]),
            _fmt(row["pass_k"]),
            row["k"] if row["k"] is not None else "n/a",
            _fmt(row["mean_reward.overall"]),
            _fmt(row["refailure_rate"]),
            _fmt(row["repeat_failure_rate"]),
            row["replay.replayed"] if row["replay.replayed"] is not None else "n/a",
            row["replay.not_replayable"] if row["replay.not_replayable"] is not None else "n/a",
            skipped or "-",
        )
        rows.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    return "<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>" + "".join(rows) + "</table>"


def _regression_table(reports: Mapping[str, EvalReport]) -> str:
    rows = []
    for name, report in reports.items():
        reg = report.regression
        if not reg or not reg.get("capabilities"):
            continue
        for capability, row in sorted(reg["capabilities"].items()):
            delta = row["delta"]
            css = "fail" if delta is not None and delta < 0 else "pass"
            rows.append(
                f"<tr><td>{_e(name)}</td><td>{_e(capability)}</td><td>{_fmt(row['champion'])}</td>"
                f'<td>{_fmt(row["candidate"])}</td><td class="{css}">{_fmt(delta)}</td>'
                f"<td>{_ci(row.get('low'), row.get('high'))}</td></tr>"
            )
    if not rows:
        return "<p>No champion to compare with.</p>"
    return (
        "<table><tr><th>model</th><th>capability</th><th>champion</th><th>candidate</th><th>delta</th>"
        "<th>95% paired interval</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def _decision_section(decision: Any) -> str:
    data = decision.to_dict() if hasattr(decision, "to_dict") else dict(decision)
    verdict = "promoted to" if data["promote"] else "kept as"
    css = "pass" if data["promote"] else "fail"
    reasons = "".join(f"<li>{_e(r)}</li>" for r in data.get("reasons", []))
    checks = "".join(
        f'<tr><td>{_e(name)}</td><td class="{"pass" if c["passed"] else "fail"}">'
        f"{'passed' if c['passed'] else ('too small to conclude' if c.get('inconclusive') else 'failed')}"
        f"</td><td>{_e(_fmt(c.get('value')))}</td>"
        f"<td>{_e(_fmt(c.get('threshold')))}</td></tr>"
        for name, c in data.get("checks", {}).items()
    )
    return (
        f'<h2>Promotion</h2><p class="{css}">Candidate {verdict} <b>{_e(data["alias"])}</b>.</p>'
        f"<ul>{reasons}</ul><table><tr><th>check</th><th>result</th><th>value</th><th>threshold</th></tr>"
        f"{checks}</table>"
    )


def render_eval_html(
    reports: Mapping[str, EvalReport],
    out: str | Path,
    decision: Any = None,
    title: str = "traceops evaluation",
    comparisons: Mapping[str, Mapping[str, Any]] | None = None,
    request_comparisons: Mapping[str, Mapping[str, Any]] | None = None,
    not_evaluated: Mapping[str, str] | None = None,
) -> Path:
    """Write the comparison page of ``reports`` (name -> report, in display order) to ``out``.

    Charts: success per capability per model (plus the macro overall), and the re-failure and
    repeat-failure rates of the logged failures per model (before: the base model; after: each trained
    model). Tables: success with 95% Wilson intervals, and ``comparisons`` (``stage.comparisons``:
    composite vs champion and vs base on the same tasks) with paired bootstrap intervals, saying where
    an interval is too wide to conclude; the held-out real requests per domain beside them, with
    ``request_comparisons`` (``stage.request_comparisons``). ``decision`` (a ``promote.Decision``) adds
    the promotion verdict, reasons and checks. ``not_evaluated`` (capability -> why) lists the
    environments no model was scored on tonight (``stage.scored_capabilities``).
    """
    names = list(reports)
    capabilities = sorted({c for r in reports.values() for c in r.success})
    groups = [*capabilities, "overall"]
    success: dict[tuple[str, str], float | None] = {}
    for name, report in reports.items():
        for capability in capabilities:
            success[(capability, name)] = report.success.get(capability)
        success[("overall", name)] = report.success_overall
    replay_groups = ["re-failure", "repeat-failure (same gap)"]
    replay: dict[tuple[str, str], float | None] = {}
    for name, report in reports.items():
        replay[(replay_groups[0], name)] = report.refailure_rate
        replay[(replay_groups[1], name)] = report.repeat_failure_rate
    body = [
        f"<h1>{_e(title)}</h1>",
        "<h2>Held-out environments</h2>",
        grouped_bars(groups, names, success, "success rate per capability"),
        *([f"<p>Not evaluated: {_e(c)}: {_e(why)}.</p>" for c, why in sorted((not_evaluated or {}).items())]),
        "<h2>Logged failures, replayed</h2>",
        grouped_bars(replay_groups, names, replay, "re-failure and repeat-failure rate (lower is better)"),
        "<h2>Success with 95% Wilson intervals</h2>",
        _interval_table(reports, capabilities),
        "<h2>Paired comparisons on the same tasks</h2>",
        _comparison_section(comparisons or {}),
        "<h2>Held-out real requests (logged, never trained on)</h2>",
        _requests_section(reports, request_comparisons or {}),
        "<h2>Summary</h2>",
        _summary_table(reports),
        "<h2>Regression against the champion</h2>",
        _regression_table(reports),
    ]
    if decision is not None:
        body.append(_decision_section(decision))
    page = (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path
