"""`eddyline describe` flags the names the DSL generated (numbered by a node's position),
and `eddyline describe NEW --upgrade-from OLD` applies the operator's upgrade rule for them
(``resource_names.moved_names``, refusal reason GeneratedNamesMoved) before anything runs."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from eddyline_runtime.cli import main
from eddyline_runtime.processing.loader import load_topology

# Revision 1 counts words through a generated repartition topic; "shifted" adds a stream
# before it (renumbering it), "pinned" adds the same stream but names the topic as
# revision 1 generated it, "named" names every resource.
TOPOLOGIES = """
from eddyline_runtime.processing import StreamsBuilder


def _count(builder, **group_by):
    (
        builder.stream("lines", value_serde="string")
        .flat_map_values(lambda line: line.split())
        .group_by(lambda _, word: word, value_serde="string", **group_by)
        .count("counts")
        .to_stream()
        .to("out", key_serde="string", value_serde="long")
    )
    return builder


def v1():
    return _count(StreamsBuilder())


def _with_alerts():
    builder = StreamsBuilder()
    builder.stream("watched", value_serde="string").to("alerts", value_serde="string")
    return builder


def shifted():
    return _count(_with_alerts())


def pinned():
    return _count(_with_alerts(), repartition_name="KSTREAM-AGGREGATE-STATE-STORE-0000000003")


def named():
    return _count(StreamsBuilder(), repartition_name="words")
"""

GENERATED = "KSTREAM-AGGREGATE-STATE-STORE-0000000003-repartition"


@pytest.fixture
def manifests(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "generated_names_app.py").write_text(TOPOLOGIES)
    paths = {}
    for function in ("v1", "shifted", "pinned", "named"):
        path = tmp_path / f"{function}.yaml"
        path.write_text(
            textwrap.dedent(
                f"""\
                apiVersion: eddyline.dev/v1alpha1
                kind: StreamApp
                metadata:
                  name: words
                spec:
                  topology: generated_names_app:{function}
                  image: example/words:1
                  replicas: 1
                  log:
                    url: sqlite:///log.db
                """
            )
        )
        paths[function] = str(path)
    return paths


def test_describe_keeps_kafkas_text_and_flags_each_generated_name_with_its_way_out(
    manifests: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["describe", manifests["v1"]]) == 0
    out, err = capsys.readouterr()
    assert out == load_topology("generated_names_app:v1", [tmp_path]).describe()
    assert "1 generated name(s)" in err
    assert f'repartition topic "{GENERATED}" (KStream.group_by)' in err
    assert 'repartition_name="<name>"' in err


def test_describe_of_a_topology_naming_everything_flags_nothing(
    manifests: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["describe", manifests["named"]]) == 0
    assert capsys.readouterr().err == ""


def test_an_upgrade_that_renumbers_a_generated_name_is_refused_naming_it(
    manifests: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["describe", manifests["shifted"], "--upgrade-from", manifests["v1"]]) == 1
    err = capsys.readouterr().err
    assert "refused (GeneratedNamesMoved)" in err
    assert f"[{GENERATED}] vanished" in err
    assert "KSTREAM-AGGREGATE-STATE-STORE-0000000005-repartition" in err
    assert 'repartition_name="KSTREAM-AGGREGATE-STATE-STORE-0000000003" keeps' in err


@pytest.mark.parametrize("new", ["v1", "pinned", "named"])
def test_upgrades_that_keep_or_drop_generated_names_are_allowed(
    new: str, manifests: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The same topology; the old generated name pinned explicitly; a new explicit name
    (its state starts empty, but nothing lands under a name meaning something else)."""
    assert main(["describe", manifests[new], "--upgrade-from", manifests["v1"]]) == 0
    assert "allowed" in capsys.readouterr().out
