"""The RocksDB store's contract: read-your-writes, commit visibility, offsets, errors."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from eddyline_runtime.config import IsolationLevel
from eddyline_runtime.errors import UnknownIsolationLevelError
from eddyline_runtime.metrics import MetricsRegistry
from eddyline_runtime.state import (
    InvalidChangelogOffsetError,
    RocksDBStore,
    RocksDBStoreOptions,
    StoreClosedError,
    StoreCorruptedError,
    StoreLockedError,
    TopicPartition,
)
from tests.support.stores import StoreFactory

CHANGELOG = TopicPartition("app-counts-changelog", 0)


def test_owner_reads_its_uncommitted_writes_and_deletes(store_factory: StoreFactory) -> None:
    store = store_factory()
    store.put(b"a", b"1")
    store.commit({CHANGELOG: 0})
    store.put(b"b", b"2")
    store.delete(b"a")
    assert store.get(b"a") is None
    assert store.get(b"b") == b"2"
    assert list(store.all()) == [(b"b", b"2")]


def test_ordered_scans_merge_buffer_over_committed_data(store_factory: StoreFactory) -> None:
    store = store_factory()
    store.put_all([(b"a1", b"x"), (b"a3", b"x"), (b"b1", b"x"), (b"c", b"x")])
    store.commit({CHANGELOG: 3})
    store.put_all([(b"a2", b"new"), (b"a3", b"changed"), (b"b1", None), (b"\xff", b"top")])
    assert list(store.range(b"a2", b"b1")) == [(b"a2", b"new"), (b"a3", b"changed")]
    assert list(store.range(None, b"a2")) == [(b"a1", b"x"), (b"a2", b"new")]
    assert list(store.range(b"c", None)) == [(b"c", b"x"), (b"\xff", b"top")]
    assert list(store.range(b"z", b"a")) == []
    assert list(store.prefix_scan(b"a")) == [(b"a1", b"x"), (b"a2", b"new"), (b"a3", b"changed")]
    assert [k for k, _ in store.all()] == [b"a1", b"a2", b"a3", b"c", b"\xff"]


def test_prefix_scan_with_trailing_ff_bytes(store_factory: StoreFactory) -> None:
    store = store_factory()
    for key in (b"a\xfe", b"a\xff", b"a\xff\x00", b"a\xff\xff", b"b", b"\xff\xff\x01"):
        store.put(key, b"v")
    store.commit({})
    assert [k for k, _ in store.prefix_scan(b"a\xff")] == [b"a\xff", b"a\xff\x00", b"a\xff\xff"]
    assert [k for k, _ in store.prefix_scan(b"\xff\xff")] == [b"\xff\xff\x01"]
    assert len(list(store.prefix_scan(b""))) == 6


def test_commit_makes_writes_visible_to_read_committed_readers(store_factory: StoreFactory) -> None:
    store = store_factory()
    committed = store.reader(IsolationLevel.READ_COMMITTED)
    uncommitted = store.reader(IsolationLevel.READ_UNCOMMITTED)
    store.put(b"k", b"v1")
    assert committed.get(b"k") is None
    assert list(committed.all()) == []
    assert uncommitted.get(b"k") == b"v1"
    assert list(uncommitted.all()) == [(b"k", b"v1")]
    store.commit({CHANGELOG: 7})
    assert committed.get(b"k") == b"v1"
    store.delete(b"k")
    assert committed.get(b"k") == b"v1"
    assert uncommitted.get(b"k") is None
    assert list(uncommitted.prefix_scan(b"k")) == []


def test_reader_isolation_defaults_to_the_configured_level(store_factory: StoreFactory) -> None:
    store = store_factory(
        options=RocksDBStoreOptions(default_isolation=IsolationLevel.READ_COMMITTED)
    )
    assert store.reader().isolation is IsolationLevel.READ_COMMITTED
    assert store.reader("read_uncommitted").isolation is IsolationLevel.READ_UNCOMMITTED


def test_unknown_isolation_level_names_the_accepted_values(store_factory: StoreFactory) -> None:
    store = store_factory()
    with pytest.raises(UnknownIsolationLevelError) as error:
        store.reader("SERIALIZABLE")
    assert "'SERIALIZABLE'" in str(error.value)
    assert "'READ_UNCOMMITTED', 'READ_COMMITTED'" in str(error.value)


def test_committed_offsets_survive_reopen_and_uncommitted_writes_do_not(
    store_factory: StoreFactory, tmp_path: Path
) -> None:
    directory = tmp_path / "store"
    store = store_factory(directory=directory)
    other = TopicPartition("app-counts-changelog", 1)
    store.put(b"kept", b"1")
    store.commit({CHANGELOG: 41, other: 3})
    store.put(b"lost", b"2")
    store.close()
    reopened = store_factory(directory=directory)
    assert reopened.committed_offset(CHANGELOG) == 41
    assert reopened.committed_offset(other) == 3
    assert reopened.committed_offset(TopicPartition("elsewhere", 0)) is None
    assert list(reopened.all()) == [(b"kept", b"1")]
    assert reopened.approximate_num_uncommitted_bytes() == 0


def test_uncommitted_bytes_track_buffered_keys_and_values(store_factory: StoreFactory) -> None:
    store = store_factory()
    store.put(b"key1", b"x" * 100)
    store.put(b"key2", b"y" * 50)
    store.put(b"key1", b"z" * 10)  # an overwrite replaces, it does not add
    store.delete(b"key2")  # a tombstone still buffers its key
    assert store.approximate_num_uncommitted_bytes() == (4 + 10) + 4
    store.commit({CHANGELOG: 3})
    assert store.approximate_num_uncommitted_bytes() == 0


def test_position_is_committed_with_the_data(store_factory: StoreFactory, tmp_path: Path) -> None:
    directory = tmp_path / "store"
    store = store_factory(directory=directory)
    source = TopicPartition("clicks", 2)
    store.update_position(source, 10)
    store.put(b"k", b"v")
    assert store.position(IsolationLevel.READ_COMMITTED) == {}
    assert store.position(IsolationLevel.READ_UNCOMMITTED) == {source: 10}
    assert store.reader(IsolationLevel.READ_COMMITTED).position() == {}
    store.commit({CHANGELOG: 0})
    store.update_position(source, 11)
    assert store.position(IsolationLevel.READ_COMMITTED) == {source: 10}
    store.close()
    assert store_factory(directory=directory).position() == {source: 10}


def test_commit_rejects_negative_offsets_and_keeps_the_buffer(store_factory: StoreFactory) -> None:
    store = store_factory()
    store.put(b"k", b"v")
    with pytest.raises(InvalidChangelogOffsetError, match="app-counts-changelog-0"):
        store.commit({CHANGELOG: -1})
    assert store.get(b"k") == b"v"
    store.commit({CHANGELOG: 0})
    assert store.reader(IsolationLevel.READ_COMMITTED).get(b"k") == b"v"


def test_keys_and_values_must_be_bytes(store_factory: StoreFactory) -> None:
    store = store_factory()
    with pytest.raises(TypeError, match="serialize"):
        store.put("text", b"v")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="serialize"):
        store.put(b"k", 3)  # type: ignore[arg-type]


def test_a_closed_store_says_so(store_factory: StoreFactory) -> None:
    store = store_factory()
    reader = store.reader()
    store.close()
    store.close()  # idempotent
    for operation in (
        lambda: store.put(b"k", b"v"),
        lambda: store.get(b"k"),
        lambda: store.commit({}),
        lambda: list(store.all()),
        lambda: reader.get(b"k"),
        lambda: list(reader.all()),
    ):
        with pytest.raises(StoreClosedError, match='"counts" is closed'):
            operation()


def test_a_second_open_in_the_same_process_is_refused(store_factory: StoreFactory) -> None:
    store_factory()
    with pytest.raises(StoreLockedError, match=f"pid {os.getpid()}"):
        store_factory()


def test_a_store_held_by_another_process_names_its_pid(tmp_path: Path) -> None:
    directory = tmp_path / "held"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys
                from eddyline_runtime.state import RocksDBStore
                store = RocksDBStore("counts", {str(directory)!r})
                print("open", flush=True)
                sys.stdin.read()
                """
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(StoreLockedError) as error:
            RocksDBStore("counts", directory)
        message = str(error.value)
        assert f"locked by pid {holder.pid}" in message
        assert "stop that process, or give this instance another state.dir" in message
    finally:
        holder.communicate("")
    with RocksDBStore("counts", directory) as store:  # released when the holder exits
        assert store.is_open


def test_a_corrupted_store_says_how_to_recover(tmp_path: Path) -> None:
    directory = tmp_path / "broken"
    with RocksDBStore("counts", directory) as store:
        store.put(b"k", b"v")
        store.commit({CHANGELOG: 0})
    for manifest in directory.glob("MANIFEST-*"):
        manifest.write_bytes(b"\x00garbage" * 64)
    with pytest.raises(StoreCorruptedError) as error:
        RocksDBStore("counts", directory)
    assert '"counts"' in str(error.value)
    assert f"delete the directory {directory}" in str(error.value)
    # The failed open released the directory: after the documented fix, it opens.
    import shutil

    shutil.rmtree(directory)
    with RocksDBStore("counts", directory) as store:
        assert store.committed_offset(CHANGELOG) is None


def test_commit_metrics_use_the_kip_names(store_factory: StoreFactory) -> None:
    registry = MetricsRegistry()
    tags = {"task-id": "0_0", "thread-id": "t1"}
    store = store_factory(metrics=registry, metric_tags=tags)
    for offset in range(3):
        store.put(b"k", str(offset).encode())
        store.commit({CHANGELOG: offset})
    names = {name.name for name in registry.snapshot()}
    assert names == {"commit-rate", "commit-latency-avg", "commit-latency-max"}
    store_tags = {**tags, "rocksdb-state-id": "counts"}
    assert registry.value("stream-state-metrics", "commit-rate", store_tags) > 0
    average = registry.value("stream-state-metrics", "commit-latency-avg", store_tags)
    assert 0 < average <= registry.value("stream-state-metrics", "commit-latency-max", store_tags)
    store.close()
    assert registry.snapshot() == {}


def test_close_writes_the_checkpoint_file_for_offset_readers(tmp_path: Path) -> None:
    from eddyline_runtime.state.offset_checkpoint import read_offsets

    directory = tmp_path / "store"
    with RocksDBStore("counts", directory) as store:
        store.put(b"k", b"v")
        store.commit({CHANGELOG: 99})
    assert read_offsets(directory / ".checkpoint") == {CHANGELOG: 99}


def test_durability_bound_syncs_the_log_when_the_tail_is_long(
    store_factory: StoreFactory,
) -> None:
    from eddyline_runtime.state import DurabilityBound

    store = store_factory(options=RocksDBStoreOptions(durability=DurabilityBound(max_records=10)))
    for offset in range(0, 10, 2):
        store.put(b"k%d" % offset, b"v")
        store.commit({CHANGELOG: offset})
    # Offsets 0..8: nine records since nothing was durable; not yet past 10.
    assert store.durable_offsets == {}
    store.commit({CHANGELOG: 10})
    assert store.durable_offsets == {CHANGELOG: 10}
    store.commit({CHANGELOG: 15})
    assert store.durable_offsets == {CHANGELOG: 10}


def test_exactly_once_config_makes_readers_read_committed_by_default(
    store_factory: StoreFactory,
) -> None:
    from eddyline_runtime.config import StreamsConfig

    config = StreamsConfig.from_properties({"processing.guarantee": "exactly_once_v2"})
    store = store_factory(options=RocksDBStoreOptions.from_config(config))
    store.put(b"k", b"v")
    assert store.reader().get(b"k") is None
    assert store.reader(IsolationLevel.READ_UNCOMMITTED).get(b"k") == b"v"


def test_a_changelog_epoch_is_written_with_the_next_commit_and_survives_reopen(
    store_factory: StoreFactory, tmp_path: Path
) -> None:
    changelog = TopicPartition("app-counts-changelog", 0)
    directory = tmp_path / "epoch"
    store = store_factory(directory=directory)
    store.record_changelog_epoch(changelog, "abc:0")
    assert store.changelog_epoch(changelog) == "abc:0"  # pending, not yet durable
    store.close()
    reopened = store_factory(directory=directory)
    assert reopened.changelog_epoch(changelog) is None  # never committed
    reopened.record_changelog_epoch(changelog, "abc:0")
    reopened.restore_batch([(b"k", b"v")], {changelog: 7})
    reopened.close()
    again = store_factory(directory=directory)
    assert (again.changelog_epoch(changelog), again.committed_offset(changelog)) == ("abc:0", 7)
    assert list(again.committed_changelogs()) == [changelog]


def test_wipe_deletes_the_store_so_a_reopen_starts_empty(
    store_factory: StoreFactory, tmp_path: Path
) -> None:
    changelog = TopicPartition("app-counts-changelog", 0)
    directory = tmp_path / "wiped"
    store = store_factory(directory=directory)
    store.put(b"k", b"v")
    store.commit({changelog: 3})
    store.wipe()
    assert not directory.exists()
    assert not any(p.name.endswith(".wiping") for p in tmp_path.iterdir())
    reopened = store_factory(directory=directory)
    assert (reopened.committed_offset(changelog), dict(reopened.all())) == (None, {})
