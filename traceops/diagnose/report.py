"""The self-contained HTML report: gap table, Δ bars with CI whiskers, cluster map, decisive-step examples.

No external JS or CSS; charts are inline SVG. Every string from the logs goes through ``html.escape``.
"""

from __future__ import annotations

import html
import math
from typing import Any

from traceops.diagnose.run import Diagnosis
from traceops.diagnose.selection import Selection

PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)
CSS = """
body{font-family:system-ui,sans-serif;margin:2rem;color:#222;max-width:1100px}
h1{font-size:1.5rem}h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9rem}
td,th{border:1px solid #ddd;padding:.25rem .5rem;text-align:left}
tr.sel{background:#eef6ee}.warn{background:#fff4e5;padding:.5rem;border-left:4px solid #f28e2b}
.msg{font-family:monospace;font-size:.8rem;white-space:pre-wrap;padding:.2rem .4rem;margin:0}
.decisive{background:#fde2e2;border-left:4px solid #e15759}
.ex{margin:1rem 0;padding:.5rem;border:1px solid #eee}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}g}" if abs(value) < 1e-3 and value != 0 else f"{value:.{digits}f}"


def gap_table(d: Diagnosis, selection: Selection | None = None, table_id: str = "gap-table") -> str:
    """The table of every scored capability, selected ones first (``selection``: default the night's)."""
    rows = [
        "<tr><th>capability</th><th>selected</th><th>Cov</th><th>Δ</th><th>CI</th><th>p</th>"
        "<th>K/N</th><th>lacking in failures</th><th>lacking in successes</th></tr>"
    ]
    for s in (selection or d.selection).scores:
        ci = f"[{_fmt(s.ci[0])}, {_fmt(s.ci[1])}]" if s.ci else "–"
        mark = ("for " + ", ".join(s.selected_for)) if s.selected_for else "yes"
        rows.append(
            f'<tr class="{"sel" if s.selected else ""}"><td>{_e(s.capability)}</td>'
            f"<td>{_e(mark) if s.selected else ''}</td><td>{_fmt(s.coverage)}</td><td>{_fmt(s.delta)}</td>"
            f"<td>{ci}</td><td>{_fmt(s.p_value)}</td>"
            f"<td>{s.stable_runs}/{s.n_runs}</td><td>{s.lacking_failures}/{s.n_failures}</td>"
            f"<td>{s.lacking_successes}/{s.n_successes}</td></tr>"
        )
    return f'<table id="{table_id}">' + "".join(rows) + "</table>"


def agent_tables(d: Diagnosis) -> str:
    """One gap table per agent when the logs hold several (each agent is selected on its own)."""
    out = []
    for i, (agent, sel) in enumerate(d.selection.by_agent.items()):
        chosen = ", ".join(_e(c) for c in sel.selected) or "none"
        out.append(f"<h3>{_e(agent)}</h3><p>Mode: {_e(sel.mode)}. Selected: <b>{chosen}</b></p>"
                   f"{gap_table(d, sel, f'gap-table-agent-{i}')}")
    return "".join(out)


def delta_chart(d: Diagnosis, width: int = 640, bar: int = 22) -> str:
    """Horizontal bars of Δ per capability with CI whiskers and the δ threshold as a dashed line."""
    scores = d.selection.scores
    values = [v for s in scores for v in ((s.delta or 0.0), *(s.ci or ()))] + [
        d.params.selection.delta_min,
        0.0,
    ]
    lo, hi = min(min(values), 0.0), max(max(values), 0.0)
    span = (hi - lo) or 1.0
    left, plot = 180, width - 200
    height = bar * len(scores) + 40

    def x(v: float) -> float:
        return left + (v - lo) / span * plot

    parts = [
        f'<svg id="delta-chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img" aria-label="contrastive gap per capability">'
    ]
    for i, s in enumerate(scores):
        y = 10 + i * bar
        v = s.delta if s.delta is not None else 0.0
        x0, x1 = sorted((x(0.0), x(v)))
        color = "#59a14f" if s.selected else "#bab0ac"
        parts.append(
            f'<text x="{left - 6}" y="{y + 14}" font-size="12" text-anchor="end">{_e(s.capability)}</text>'
        )
        parts.append(
            f'<rect x="{x0:.1f}" y="{y + 3}" width="{max(x1 - x0, 0.5):.1f}" height="{bar - 8}" '
            f'fill="{color}"><title>{_e(s.capability)} Δ={_fmt(s.delta)}</title></rect>'
        )
        if s.ci:
            a, b = x(s.ci[0]), x(s.ci[1])
            mid = y + bar / 2 - 1
            parts.append(
                f'<line class="whisker" x1="{a:.1f}" y1="{mid:.1f}" x2="{b:.1f}" y2="{mid:.1f}" '
                f'stroke="#222"/><line x1="{a:.1f}" y1="{mid - 4:.1f}" x2="{a:.1f}" y2="{mid + 4:.1f}" '
                f'stroke="#222"/><line x1="{b:.1f}" y1="{mid - 4:.1f}" x2="{b:.1f}" y2="{mid + 4:.1f}" '
                'stroke="#222"/>'
            )
    base = 10 + len(scores) * bar
    parts.append(f'<line x1="{x(0):.1f}" y1="5" x2="{x(0):.1f}" y2="{base}" stroke="#666"/>')
    dm = d.params.selection.delta_min
    parts.append(
        f'<line x1="{x(dm):.1f}" y1="5" x2="{x(dm):.1f}" y2="{base}" stroke="#e15759" '
        f'stroke-dasharray="4 3"/><text x="{x(dm):.1f}" y="{base + 16}" font-size="11" '
        f'text-anchor="middle">δ={dm}</text>'
    )
    parts.append(
        f'<text x="{x(lo):.1f}" y="{base + 16}" font-size="11">{_fmt(lo, 2)}</text>'
        f'<text x="{x(hi):.1f}" y="{base + 16}" font-size="11" text-anchor="end">{_fmt(hi, 2)}</text>'
    )
    return "".join(parts) + "</svg>"


def cluster_map(d: Diagnosis, size: int = 420) -> str:
    """A scatter of failure segments in 2-D, coloured by cluster (noise grey)."""
    c = d.clustering
    if c is None or c.points.empty:
        return "<p>No cluster map: too few failure segments.</p>"
    xs, ys = c.points["x"].astype(float), c.points["y"].astype(float)
    x0, x1, y0, y1 = xs.min(), xs.max(), ys.min(), ys.max()
    sx, sy = (x1 - x0) or 1.0, (y1 - y0) or 1.0
    parts = [
        f'<svg id="cluster-map" xmlns="http://www.w3.org/2000/svg" width="{size}" height="{size}" '
        f'role="img" aria-label="failure segment clusters">'
        f'<rect width="{size}" height="{size}" fill="#fafafa" stroke="#ddd"/>'
    ]
    for row in c.points.itertuples():
        px = 10 + (row.x - x0) / sx * (size - 20)
        py = size - 10 - (row.y - y0) / sy * (size - 20)
        color = "#ccc" if row.cluster < 0 else PALETTE[int(row.cluster) % len(PALETTE)]
        parts.append(
            f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="{color}" fill-opacity="0.8">'
            f"<title>cluster {int(row.cluster)} · {_e(row.detector)}</title></circle>"
        )
    return "".join(parts) + "</svg>"


def cluster_table(d: Diagnosis) -> str:
    """Cluster sizes, names, dominant capability, silhouette and coverage by a family."""
    c = d.clustering
    if c is None or c.clusters.empty:
        return ""
    rows = [
        "<tr><th></th><th>cluster</th><th>size</th><th>name</th><th>dominant capability</th>"
        "<th>share</th><th>silhouette</th><th>covered by a family</th></tr>"
    ]
    for r in c.clusters.to_dict(orient="records"):
        color = "#ccc" if r["cluster"] < 0 else PALETTE[int(r["cluster"]) % len(PALETTE)]
        rows.append(
            f'<tr><td><svg width="12" height="12"><rect width="12" height="12" fill="{color}"/></svg></td>'
            f"<td>{r['cluster']}</td><td>{r['size']}</td><td>{_e(r['name'])}</td>"
            f"<td>{_e(r['dominant_capability'])}</td><td>{_fmt(r['capability_share'], 2)}</td>"
            f"<td>{_fmt(r['silhouette'])}</td><td>{'yes' if r['covered'] else 'no'}</td></tr>"
        )
    info = (
        f"<p>backend {_e(c.backend)}, silhouette {_fmt(c.silhouette)}, noise share {_fmt(c.noise_share)}, "
        f"Great Expectations suite: {'passed' if c.valid else 'not run' if c.valid is None else 'FAILED'}</p>"
    )
    return info + '<table id="cluster-table">' + "".join(rows) + "</table>"


def examples(d: Diagnosis) -> str:
    """Example failures per capability, the decisive step highlighted."""
    out = []
    order = d.selected + sorted(set(d.examples) - set(d.selected))
    for cap in order:
        for ex in d.examples.get(cap, []):
            msgs = "".join(
                f'<pre class="msg{" decisive" if m["decisive"] else ""}">[{m["step"]}] {_e(m["text"])}</pre>'
                for m in ex["messages"]
            )
            out.append(
                f'<div class="ex"><b>{_e(cap)}</b> · task {_e(ex["task_id"])} · step {_e(ex["step"])} · '
                f"confidence {_fmt(ex['confidence'], 2)}<br><i>{_e(ex['evidence'])}</i>{msgs}</div>"
            )
    return "".join(out) or "<p>No attributed failures.</p>"


def render_report(d: Diagnosis) -> str:
    """The whole page as one string."""
    counts = ", ".join(f"{_e(k)} {v}" for k, v in d.counts.items())
    warns = "".join(f'<p class="warn">{_e(w)}</p>' for w in d.warnings)
    selected = ", ".join(_e(c) for c in d.selected) or "none"
    cands = "".join(
        f"<li>{_e(c['id'])}: cluster {c['cluster']}, {c['size']} failures, terms "
        f"{_e(', '.join(c['top_terms']))}</li>"
        for c in (d.clustering.candidates if d.clustering else [])
    )
    by_cap: dict[str, int] = {}
    for a in d.attributions:
        by_cap[a.capability or "unattributed"] = by_cap.get(a.capability or "unattributed", 0) + 1
    att_rows = "".join(
        f"<tr><td>{_e(k)}</td><td>{v}</td></tr>" for k, v in sorted(by_cap.items(), key=lambda x: -x[1])
    )
    by_agent = f'<h2 id="agents">By agent</h2>{agent_tables(d)}' if d.selection.by_agent else ""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>traceops diagnosis</title>'
        f"<style>{CSS}</style></head><body>"
        f"<h1>traceops diagnosis</h1><p>{counts}. Mode: {_e(d.selection.mode)}. Seed {d.seed}.</p>"
        f"<p>Selected capabilities: <b>{selected}</b></p>{warns}"
        f'<h2 id="gaps">Capability gaps</h2>{gap_table(d)}'
        f"{by_agent}"
        f'<h2 id="delta">Contrastive gap Δ with {int(d.params.selection.ci_level * 100)}% CI</h2>'
        f"{delta_chart(d)}"
        f'<h2 id="clusters">Failure clusters</h2>{cluster_map(d)}{cluster_table(d)}'
        f'<h2 id="candidates">Candidate capabilities</h2>'
        f"{'<ul>' + cands + '</ul>' if cands else '<p>None.</p>'}"
        f'<h2 id="attribution">Decisive steps by capability</h2><table>{att_rows}</table>'
        f'<h2 id="examples">Examples</h2>{examples(d)}'
        "</body></html>"
    )
