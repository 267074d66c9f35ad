"""The topology drawn: the page-views and ad-clicks examples checked node by node, in both
the dot and the Mermaid text, and SVG through Graphviz."""

from __future__ import annotations

import html
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from eddyline_runtime.processing.loader import load_topology
from eddyline_runtime.processing.topology import Topology
from eddyline_runtime.processing.topology_picture import (
    PictureError,
    to_dot,
    to_mermaid,
    to_svg,
)

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def example(name: str, reference: str) -> Topology:
    return load_topology(reference, [EXAMPLES / name])


@dataclass
class Drawing:
    """What a reader sees: boxes (label -> shape), which box each cluster holds, edges
    between labels (``dashed``: a store attached to its processor)."""

    shapes: dict[str, str] = field(default_factory=dict)
    clusters: dict[str, set[str]] = field(default_factory=dict)
    edges: set[tuple[str, str]] = field(default_factory=set)
    dashed: set[tuple[str, str]] = field(default_factory=set)


DOT_BOX = re.compile(r'^\s*"(?P<id>[^"]+)" \[label="(?P<label>[^"]+)", shape=(?P<shape>\w+)')
DOT_EDGE = re.compile(r'^\s*"(?P<tail>[^"]+)" -> "(?P<head>[^"]+)"(?P<dashed> \[style=dashed)?')
DOT_CLUSTER = re.compile(r"^\s*subgraph cluster_\d+ \{")
DOT_LABEL = re.compile(r'^\s*label="(?P<title>[^"]+)";')


def parse_dot(text: str) -> Drawing:
    drawing = Drawing()
    labels: dict[str, str] = {}
    cluster: str | None = None
    pending_cluster = False
    edges: list[tuple[str, str, bool]] = []
    for line in text.splitlines():
        if DOT_CLUSTER.match(line):
            pending_cluster = True
        elif pending_cluster and (title := DOT_LABEL.match(line)):
            cluster = title["title"]
            drawing.clusters[cluster] = set()
            pending_cluster = False
        elif line.strip() == "}":
            cluster = None
        elif box := DOT_BOX.match(line):
            labels[box["id"]] = box["label"]
            drawing.shapes[box["label"]] = box["shape"]
            if cluster is not None:
                drawing.clusters[cluster].add(box["label"])
        elif edge := DOT_EDGE.match(line):
            edges.append((edge["tail"], edge["head"], edge["dashed"] is not None))
    for tail, head, dashed in edges:
        (drawing.dashed if dashed else drawing.edges).add((labels[tail], labels[head]))
    return drawing


MERMAID_BOX = re.compile(r'^\s*(?P<id>n\d+)(?P<open>[^"\w]+)"(?P<label>[^"]+)"(?P<close>[^"]+)$')
MERMAID_EDGE = re.compile(r"^\s*(?P<tail>n\d+) (?P<arrow>-->|-\.-) (?P<head>n\d+)$")
MERMAID_CLUSTER = re.compile(r'^\s*subgraph s\d+\["(?P<title>[^"]+)"\]$')
# The brackets Mermaid draws each kind with, as the picture module writes them.
MERMAID_SHAPES = {
    "[/": "invhouse",
    "(": "box",
    "[\\": "house",
    "[(": "cylinder",
    "[[": "cds",
    "{{": "cds",
}


def parse_mermaid(text: str) -> Drawing:
    drawing = Drawing()
    labels: dict[str, str] = {}
    cluster: str | None = None
    assert text.splitlines()[0] == "flowchart TB"
    for line in text.splitlines()[1:]:
        if title := MERMAID_CLUSTER.match(line):
            cluster = title["title"]
            drawing.clusters[cluster] = set()
        elif line.strip() == "end":
            cluster = None
        elif box := MERMAID_BOX.match(line):
            labels[box["id"]] = box["label"]
            drawing.shapes[box["label"]] = MERMAID_SHAPES[box["open"]]
            if cluster is not None:
                drawing.clusters[cluster].add(box["label"])
        elif edge := MERMAID_EDGE.match(line):
            pair = (labels[edge["tail"]], labels[edge["head"]])
            (drawing.dashed if edge["arrow"] == "-.-" else drawing.edges).add(pair)
        else:
            raise AssertionError(f"a line the test does not understand: {line!r}")
    return drawing


PAGE_VIEWS = Drawing(
    shapes={
        "page-views": "cds",
        "KSTREAM-SOURCE-0000000000": "invhouse",
        "KSTREAM-KEY-SELECT-0000000001": "box",
        "KSTREAM-SINK-0000000003": "house",
        "page-views-by-region-repartition": "cds",
        "KSTREAM-SOURCE-0000000004": "invhouse",
        "KSTREAM-AGGREGATE-0000000005": "box",
        "page-views-per-region-minute": "cylinder",
        "KTABLE-SUPPRESS-0000000006": "box",
        "page-views-per-region-minute-final-buffer": "cylinder",
        "KTABLE-TOSTREAM-0000000007": "box",
        "KSTREAM-MAP-0000000008": "box",
        "KSTREAM-SINK-0000000009": "house",
        "page-views-per-minute": "cds",
    },
    clusters={
        "Sub-topology 0": {
            "KSTREAM-SOURCE-0000000000",
            "KSTREAM-KEY-SELECT-0000000001",
            "KSTREAM-SINK-0000000003",
        },
        "Sub-topology 1": {
            "KSTREAM-SOURCE-0000000004",
            "KSTREAM-AGGREGATE-0000000005",
            "page-views-per-region-minute",
            "KTABLE-SUPPRESS-0000000006",
            "page-views-per-region-minute-final-buffer",
            "KTABLE-TOSTREAM-0000000007",
            "KSTREAM-MAP-0000000008",
            "KSTREAM-SINK-0000000009",
        },
    },
    edges={
        ("page-views", "KSTREAM-SOURCE-0000000000"),
        ("KSTREAM-SOURCE-0000000000", "KSTREAM-KEY-SELECT-0000000001"),
        ("KSTREAM-KEY-SELECT-0000000001", "KSTREAM-SINK-0000000003"),
        # The repartition topic stands between the two sub-topologies.
        ("KSTREAM-SINK-0000000003", "page-views-by-region-repartition"),
        ("page-views-by-region-repartition", "KSTREAM-SOURCE-0000000004"),
        ("KSTREAM-SOURCE-0000000004", "KSTREAM-AGGREGATE-0000000005"),
        ("KSTREAM-AGGREGATE-0000000005", "KTABLE-SUPPRESS-0000000006"),
        ("KTABLE-SUPPRESS-0000000006", "KTABLE-TOSTREAM-0000000007"),
        ("KTABLE-TOSTREAM-0000000007", "KSTREAM-MAP-0000000008"),
        ("KSTREAM-MAP-0000000008", "KSTREAM-SINK-0000000009"),
        ("KSTREAM-SINK-0000000009", "page-views-per-minute"),
    },
    dashed={
        ("KSTREAM-AGGREGATE-0000000005", "page-views-per-region-minute"),
        ("KTABLE-SUPPRESS-0000000006", "page-views-per-region-minute-final-buffer"),
    },
)

JOIN_STORES = (
    "ad-clicks-this-join-store",
    "ad-clicks-outer-other-join-store",
    "ad-clicks-left-shared-join-store",
)
AD_CLICKS = Drawing(
    shapes={
        "impressions": "cds",
        "clicks": "cds",
        "KSTREAM-SOURCE-0000000000": "invhouse",
        "KSTREAM-SOURCE-0000000001": "invhouse",
        "KSTREAM-JOINTHIS-0000000002": "box",
        "KSTREAM-JOINOTHER-0000000003": "box",
        "KSTREAM-JOINTHIS-0000000004": "box",
        "KSTREAM-OUTEROTHER-0000000005": "box",
        "KSTREAM-MERGE-0000000006": "box",
        "KSTREAM-SINK-0000000007": "house",
        "ad-results": "cds",
        **dict.fromkeys(JOIN_STORES, "cylinder"),
    },
    clusters={
        "Sub-topology 0": {
            "KSTREAM-SOURCE-0000000000",
            "KSTREAM-SOURCE-0000000001",
            "KSTREAM-JOINTHIS-0000000002",
            "KSTREAM-JOINOTHER-0000000003",
            "KSTREAM-JOINTHIS-0000000004",
            "KSTREAM-OUTEROTHER-0000000005",
            "KSTREAM-MERGE-0000000006",
            "KSTREAM-SINK-0000000007",
            *JOIN_STORES,
        }
    },
    edges={
        ("impressions", "KSTREAM-SOURCE-0000000000"),
        ("clicks", "KSTREAM-SOURCE-0000000001"),
        ("KSTREAM-SOURCE-0000000000", "KSTREAM-JOINTHIS-0000000002"),
        ("KSTREAM-SOURCE-0000000001", "KSTREAM-JOINOTHER-0000000003"),
        ("KSTREAM-JOINTHIS-0000000002", "KSTREAM-JOINTHIS-0000000004"),
        ("KSTREAM-JOINOTHER-0000000003", "KSTREAM-OUTEROTHER-0000000005"),
        ("KSTREAM-JOINTHIS-0000000004", "KSTREAM-MERGE-0000000006"),
        ("KSTREAM-OUTEROTHER-0000000005", "KSTREAM-MERGE-0000000006"),
        ("KSTREAM-MERGE-0000000006", "KSTREAM-SINK-0000000007"),
        ("KSTREAM-SINK-0000000007", "ad-results"),
    },
    dashed={
        ("KSTREAM-JOINTHIS-0000000002", "ad-clicks-this-join-store"),
        ("KSTREAM-JOINOTHER-0000000003", "ad-clicks-outer-other-join-store"),
        *(("KSTREAM-JOINTHIS-0000000004", store) for store in JOIN_STORES),
        *(("KSTREAM-OUTEROTHER-0000000005", store) for store in JOIN_STORES),
    },
)


@pytest.mark.parametrize("parse,draw", [(parse_dot, to_dot), (parse_mermaid, to_mermaid)])
@pytest.mark.parametrize(
    "name,reference,expected",
    [
        ("page_views", "page_views:topology", PAGE_VIEWS),
        ("ad_clicks", "ad_clicks:topology", AD_CLICKS),
    ],
)
def test_examples_are_drawn_node_by_node(
    parse: object, draw: object, name: str, reference: str, expected: Drawing
) -> None:
    assert callable(parse) and callable(draw)
    drawn = parse(draw(example(name, reference)))
    assert drawn.shapes == expected.shapes
    assert drawn.clusters == expected.clusters
    assert drawn.edges == expected.edges
    assert drawn.dashed == expected.dashed


def test_repartition_topics_are_drawn_apart_from_the_apps_topics() -> None:
    dot = to_dot(example("page_views", "page_views:topology"))
    (repartition,) = [line for line in dot.splitlines() if 'dashed", fillcolor' in line]
    assert '"topic:page-views-by-region-repartition"' in repartition


def test_a_global_store_is_a_box_of_its_own_fed_by_its_topic() -> None:
    topology = example("currency_conversion", "currency_conversion:topology")
    (spec,) = topology.global_stores.values()
    drawn = parse_mermaid(to_mermaid(topology))
    (title,) = [t for t in drawn.clusters if "global store" in t]
    assert drawn.clusters[title] == {spec.source_name, spec.processor_name, spec.name}
    assert (spec.topic, spec.source_name) in drawn.edges
    assert (spec.processor_name, spec.name) in drawn.dashed
    # The joining processor reads it across the boxes.
    assert any(store == spec.name and tail != spec.processor_name for tail, store in drawn.dashed)


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz (Debian package graphviz)")
def test_svg_is_laid_out_by_graphviz() -> None:
    svg = to_svg(example("page_views", "page_views:topology"))
    assert svg.lstrip().startswith("<?xml") and "</svg>" in svg
    texts = {html.unescape(text) for text in re.findall(r"<text[^>]*>([^<]*)</text>", svg)}
    assert texts == set(PAGE_VIEWS.shapes) | set(PAGE_VIEWS.clusters)


def test_svg_without_graphviz_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    with pytest.raises(PictureError, match=r"Debian package graphviz .*--format dot"):
        to_svg(example("page_views", "page_views:topology"))


def test_the_docs_picture_of_page_views_is_current() -> None:
    """docs/operator.md shows docs/images/page-views-topology.svg: it names exactly the boxes
    and sub-topologies of today's page-views picture (`make topology-pictures` redraws it)."""
    committed = EXAMPLES.parent / "docs" / "images" / "page-views-topology.svg"
    svg = committed.read_text(encoding="utf-8")
    texts = {html.unescape(text) for text in re.findall(r"<text[^>]*>([^<]*)</text>", svg)}
    assert texts == set(PAGE_VIEWS.shapes) | set(PAGE_VIEWS.clusters)
