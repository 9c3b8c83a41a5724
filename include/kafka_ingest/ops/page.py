"""The pipelines page of the Airflow UI, as HTML: every pipeline at a glance, and one in
detail. Plain functions of a :class:`kafka_ingest.ops.observe.Snapshot` and a few reads
of the database (the monitor's recorded checks, the dead letters); the Airflow plugin
(``plugins/kafka_ingest_ui.py``) serves them behind Airflow's authentication.

Each figure is coloured by the alert rule that judges it (the monitor DAG's rules, judged
now): red when breached, green when not, grey when it cannot be judged (Kafka or the
database out of reach). Charts are inline SVG: no external asset, nothing the page fetches
from elsewhere. No connection setting, DSN or credential is ever on it.

Links to Airflow's own pages (``data-airflow``) must move the whole UI, not the frame the
UI shows this page in, and that frame's sandbox forbids navigating the top window. The
page's one script therefore hands such a link to the UI's router (``history.pushState``
on the top window, then a ``popstate`` event, as a click inside the UI does); opened on
its own, outside the UI, the links are plain links.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any
from urllib.parse import quote

from kafka_ingest.db.observations import LetterLooks, MonitorChecksRepository, RecordedCheck
from kafka_ingest.ops.lag import LagRow
from kafka_ingest.ops.observe import PipelineView, Snapshot
from kafka_ingest.ops.rules import colouring, judged

#: How far back the charts look.
HISTORY_HOURS = 24
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")


def history(conn: Any, pipelines: Sequence[str], *,
            hours: int = HISTORY_HOURS) -> dict[str, list[RecordedCheck]]:
    """The monitor's checks of the last ``hours`` per pipeline, oldest first."""
    return MonitorChecksRepository(conn).history(pipelines, hours=hours)


def letters(conn: Any, pipeline: str) -> list[dict[str, Any]]:
    """The pipeline's dead letters by reason and status, newest failure first."""
    rows = [{"reason": r["error_class"], "status": r["status"], "count": int(r["n"]),
             "last": r["last"]} for r in LetterLooks(conn).counts(pipeline)]
    return sorted(rows, key=lambda r: r["last"].timestamp() if r["last"] else 0.0,
                  reverse=True)


# --------------------------------------------------------------------------- pieces


def _state(view: PipelineView, figure: str) -> str:
    """``bad`` if a rule that judges ``figure`` (:func:`~kafka_ingest.ops.rules.colouring`)
    is breached now, ``unknown`` if they cannot be judged, else ``ok`` (CSS classes)."""
    rules = set(colouring(figure))
    judgeable = {r.name for r in judged(lag_known=view.total_lag is not None)}
    if view.result is None or not rules <= judgeable:
        return "unknown"
    return "bad" if view.breached & rules else "ok"


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    s = int(seconds)
    return (f"{s} s ago" if s < 120 else f"{s // 60} min ago" if s < 7200
            else f"{s // 3600} h ago" if s < 172_800 else f"{s // 86400} days ago")


def _stamp(at: datetime | None) -> str:
    return "" if at is None else f"{at.astimezone(UTC):%Y-%m-%d %H:%M}Z"


def _number(n: int | None) -> str:
    return "?" if n is None else f"{n:,}"


def sparkline(values: Sequence[float], *, width: int = 120, height: int = 28,
              color: str = "#1f77b4") -> str:
    """A small SVG line of ``values`` (empty when fewer than two)."""
    if len(values) < 2:
        return '<span class="muted">no trend yet</span>'
    top = max(values) or 1.0
    step = width / (len(values) - 1)
    points = " ".join(f"{i * step:.1f},{height - 2 - (v / top) * (height - 4):.1f}"
                      for i, v in enumerate(values))
    return (f'<svg class="spark" width="{width}" height="{height}" role="img" '
            f'aria-label="lag trend"><polyline fill="none" stroke="{color}" '
            f'stroke-width="1.5" points="{points}"/></svg>')


def chart(checks: Sequence[RecordedCheck], *, width: int = 760, height: int = 240) -> str:
    """The lag of each partition over time, one line each, as SVG with axes and a legend."""
    parts = sorted({p for c in checks for p in c.partition_lags})
    if len(checks) < 2 or not parts:
        return ('<p class="muted" id="lag-chart-empty">No lag history yet: the monitor DAG '
                '(kafka_ingest_monitor) records one check every 5 minutes.</p>')
    left, bottom, right, top_pad = 56, 28, 12, 10
    t0, t1 = checks[0].at.timestamp(), checks[-1].at.timestamp()
    span = max(t1 - t0, 1.0)
    peak = max(max(c.partition_lags.values(), default=0) for c in checks) or 1
    w, h = width - left - right, height - bottom - top_pad

    def xy(c: RecordedCheck, p: int) -> str:
        x = left + (c.at.timestamp() - t0) / span * w
        y = top_pad + h - c.partition_lags.get(p, 0) / peak * h
        return f"{x:.1f},{y:.1f}"

    lines = [f'<polyline fill="none" stroke="{PALETTE[i % len(PALETTE)]}" stroke-width="2" '
             f'data-partition="{p}" points="{" ".join(xy(c, p) for c in checks)}"/>'
             for i, p in enumerate(parts)]
    legend = "".join(f'<span class="key" style="color:{PALETTE[i % len(PALETTE)]}">&#9632;'
                     f'</span> partition {p} ' for i, p in enumerate(parts))
    fmt = "%H:%M" if span >= 3600 else "%H:%M:%S"
    axes = (f'<line x1="{left}" y1="{top_pad + h}" x2="{left + w}" y2="{top_pad + h}" '
            f'stroke="#999"/><line x1="{left}" y1="{top_pad}" x2="{left}" '
            f'y2="{top_pad + h}" stroke="#999"/>'
            f'<text x="{left - 6}" y="{top_pad + 10}" text-anchor="end">{peak:,}</text>'
            f'<text x="{left - 6}" y="{top_pad + h}" text-anchor="end">0</text>'
            f'<text x="{left}" y="{height - 8}">{checks[0].at.astimezone(UTC):{fmt}}Z</text>'
            f'<text x="{left + w}" y="{height - 8}" text-anchor="end">'
            f'{checks[-1].at.astimezone(UTC):{fmt}}Z</text>')
    return (f'<svg id="lag-chart" width="{width}" height="{height}" role="img" '
            f'aria-label="lag per partition over time">{axes}{"".join(lines)}</svg>'
            f'<div class="legend">{legend}</div>')


# --------------------------------------------------------------------------- pages

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:16px;color:#222}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:20px 0 6px}
table{border-collapse:collapse;margin-top:8px} th,td{padding:6px 10px;text-align:left;
border-bottom:1px solid #e3e3e3;vertical-align:middle} th{font-size:12px;color:#555}
td.ok{background:#c8e6c9} td.bad{background:#ef9a9a;font-weight:600}
td.unknown{background:#eeeeee;color:#555} .muted{color:#777;font-size:12px}
.badge{display:inline-block;padding:2px 8px;border-radius:10px;font-size:12px;color:#fff}
.badge.ok{background:#2e7d32} .badge.bad{background:#c62828} .badge.unknown{background:#757575}
.breach{color:#b71c1c;margin:2px 0} a{color:#1565c0} .legend{font-size:12px}
svg text{font-size:11px;fill:#555} code{background:#f5f5f5;padding:1px 4px}
"""


_SCRIPT = """
document.addEventListener("click", function (e) {
  var a = e.target.closest && e.target.closest("a[data-airflow]");
  if (!a || window.top === window || e.ctrlKey || e.metaKey || e.shiftKey) return;
  try {
    window.top.history.pushState({}, "", a.getAttribute("href"));
    window.top.dispatchEvent(new PopStateEvent("popstate", {state: {}}));
    e.preventDefault();
  } catch (err) { /* another origin: let the browser follow the link */ }
});
"""


def _document(title: str, body: str) -> str:
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<title>{escape(title)}</title><style>{_STYLE}</style></head>'
            f'<body>{body}<script>{_SCRIPT}</script></body></html>')


def _cell(view: PipelineView, text: str, figure: str) -> str:
    return f'<td class="{_state(view, figure)}" data-figure="{figure}">{text}</td>'


def _airflow_link(href: str, text: str, attrs: str = "") -> str:
    """A link to a page of the Airflow UI (see the module's text: ``data-airflow``)."""
    return f'<a data-airflow target="_top" {attrs} href="{escape(href)}">{escape(text)}</a>'


def _badge(state: str) -> str:
    label = {"ok": "healthy", "bad": "alert", "unknown": "unknown"}[state]
    return f'<span class="badge {state}" data-state="{state}">{label}</span>'


def _overall(view: PipelineView) -> str:
    if view.result is None:
        return "unknown"
    return "bad" if view.breached else "unknown" if view.total_lag is None else "ok"


def _last_run(view: PipelineView, airflow: str) -> str:
    dag = f"{view.name}_ingest"
    runs = f'{airflow}/dags/{quote(dag)}/runs'
    if view.outcome is None:
        return _airflow_link(runs, "runs")
    o = view.outcome
    cls = "ok" if o.succeeded else "bad"
    return (f'<span class="badge {cls}">{escape(o.state)}</span> '
            + _airflow_link(f"{runs}/{quote(o.run_id)}", o.run_id))


def overview(snap: Snapshot, checks: Mapping[str, Sequence[RecordedCheck]], *, airflow: str,
             here: str, now: float) -> str:
    """Every pipeline at a glance. ``airflow``: the Airflow UI's root path (links);
    ``here``: this page's path (links to the detail pages)."""
    rows = []
    for v in snap.views:
        f = None if v.result is None else v.result.figures
        stale = None if f is None or f.last_live_commit is None else (
            now - f.last_live_commit.timestamp())
        rate = None if f is None else f.dlq_rate
        trend = sparkline([c.total_lag for c in checks.get(v.name, ())])
        state = _overall(v)
        rows.append(
            f'<tr data-pipeline="{escape(v.name)}">'
            f'<td><a href="{escape(here)}/{quote(v.name)}">{escape(v.name)}</a><br>'
            f'<span class="muted">{escape(v.pipeline.topic)} &rarr; '
            f'{escape(v.pipeline.table)}</span></td>'
            f'<td>{_badge(state)}</td>'
            + _cell(v, _number(v.total_lag)
                    + ("" if v.lag_error is None else
                       f'<br><span class="muted">{escape(v.lag_error[:160])}</span>'), "lag")
            + _cell(v, trend, "trend")
            + _cell(v, "&ndash;" if rate is None else f"{rate:.2%}", "dlq")
            + _cell(v, _ago(stale), "freshness")
            + _cell(v, "?" if f is None else f"{f.parked:,}", "parked")
            + f"<td>{_last_run(v, airflow)}</td></tr>")
    down = [f"{c} ({n})" for (c, n), ok in sorted(snap.up.items()) if not ok]
    warning = ("" if not down else
               f'<p class="breach">Out of reach: {escape(", ".join(down))}</p>')
    body = (f"<h1>Kafka ingest pipelines</h1><p class=\"muted\">{len(snap.views)} pipelines, "
            f"looked at {datetime.fromtimestamp(snap.taken_at, UTC):%Y-%m-%d %H:%M:%S}Z in "
            f"{snap.seconds:.2f} s; colours are the monitor's alert rules judged now</p>"
            f"{warning}<table id=\"pipelines\"><tr><th>pipeline</th><th>health</th>"
            "<th>lag (messages)</th><th>lag trend</th><th>DLQ rate</th>"
            "<th>last live chunk</th><th>parked letters</th><th>last run</th></tr>"
            f"{''.join(rows)}</table>")
    return _document("Kafka ingest pipelines", body)


def detail(view: PipelineView, checks: Sequence[RecordedCheck], dead: Sequence[Mapping[str, Any]],
           *, airflow: str, back: str, now: float) -> str:
    """One pipeline: its breaches, its partitions, the lag per partition over time, its
    dead letters by reason with a replay link each, and its DAGs."""
    p, name = view.pipeline, view.name
    ingest, replay = f"{name}_ingest", f"{name}_dlq_replay"
    breaches = ("" if view.result is None else "".join(
        f'<p class="breach" data-rule="{escape(b.rule)}">{escape(b.message)}</p>'
        for b in view.result.breaches))
    parts = "".join(
        f'<tr><td>{r.partition}</td><td>{_number(r.stored_offset)}</td>'
        f'<td>{_number(r.high)}</td><td class="{_state(view, "lag")}">'
        f'{_number(max(0, r.lag))}</td><td>{_number(r.group_lag)}</td>'
        f'<td>{_oldest(view, r, now)}</td></tr>' for r in view.lag_rows or ())
    if view.lag_rows is None:
        parts = f'<tr><td colspan="6" class="unknown">{escape(view.lag_error or "")}</td></tr>'
    letter_rows = "".join(
        f'<tr data-reason="{escape(d["reason"])}"><td>{escape(d["reason"])}</td>'
        f'<td>{escape(d["status"])}</td><td>{d["count"]:,}</td>'
        f'<td>{_stamp(d["last"])}</td>'
        f'<td>{_replay_link(airflow, replay, d["reason"]) if d["status"] == "parked" else ""}'
        f'</td></tr>' for d in dead) or '<tr><td colspan="5" class="muted">none</td></tr>'
    body = (
        f'<p><a href="{escape(back)}">&larr; all pipelines</a></p>'
        f'<h1>{escape(name)} {_badge(_overall(view))}</h1>'
        f'<p class="muted">{escape(p.topic)} &rarr; {escape(p.table)}; '
        + _airflow_link(f"{airflow}/dags/{quote(ingest)}/runs", f"{ingest} runs",
                        'id="ingest-runs"') + " &middot; "
        + _airflow_link(f"{airflow}/dags/{quote(replay)}", replay, 'id="replay-dag"')
        + " &middot; "
        f'last run: {_last_run(view, airflow)}</p>{breaches}'
        f"<h2>Lag per partition, last {HISTORY_HOURS} h</h2>{chart(checks)}"
        '<h2>Partitions now</h2><table id="partitions"><tr><th>partition</th>'
        "<th>stored offset</th><th>high watermark</th><th>lag</th><th>group lag</th>"
        f"<th>oldest unread</th></tr>{parts}</table>"
        '<h2>Dead letters by reason</h2><table id="letters"><tr><th>reason</th>'
        "<th>status</th><th>letters</th><th>last failed</th><th>replay</th></tr>"
        f"{letter_rows}</table>")
    return _document(f"{name}: Kafka ingest", body)


def _oldest(view: PipelineView, row: LagRow, now: float) -> str:
    since = view.oldest_unread.get(row.partition)
    return "&ndash;" if row.lag <= 0 or since is None else _ago(now - since)


def replay_conf(reason: str) -> dict[str, Any]:
    """The replay DAG's conf that re-validates one reason's parked letters, as a dry run
    first (the form's defaults fill in the rest)."""
    return {"error_classes": [reason], "dry_run": True}


def _replay_link(airflow: str, dag_id: str, reason: str) -> str:
    conf = json.dumps(replay_conf(reason))
    return (_airflow_link(f"{airflow}/dags/{quote(dag_id)}", f"replay {reason}",
                          'class="replay"') + f' <code class="conf">{escape(conf)}</code>')
