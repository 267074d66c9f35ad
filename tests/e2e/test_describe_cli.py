"""`eddyline describe`: a StreamApp's topology as Kafka's describe() text, its hash, and
its drawings."""

from __future__ import annotations

from pathlib import Path

import pytest

from eddyline_runtime.cli import main
from eddyline_runtime.processing.description import describe_hash
from eddyline_runtime.processing.loader import load_topology

PAGE_VIEWS = Path(__file__).resolve().parents[2] / "examples" / "page_views"
MANIFEST = str(PAGE_VIEWS / "streamapp.yaml")


def test_describe_prints_the_topologys_kafka_text_and_its_hash(
    capsys: pytest.CaptureFixture[str],
) -> None:
    expected = load_topology("page_views:topology", [PAGE_VIEWS]).describe()
    assert main(["describe", MANIFEST]) == 0
    text = capsys.readouterr().out
    assert text == expected
    assert "Sink: KSTREAM-SINK-0000000003 (topic: page-views-by-region-repartition)" in text
    assert main(["describe", MANIFEST, "--hash"]) == 0
    assert capsys.readouterr().out == describe_hash(expected) + "\n"


def test_describe_draws_dot_and_mermaid(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["describe", MANIFEST, "--format", "dot"]) == 0
    assert capsys.readouterr().out.startswith("digraph topology {\n")
    assert main(["describe", MANIFEST, "--format", "mermaid"]) == 0
    assert capsys.readouterr().out.startswith("flowchart TB\n")


def test_describe_without_graphviz_says_which_package_to_install(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "")
    assert main(["describe", MANIFEST, "--format", "svg"]) == 1
    assert "Debian package graphviz" in capsys.readouterr().err


def test_describe_of_a_missing_manifest_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.yaml"
    assert main(["describe", str(missing)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(missing) in err
