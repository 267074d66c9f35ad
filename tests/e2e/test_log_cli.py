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
    produce = ["log", "--log", url, "produce", "words", "--partition", "0", "--key-separator", ":"]
    assert main(produce, stdin=lines) == 0
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


def test_produce_spreads_by_key_as_kafka_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from eddyline_runtime.partitions import partition_for_key

    url = f"sqlite:///{tmp_path / 'log.db'}"
    assert main(["log", "--log", url, "create-topic", "users", "--partitions", "3"]) == 0
    keys = [f"user-{i}" for i in range(12)]
    lines = io.StringIO("".join(f"{key}:v\n" for key in keys) + "keyless\nkeyless\nkeyless\n")
    assert main(["log", "--log", url, "produce", "users", "--key-separator", ":"], stdin=lines) == 0
    capsys.readouterr()
    for partition in range(3):
        main(["log", "--log", url, "consume", "users", "--partition", str(partition)])
        printed = [line.split("\t")[1] for line in capsys.readouterr().out.splitlines()]
        wanted = [key for key in keys if partition_for_key(key.encode(), 3) == partition]
        assert printed == [*wanted, ""]  # one keyless line per partition, round-robin
