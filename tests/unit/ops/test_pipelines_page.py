"""The pipelines page without services: the overview and the detail page rendered from
snapshots built by hand, then parsed (the standard library's HTML parser) and read the way
a browser would: cells' classes, badges' states, links, the chart's lines, the replay
conf. Every name that comes from the pipelines file, Kafka or the database is escaped."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from typing import Any
from urllib.parse import unquote

from kafka_ingest.config import Pipeline, parse_pipelines
from kafka_ingest.db import RecordedCheck as Check
from kafka_ingest.ops.lag import LagRow, total_lag
from kafka_ingest.ops.monitor import CheckResult, Figures, evaluate
from kafka_ingest.ops.observe import PipelineView, RunOutcome, Snapshot
from kafka_ingest.ops.page import chart, detail, overview, sparkline

BODY: dict[str, Any] = {
    "topic": "orders-in",
    "contract": {"event_type": "metric_event", "version": 2},
    "table": "orders_rows",
    "dlq_topic": "orders-in-dlq",
    # connections the page must never reveal anything of
    "kafka_conn_id": "kafka_prod_sasl",
    "postgres_conn_id": "warehouse_writer",
}
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
T = NOW.timestamp()
AIRFLOW = "/airflow"
HERE = "/kafka-ingest/pipelines"
XSS = "<script>alert(1)</script>"


# --------------------------------------------------------------------------- parsing


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    parts: list[str] = field(default_factory=list)
    #: Its place in :attr:`Page.elements`, and the place after its last descendant.
    index: int = 0
    end: int = 0

    @property
    def text(self) -> str:
        return "".join(self.parts)


class Page(HTMLParser):
    """Every element of a document with its attributes and its text (descendants'
    included), in document order; entities decoded, as a browser shows them."""

    VOID = frozenset({"br", "meta", "img", "hr", "input", "link"})

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[Element] = []
        self._open: list[Element] = []
        self.feed(html)
        self.close()
        assert not self._open, f"unclosed: {[e.tag for e in self._open]}"

    def _add(self, tag: str, attrs: list[tuple[str, str | None]]) -> Element:
        n = len(self.elements)
        element = Element(tag, {k: v or "" for k, v in attrs}, index=n, end=n + 1)
        self.elements.append(element)
        return element

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = self._add(tag, attrs)
        if tag not in self.VOID:
            self._open.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._add(tag, attrs)

    def handle_endtag(self, tag: str) -> None:
        assert self._open and self._open[-1].tag == tag, (tag, [e.tag for e in self._open])
        self._open.pop().end = len(self.elements)

    def handle_data(self, data: str) -> None:
        for element in self._open:
            element.parts.append(data)

    def find(self, tag: str, within: Element | None = None, **attrs: str) -> list[Element]:
        """Elements ``tag`` (inside ``within``) whose attributes include ``attrs``
        (``class_`` for class, ``data_x`` for data-x)."""
        want = {k.rstrip("_").replace("_", "-"): v for k, v in attrs.items()}
        scope = (self.elements if within is None
                 else self.elements[within.index + 1:within.end])
        return [e for e in scope
                if e.tag == tag and all(e.attrs.get(k) == v for k, v in want.items())]

    def one(self, tag: str, within: Element | None = None, **attrs: str) -> Element:
        found = self.find(tag, within, **attrs)
        assert len(found) == 1, (tag, attrs, found)
        return found[0]


# --------------------------------------------------------------------------- snapshots


def pipeline(name: str, **fields: Any) -> Pipeline:
    body = {**BODY, "alerts": {"max_lag": 100, "max_parked": 5}, **fields}
    return parse_pipelines({"pipelines": {name: body}})[name]


def lag_row(p: Pipeline, partition: int, stored: int | None, high: int,
            group: int | None = None) -> LagRow:
    return LagRow(pipeline=p.name, topic=p.topic, partition=partition, stored_offset=stored,
                  group_offset=group, low=0, high=high)


def view(p: Pipeline, rows: tuple[LagRow, ...] | None, *, parked: int = 0,
         lag_error: str | None = None, database: bool = True,
         **more: Any) -> PipelineView:
    total = None if rows is None else total_lag(rows)
    result = None
    if database:
        f = Figures(pipeline=p.name, now=NOW, total_lag=total,
                    partitions=len(rows or ()), read=1000, dead_lettered=10,
                    last_live_commit=NOW - timedelta(minutes=4),
                    watched_since=NOW - timedelta(hours=2), parked=parked)
        result = CheckResult(f, tuple(evaluate(p.alerts, f)))
    return PipelineView(pipeline=p, lag_rows=rows, lag_error=lag_error, result=result,
                        **more)


def healthy() -> PipelineView:
    p = pipeline("calm")
    return view(p, (lag_row(p, 0, 95, 100), lag_row(p, 1, 50, 50)), parked=1)


def breaching() -> PipelineView:
    """Lag 500 over 100 and 7 parked letters over 5."""
    p = pipeline("stormy", topic="stormy-in", table="stormy_rows", dlq_topic="stormy-dlq")
    return view(p, (lag_row(p, 0, 100, 400, group=90), lag_row(p, 1, 0, 200)), parked=7,
                oldest_unread={0: T - 30.0, 1: T - 600.0},
                outcome=RunOutcome("failed", "scheduled__2026-03-01T11:55:00+00:00", T - 90))


def snap(*views: PipelineView, up: dict[tuple[str, str], bool] | None = None) -> Snapshot:
    return Snapshot(views, up or {("kafka", "kafka_prod_sasl"): True,
                                  ("postgres", "warehouse_writer"): True}, T, 0.42)


def checks(*lags: dict[int, int]) -> list[Check]:
    return [Check(NOW - timedelta(minutes=5 * (len(lags) - i)), sum(parts.values()), parts)
            for i, parts in enumerate(lags)]


def render_overview(*views: PipelineView, **kwargs: Any) -> str:
    history = kwargs.pop("history", {})
    return overview(snap(*views, **kwargs), history, airflow=AIRFLOW, here=HERE, now=T)


def render_detail(v: PipelineView, history: list[Check] | None = None,
                  dead: list[dict[str, Any]] | None = None) -> str:
    return detail(v, history or [], dead or [], airflow=AIRFLOW, back=HERE, now=T)


def cells(page: Page, pipeline_name: str) -> dict[str, Element]:
    """The overview row's cells by ``data-figure``, plus ``badge``."""
    tr = page.one("tr", data_pipeline=pipeline_name)
    found = {td.attrs["data-figure"]: td for td in page.find("td", tr)
             if "data-figure" in td.attrs}
    (found["badge"],) = [e for e in page.find("span", tr) if "data-state" in e.attrs]
    return found


def links(page: Page, pipeline_name: str) -> list[Element]:
    return page.find("a", page.one("tr", data_pipeline=pipeline_name))


# --------------------------------------------------------------------------- overview


def test_the_breaching_pipeline_is_red_and_the_healthy_one_green() -> None:
    stormy, calm = breaching(), healthy()
    assert stormy.breached == {"max_lag", "max_parked"}  # the setting, checked
    assert calm.breached == frozenset()
    page = Page(render_overview(calm, stormy))

    bad = cells(page, "stormy")
    assert bad["badge"].attrs["data-state"] == "bad"
    assert "bad" in bad["badge"].attrs["class"].split()
    assert bad["lag"].attrs["class"] == "bad"
    assert bad["lag"].text == "500"
    assert bad["parked"].attrs["class"] == "bad"
    assert bad["parked"].text == "7"
    assert bad["dlq"].attrs["class"] == "ok"  # 1 % is under 5 %: only breached rules are red
    assert bad["freshness"].attrs["class"] == "ok"
    assert bad["freshness"].text == "4 min ago"

    good = cells(page, "calm")
    assert good["badge"].attrs["data-state"] == "ok"
    assert {good[k].attrs["class"] for k in ("lag", "trend", "dlq", "freshness", "parked")} \
        == {"ok"}
    assert good["lag"].text == "5"
    assert good["dlq"].text == "1.00%"


def test_an_unknown_lag_is_grey_with_the_reason() -> None:
    p = pipeline("blind")
    kafka_down = view(p, None, lag_error="lag not known: KafkaUnavailable: all brokers down")
    q = pipeline("dark", topic="dark-in", table="dark_rows", dlq_topic="dark-dlq")
    db_down = view(q, None, lag_error="lag not known: the database is out of reach",
                   database=False)
    page = Page(render_overview(kafka_down, db_down, healthy(),
                                up={("kafka", "kafka_prod_sasl"): False,
                                    ("postgres", "warehouse_writer"): True}))

    for name, reason in (("blind", "KafkaUnavailable: all brokers down"),
                         ("dark", "the database is out of reach")):
        row = cells(page, name)
        assert row["badge"].attrs["data-state"] == "unknown", name
        assert row["lag"].attrs["class"] == "unknown", name
        assert row["lag"].text.startswith("?"), name
        assert reason in row["lag"].text, name
        assert row["freshness"].attrs["class"] == "unknown", name
    # what the database still tells when only Kafka is down is judged
    assert cells(page, "blind")["dlq"].attrs["class"] == "ok"
    assert cells(page, "dark")["dlq"].attrs["class"] == "unknown"
    assert cells(page, "calm")["badge"].attrs["data-state"] == "ok"
    assert "Out of reach: kafka (kafka_prod_sasl)" in page.one("p", class_="breach").text


def test_a_long_lag_error_is_cut_not_spilled() -> None:
    p = pipeline("blind")
    page = Page(render_overview(view(p, None, lag_error="x" * 1000)))
    assert cells(page, "blind")["lag"].text == "?" + "x" * 160


def test_every_name_from_outside_is_escaped() -> None:
    calm = healthy()
    hostile = replace(calm, pipeline=calm.pipeline.model_copy(
        update={"name": XSS, "topic": f"t{XSS}", "table": f"r{XSS}"}),
        lag_error=f"lag not known: {XSS}",
        outcome=RunOutcome(f"s{XSS}", f"run{XSS}", T - 5))
    reason = f"reason{XSS}"
    html = render_overview(hostile, history={XSS: checks({0: 1}, {0: 2})})
    detail_html = render_detail(
        hostile, checks({0: 1}, {0: 2}),
        [{"reason": reason, "status": "parked", "count": 3, "last": NOW}])

    # the page's own script, if any, is all there is: as many as a page of tame names has
    tame_html = render_overview(calm, history={"calm": checks({0: 1}, {0: 2})})
    tame_detail = render_detail(calm, checks({0: 1}, {0: 2}),
                                [{"reason": "r", "status": "parked", "count": 3, "last": NOW}])
    for text, tame in ((html, tame_html), (detail_html, tame_detail)):
        assert text.count("<script") == tame.count("<script")
        assert "alert(1)</script>" not in text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    page = Page(html)
    assert not [s for s in page.find("script") if "alert(1)" in s.text]
    row = page.one("tr", data_pipeline=XSS)  # the attribute decodes back to the name
    assert row.attrs["data-pipeline"] == XSS
    # the link to the detail page quotes the name into its path
    (to_detail,) = [a for a in page.find("a", row) if a.attrs["href"].startswith(HERE + "/")]
    assert to_detail.text == XSS
    assert not set('<>"\' ') & set(to_detail.attrs["href"])
    assert unquote(to_detail.attrs["href"]) == f"{HERE}/{XSS}"
    assert f"t{XSS} → r{XSS}" in row.text
    assert f"lag not known: {XSS}" in row.text
    assert f"s{XSS}" in row.text and f"run{XSS}" in row.text
    dpage = Page(detail_html)
    assert not [s for s in dpage.find("script") if "alert(1)" in s.text]
    assert dpage.one("h1").text.startswith(XSS)
    assert dpage.one("tr", data_reason=reason).text.startswith(reason)
    assert json.loads(dpage.one("code", class_="conf").text)["error_classes"] == [reason]


def test_the_links_open_the_ingest_dags_runs_at_the_top() -> None:
    stormy, calm = breaching(), healthy()
    page = Page(render_overview(calm, stormy))

    (detail_link, runs) = links(page, "calm")
    assert detail_link.attrs["href"] == f"{HERE}/calm"
    assert (runs.attrs["target"], runs.attrs["href"]) == ("_top",
                                                          f"{AIRFLOW}/dags/calm_ingest/runs")
    # with a last run known: a link to that run
    (_, run) = links(page, "stormy")
    assert run.attrs["target"] == "_top"
    assert run.attrs["href"] == (f"{AIRFLOW}/dags/stormy_ingest/runs/"
                                 "scheduled__2026-03-01T11%3A55%3A00%2B00%3A00")
    assert run.text == "scheduled__2026-03-01T11:55:00+00:00"
    (outcome,) = [e for e in page.find("span", page.one("tr", data_pipeline="stormy"))
                  if e.attrs["class"] == "badge bad" and "data-state" not in e.attrs]
    assert outcome.text == "failed"


def test_the_trend_is_a_sparkline_once_there_are_two_checks() -> None:
    page = Page(render_overview(healthy(), breaching(),
                                history={"calm": checks({0: 1}, {0: 3}, {0: 2})}))

    spark = page.one("svg", class_="spark")
    assert spark.attrs["aria-label"] == "lag trend"
    (line,) = [e for e in page.find("polyline")]
    assert len(line.attrs["points"].split()) == 3
    assert cells(page, "stormy")["trend"].text == "no trend yet"
    assert sparkline([5]) == '<span class="muted">no trend yet</span>'


# --------------------------------------------------------------------------- detail


def test_the_detail_page_shows_each_breach_message() -> None:
    stormy = breaching()
    assert stormy.result is not None
    page = Page(render_detail(stormy))

    shown = {p.attrs["data-rule"]: p.text for p in page.find("p", class_="breach")}
    assert set(shown) == {"max_lag", "max_parked"}
    assert shown == {b.rule: b.message for b in stormy.result.breaches}
    assert "lag 500 messages over 2 partitions is above max_lag 100" in shown["max_lag"]
    assert page.one("h1").text.startswith("stormy")
    assert page.find("span", page.one("h1"), data_state="bad")
    runs = page.one("a", id="ingest-runs")
    assert (runs.attrs["target"], runs.attrs["href"]) == ("_top",
                                                          f"{AIRFLOW}/dags/stormy_ingest/runs")
    replay = page.one("a", id="replay-dag")
    assert (replay.attrs["target"], replay.attrs["href"]) == (
        "_top", f"{AIRFLOW}/dags/stormy_dlq_replay")
    assert page.one("a", href=HERE).text == "← all pipelines"


def test_the_partitions_table_has_one_row_per_partition() -> None:
    page = Page(render_detail(breaching()))
    table = page.one("table", id="partitions")

    rows = page.find("tr", table)[1:]  # after the header
    assert [[td.text for td in page.find("td", tr)] for tr in rows] == [
        # partition, stored offset, high watermark, lag, group lag, oldest unread
        ["0", "100", "400", "300", "310", "30 s ago"],
        ["1", "0", "200", "200", "?", "10 min ago"],
    ]
    assert {page.find("td", tr)[3].attrs["class"] for tr in rows} == {"bad"}


def test_an_unknown_lag_shows_its_reason_in_the_partitions_table() -> None:
    p = pipeline("blind")
    page = Page(render_detail(view(p, None, lag_error="lag not known: topic missing")))

    cell = page.one("td", class_="unknown")
    assert cell.text == "lag not known: topic missing"
    assert page.find("span", page.one("h1"), data_state="unknown")


def test_the_chart_draws_one_line_per_partition() -> None:
    history = checks({0: 10, 1: 0}, {0: 40, 1: 5}, {0: 20, 1: 80}, {0: 0, 1: 60})
    page = Page(render_detail(breaching(), history))

    svg = page.one("svg", id="lag-chart")
    assert svg.attrs["aria-label"] == "lag per partition over time"
    lines = {e.attrs["data-partition"]: e.attrs["points"].split()
             for e in page.find("polyline")}
    assert sorted(lines) == ["0", "1"]
    assert all(len(points) == 4 for points in lines.values())  # one point per check
    ys = {p: [float(xy.split(",")[1]) for xy in points] for p, points in lines.items()}
    # SVG's y grows downwards: partition 1's peak (80, the chart's) is its highest point,
    # partition 0's zero at the end sits on the axis with partition 1's zero at the start
    assert min(ys["1"]) == ys["1"][2] < min(ys["0"])
    assert ys["0"][3] == ys["1"][0] == max(ys["0"] + ys["1"])
    assert page.find("p", id="lag-chart-empty") == []
    assert "partition 0" in page.one("div", class_="legend").text


def test_with_fewer_than_two_checks_the_chart_says_so() -> None:
    for history in ([], checks({0: 5})):
        page = Page(render_detail(breaching(), history))
        assert page.find("svg", id="lag-chart") == []
        assert "No lag history yet" in page.one("p", id="lag-chart-empty").text
    # checks without a lag per partition (recorded before migration 0008) draw nothing
    assert 'id="lag-chart-empty"' in chart(checks({}, {}))


def test_dead_letters_by_reason_with_a_replay_link_for_the_parked_only() -> None:
    dead = [{"reason": "contract_violation", "status": "parked", "count": 1200,
             "last": NOW - timedelta(minutes=1)},
            {"reason": "undecodable", "status": "recovered", "count": 3,
             "last": NOW - timedelta(days=1)},
            {"reason": "too_large", "status": "parked", "count": 2, "last": NOW}]
    page = Page(render_detail(breaching(), dead=dead))

    rows = {tr.attrs["data-reason"]: [td.text for td in page.find("td", tr)[:4]]
            for tr in page.find("tr") if "data-reason" in tr.attrs}
    assert rows == {"contract_violation": ["contract_violation", "parked", "1,200",
                                           "2026-03-01 11:59Z"],
                    "undecodable": ["undecodable", "recovered", "3", "2026-02-28 12:00Z"],
                    "too_large": ["too_large", "parked", "2", "2026-03-01 12:00Z"]}
    replays = page.find("a", class_="replay")
    assert [a.text for a in replays] == ["replay contract_violation", "replay too_large"]
    for a in replays:
        assert a.attrs["href"] == f"{AIRFLOW}/dags/stormy_dlq_replay"
        assert a.attrs["target"] == "_top"
    confs = [json.loads(c.text) for c in page.find("code", class_="conf")]
    assert confs == [{"error_classes": ["contract_violation"], "dry_run": True},
                     {"error_classes": ["too_large"], "dry_run": True}]
    recovered = page.one("tr", data_reason="undecodable")
    assert page.find("a", recovered) == []


def test_no_dead_letters_say_none() -> None:
    page = Page(render_detail(healthy()))
    table = page.one("table", id="letters")
    assert [td.text for td in page.find("td", table)] == ["none"]
    assert page.find("a", class_="replay") == []


def test_no_connection_setting_or_secret_is_on_either_page() -> None:
    stormy, calm = breaching(), healthy()
    texts = [render_overview(calm, stormy, history={"calm": checks({0: 1}, {0: 2})}),
             render_detail(stormy, checks({0: 1}, {0: 2}),
                           [{"reason": "contract_violation", "status": "parked",
                             "count": 1, "last": NOW}])]

    for text in texts:
        lowered = text.lower()
        for secret in ("password", "passwd", "secret", "postgresql://", "postgres://",
                       "sasl.", "bootstrap", "dsn", "kafka_prod_sasl", "warehouse_writer",
                       "localhost:5432"):
            assert secret not in lowered, secret

