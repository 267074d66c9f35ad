"""An instance starts no more stream threads than its topology has tasks.

``num.stream.threads`` above the task count used to start a thread per
setting, each with its own buffers, however many had nothing to do.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.log import SqliteLog
from eddyline_runtime.partitions import TopicPartition
from tests.support.word_count import INPUT, OUTPUT, produce_lines, streams_config, word_count


def test_threads_beyond_the_task_count_are_not_started(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic(INPUT, 1)  # 1 input partition: 2 tasks (split, count)
    config = streams_config(tmp_path / "state", **{"num.stream.threads": 8})
    instance = StreamsInstance(word_count(), config, log)
    try:
        with caplog.at_level(logging.INFO):
            instance.start()
        assert instance.layout is not None
        tasks = len(instance.layout.tasks())
        assert tasks == 2
        assert len(instance.threads) == tasks
        assert "starting 2 stream threads, not num.stream.threads=8" in caplog.text
        produce_lines(log, ["a b a", "b a"], 1)
        instance.wait_until_caught_up(30)
        output = TopicPartition(OUTPUT, 0)
        published = log.fetch(output, 0, 100).records
        final = {r.key: r.value for r in published}  # the last count of each word wins
        assert final == {b"a": (3).to_bytes(8, "big"), b"b": (2).to_bytes(8, "big")}
    finally:
        instance.close(30)
        log.close()
