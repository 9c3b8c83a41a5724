"""The docs cannot drift from the code: the configuration reference and the code map are
what their generators make from the code now, every key of the pipeline model has a doc
comment, every relative link and anchor of the README, the CHANGELOG and docs/ resolves,
and each alert rule's runbook link lands on a section. The checkers are tested on made-up
pages and models too, so a check that passes is one that could have failed."""

from __future__ import annotations

import textwrap
from enum import StrEnum
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, Field

from kafka_ingest.config import parse_pipelines
from kafka_ingest.ops.alert_rules import rules_document
from kafka_ingest_dev.docs import (
    CONFIGURATION,
    DEVELOPMENT,
    Key,
    anchors,
    broken_links,
    code_map,
    config_reference,
    doc_files,
    generated,
    model_keys,
    undocumented,
)

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- the real docs


def test_the_configuration_reference_is_what_the_model_says_now() -> None:
    on_disk = (ROOT / CONFIGURATION).read_text(encoding="utf-8")
    assert on_disk == config_reference(), (
        "docs/configuration.md is stale: run `python -m kafka_ingest_dev.docs write`")


def test_the_code_map_is_what_the_tree_says_now() -> None:
    on_disk = (ROOT / DEVELOPMENT).read_text(encoding="utf-8")
    assert on_disk == generated(ROOT)[DEVELOPMENT], (
        "docs/development.md's code map is stale: run `python -m kafka_ingest_dev.docs write`")


def test_every_key_of_the_pipelines_file_has_a_doc_comment() -> None:
    assert undocumented() == []


def test_the_reference_documents_keys_with_their_type_default_and_comment() -> None:
    """Rows the reader relies on, spelled out (not re-derived from the generator)."""
    page = config_reference()
    assert ("| `chunk_size` | integer (≥ 1, ≤ 500,000) | `20000` | Messages per chunk: one "
            "chunk is one Postgres transaction (bounds memory). |") in page
    assert "| `dlq_topic` | string (matches `^[A-Za-z0-9._-]{1,249}$`) | required |" in page
    assert "| `upsert` | [Upsert](#upsert) | its keys' defaults |" in page
    assert "| `mode` | `append` \\| `latest` | `append` |" in page
    assert "| `class` | string | required |" in page  # NotifierClass's alias, not class_path
    for section in ("## Pipeline", "## Alerts", "## Retention", "## OnData", "## FieldSpec"):
        assert f"\n{section}\n" in page


def test_every_relative_link_and_anchor_of_the_docs_resolves() -> None:
    assert broken_links(doc_files(ROOT), ROOT) == []


def test_every_alert_rule_links_to_a_section_of_the_runbook() -> None:
    shipped = parse_pipelines({"pipelines": {"p1": {
        "topic": "t-in", "contract": {"event_type": "metric_event", "version": 2},
        "table": "t_rows", "dlq_topic": "t-in-dlq"}}})
    links = {rule["annotations"]["runbook"]
             for group in rules_document(shipped.values())["groups"]
             for rule in group["rules"] if "annotations" in rule}
    # the five monitor rules and the two of Prometheus' own, each its own section
    assert len(links) == 7
    runbook = anchors((ROOT / "docs" / "runbook.md").read_text(encoding="utf-8"))
    for link in links:
        path, _, anchor = link.partition("#")
        assert path == "docs/runbook.md"
        assert anchor in runbook, link


# --------------------------------------------------------------------------- the checkers


def _page(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_a_link_to_a_missing_file_or_anchor_is_reported(tmp_path: Path) -> None:
    _page(tmp_path, "docs/guide.md", """\
        # The guide
        ## Step `one`: start
        <a id="custom"></a>
        """)
    _page(tmp_path, "img.png", "")
    readme = _page(tmp_path, "README.md", """\
        # Title
        ## Usage
        [ok](docs/guide.md) [ok](docs/guide.md#step-one-start) [ok](docs/guide.md#custom)
        [ok](#usage) ![ok](img.png) [web](https://example.com/x#y) [ok](#title)
        [missing file](docs/nope.md) [missing anchor](docs/guide.md#step-two)
        [missing here](#nowhere) [outside](../elsewhere.md)
        `[in code](nope.md)`
        ```
        [in a block](nope.md)
        ```
        """)
    assert broken_links([readme], tmp_path) == [
        "README.md:5: docs/nope.md", "README.md:5: docs/guide.md#step-two",
        "README.md:6: #nowhere", "README.md:6: ../elsewhere.md"]


def test_anchors_are_github_s() -> None:
    text = textwrap.dedent("""\
        # Runbook: what each alert means
        ## `max_lag`: lag above max
        ## Faults, measured
        ## Faults, measured
        ```
        # not a heading
        ```
        <a id="target_down"></a>
        """)
    assert anchors(text) == {"runbook-what-each-alert-means", "max_lag-lag-above-max",
                             "faults-measured", "faults-measured-1", "target_down"}


class _Colour(StrEnum):
    RED = "red"
    BLUE = "blue"


class _Inner(BaseModel):
    #: How deep.
    depth: int = 2


class _Sample(BaseModel):
    #: The name, required.
    name: Annotated[str, Field(pattern=r"^[a-z]+$")]
    #: A bounded count;
    #: said over two lines.
    count: Annotated[int, Field(ge=1, le=10_000)] = 5
    colour: _Colour = _Colour.RED
    """The colour, as a string below the field."""
    #: Nested.
    inner: _Inner = _Inner()
    undocumented: str | None = None


def test_a_model_s_keys_are_read_with_their_comments_bounds_and_defaults() -> None:
    assert model_keys(_Sample) == [
        Key("name", "string (matches `^[a-z]+$`)", "required", "The name, required."),
        Key("count", "integer (≥ 1, ≤ 10,000)", "`5`", "A bounded count; said over two lines."),
        Key("colour", "`red` | `blue`", "`red`", "The colour, as a string below the field."),
        Key("inner", "[_Inner](#_inner)", "its keys' defaults", "Nested."),
        Key("undocumented", "string or `null`", "`null`", ""),
    ]


def test_a_key_without_a_doc_comment_is_reported() -> None:
    assert undocumented((_Sample,)) == ["_Sample.undocumented"]


def test_the_code_map_lists_every_module_with_its_summary(tmp_path: Path) -> None:
    for folder in ("dags", "plugins", "include/kafka_ingest", "include/kafka_ingest_dev",
                   "benchmarks", "scripts"):
        (tmp_path / folder).mkdir(parents=True)
    _page(tmp_path, "include/kafka_ingest/__init__.py", '"""The core.\n\nMore."""\n')
    _page(tmp_path, "include/kafka_ingest/cli.py", '"""The command line."""\n')
    _page(tmp_path, "include/kafka_ingest/db/__init__.py", '"""Postgres."""\n')
    _page(tmp_path, "include/kafka_ingest/db/uow.py", '"""The unit of work:\n``one`` txn."""\n')
    _page(tmp_path, "dags/ingest_dags.py", "x = 1\n")
    assert code_map(tmp_path) == textwrap.dedent("""\
        - `dags/`
          - `ingest_dags.py`: -
        - `plugins/`
        - `include/kafka_ingest/`: The core.
          - `cli.py`: The command line.
          - `db/`: Postgres.
            - `uow.py`: The unit of work: `one` txn.
        - `include/kafka_ingest_dev/`
        - `benchmarks/`
        - `scripts/`
        """)
