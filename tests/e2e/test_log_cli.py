"""`eddyline log`: create, produce, consume and list topics on the embedded log."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from eddyline_runtime.cli import main


def test_produce_then_consume_round_trips(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    assert main(["log", "--log", url, "create-topic", "words", "--partitions", "2"]) == 0
    lines = io.StringIO("a:apple\nb:banana\nplain\n")
    assert main(["log", "--log", url, "produce", "words", "--key-separator", ":"], stdin=lines) == 0
    assert main(["log", "--log", url, "consume", "words", "--offset", "1"]) == 0
    assert main(["log", "--log", url, "topics"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["1\tb\tbanana", "2\t\tplain", "words\t2 partitions"]


def test_unknown_topic_is_an_error_that_lists_topics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    main(["log", "--log", url, "create-topic", "words"])
    assert main(["log", "--log", url, "consume", "wrods"]) == 1
    assert 'topic "wrods" does not exist (topics: words)' in capsys.readouterr().err


def test_consume_prints_through_serdes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from eddyline_runtime.log import Record, SqliteLog
    from eddyline_runtime.partitions import TopicPartition
    from eddyline_runtime.serde import serde_for

    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("counts", 1)
    log.produce(TopicPartition("counts", 0), [Record(b"fox", serde_for("long").serialize(42), 0)])
    log.close()
    url = f"sqlite:///{tmp_path / 'log.db'}"
    assert main(["log", "--log", url, "consume", "counts", "--value-serde", "long"]) == 0
    assert capsys.readouterr().out == "0\tfox\t42\n"
    assert main(["log", "--log", url, "consume", "counts", "--value-serde", "longg"]) == 1
    assert "'long'" in capsys.readouterr().err
