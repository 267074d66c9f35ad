"""``/v1/layout`` reports each store copy's bytes on disk: a real RocksDB store written
through the engine, and the walk's cache that keeps a report cheap however often it is read."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.log import SqliteLog
from eddyline_runtime.membership import StoreRole
from eddyline_runtime.query.layout import member_report
from eddyline_runtime.state import InMemoryStore, state_directory
from eddyline_runtime.state.state_directory import DiskUsage, disk_usage
from tests.support.word_count import INPUT, STORE, produce_lines, streams_config, word_count

# A bound for a broken run on a loaded machine, not an expectation.
TIMEOUT = 60


@pytest.fixture
def instance(tmp_path: Path) -> Iterator[StreamsInstance]:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic(INPUT, 1)
    streams = StreamsInstance(
        word_count(), streams_config(tmp_path / "state", **{"num.standby.replicas": 0}), log
    )
    streams.start()
    try:
        yield streams
    finally:
        streams.close(TIMEOUT)
        log.close()


def _copy_bytes(instance: StreamsInstance) -> int | None:
    (copy,) = member_report(instance).stores[STORE].values()
    assert copy.role is StoreRole.ACTIVE
    return copy.disk_bytes


def test_a_store_copy_reports_its_bytes_on_disk_and_they_grow_with_its_data(
    instance: StreamsInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every report walks again: the test reads the size twice within the cache's age.
    monkeypatch.setattr(state_directory, "DISK_USAGE_MAX_AGE_S", 0.0)
    produce_lines(instance.log, ["a few words", "a few more words"], 1)
    instance.wait_until_caught_up(TIMEOUT)
    before = _copy_bytes(instance)
    assert before is not None and before > 0
    # Ten thousand new words: committed, their writes are in the store's files.
    produce_lines(instance.log, [f"word{i} other{i}" for i in range(5_000)], 1)
    instance.wait_until_caught_up(TIMEOUT)
    after = _copy_bytes(instance)
    assert after is not None and after > before, (before, after)


def test_the_walk_is_cached_for_its_age_and_then_done_again(tmp_path: Path) -> None:
    now = [100.0]
    usage = DiskUsage(tmp_path, max_age_s=10.0, clock=lambda: now[0])
    (tmp_path / "000001.sst").write_bytes(b"x" * 10_000)
    first = usage.bytes()
    assert first >= 10_000
    (tmp_path / "000002.sst").write_bytes(b"y" * 10_000)
    now[0] += 9.9
    assert usage.bytes() == first  # within its age: no walk
    now[0] += 0.1
    assert usage.bytes() >= first + 10_000


def test_disk_usage_counts_files_below_the_directory_and_a_missing_one_is_empty(
    tmp_path: Path,
) -> None:
    nested = tmp_path / "store" / ".ingest-1"
    nested.mkdir(parents=True)
    (nested / "000003.sst").write_bytes(b"z" * 8_192)
    (tmp_path / "store" / "CURRENT").write_text("MANIFEST-000001\n")
    assert disk_usage(tmp_path / "store") >= 8_192 + 1
    assert disk_usage(tmp_path / "gone") == 0


def test_an_in_memory_store_reports_no_size() -> None:
    assert InMemoryStore("counts").disk_bytes() is None
