"""Upgrading from pre-KIP-892 stores: offsets move from files into the store."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from rocksdict import Options, Rdict

from eddyline_runtime.state import (
    CheckpointFileError,
    RocksDBStore,
    StateStoreError,
    StoreCorruptedError,
    TopicPartition,
)
from eddyline_runtime.state.offset_checkpoint import read_offsets, write_offsets
from eddyline_runtime.state.rocksdb_store import OFFSETS_COLUMN_FAMILY

CHANGELOG = TopicPartition("app-counts-changelog", 3)
SOURCE = TopicPartition("words", 3)


def make_legacy_store(directory: Path) -> None:
    """A store as Kafka Streams left it: data in the default column family, offsets in files."""
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    db = Rdict(str(directory), options)
    db.put(b"apple", b"3")
    db.put(b"kiwi", b"1")
    db.close()
    write_offsets(directory / ".checkpoint", {CHANGELOG: 120})
    write_offsets(directory / ".position", {SOURCE: 77})


def test_legacy_offsets_are_imported_and_the_position_file_removed(tmp_path: Path) -> None:
    directory = tmp_path / "3_3" / "counts"
    directory.mkdir(parents=True)
    make_legacy_store(directory)
    with RocksDBStore("counts", directory) as store:
        assert store.committed_offset(CHANGELOG) == 120
        assert store.position() == {SOURCE: 77}
        assert dict(store.all()) == {b"apple": b"3", b"kiwi": b"1"}
        assert not (directory / ".position").exists()
        assert read_offsets(directory / ".checkpoint") == {CHANGELOG: 120}
    # The import is durable: with both files gone, the offsets are still there.
    (directory / ".checkpoint").unlink()
    with RocksDBStore("counts", directory) as store:
        assert store.committed_offset(CHANGELOG) == 120
        assert store.position() == {SOURCE: 77}


def test_files_are_ignored_once_the_store_manages_offsets(tmp_path: Path) -> None:
    directory = tmp_path / "counts"
    with RocksDBStore("counts", directory) as store:
        store.put(b"k", b"v")
        store.update_position(SOURCE, 500)
        store.commit({CHANGELOG: 200})
    write_offsets(directory / ".checkpoint", {CHANGELOG: 5})
    write_offsets(directory / ".position", {SOURCE: 1})
    with RocksDBStore("counts", directory) as store:
        assert store.committed_offset(CHANGELOG) == 200
        assert store.position() == {SOURCE: 500}
        assert not (directory / ".position").exists()
    # .checkpoint is rewritten on close from the store's own offsets.
    assert read_offsets(directory / ".checkpoint") == {CHANGELOG: 200}


def test_an_unreadable_checkpoint_file_names_itself(tmp_path: Path) -> None:
    directory = tmp_path / "counts"
    directory.mkdir()
    make_legacy_store(directory)
    (directory / ".checkpoint").write_text("0\n1\napp-counts-changelog three 4\n")
    with pytest.raises(CheckpointFileError) as error:
        RocksDBStore("counts", directory)
    assert str(directory / ".checkpoint") in str(error.value)
    assert "delete it" in str(error.value)
    (directory / ".checkpoint").unlink()
    with RocksDBStore("counts", directory) as store:  # the failed open released the lock
        assert store.committed_offset(CHANGELOG) is None


def test_a_database_created_now_never_adopts_a_checkpoint_left_beside_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "counts"
    with RocksDBStore("counts", directory) as store:
        store.put(b"apple", b"16568")
        store.commit({CHANGELOG: 41})
    for entry in directory.iterdir():  # the store's files deleted, its hidden file kept
        if entry.name != ".checkpoint":
            entry.unlink()
    with caplog.at_level(logging.WARNING), RocksDBStore("counts", directory) as store:
        assert store.committed_offset(CHANGELOG) is None  # restored from the changelog
        assert store.get(b"apple") is None
    assert "ignoring .checkpoint" in caplog.text
    assert "created by this open" in caplog.text
    assert not (directory / ".checkpoint").exists()


def test_a_database_rocksdb_recreated_after_losing_current_is_not_trusted(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "counts"
    with RocksDBStore("counts", directory) as store:
        store.put(b"apple", b"16568")
        store.commit({CHANGELOG: 41})
    (directory / "CURRENT").unlink()
    with pytest.raises(StoreCorruptedError, match="delete the directory"):
        RocksDBStore("counts", directory)
    # The failed open left a fresh, empty database behind; it is not caught up at 41.
    with RocksDBStore("counts", directory) as store:
        assert store.committed_offset(CHANGELOG) is None
        assert dict(store.all()) == {}


def test_a_legacy_database_without_data_does_not_adopt_its_checkpoint(tmp_path: Path) -> None:
    directory = tmp_path / "counts"
    directory.mkdir()
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    Rdict(str(directory), options).close()
    write_offsets(directory / ".checkpoint", {CHANGELOG: 120})
    with RocksDBStore("counts", directory) as store:
        assert store.committed_offset(CHANGELOG) is None


def test_a_formatted_store_never_adopts_files_even_without_offsets(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "counts"
    with RocksDBStore("counts", directory) as store:
        store.put(b"k", b"v")
        store.commit({})
    write_offsets(directory / ".checkpoint", {CHANGELOG: 120})
    with caplog.at_level(logging.WARNING), RocksDBStore("counts", directory) as store:
        assert store.committed_offset(CHANGELOG) is None
        assert store.get(b"k") == b"v"
    # The warning says why for this store: not "created now, or holds no data" (it holds data).
    assert "eddyline formatted this database" in caplog.text
    assert "holds no data" not in caplog.text


def test_checkpoint_format_round_trips_kafka_layout(tmp_path: Path) -> None:
    path = tmp_path / ".checkpoint"
    write_offsets(path, {TopicPartition("b", 1): 9, TopicPartition("a", 0): 12})
    assert path.read_text() == "0\n2\na 0 12\nb 1 9\n"
    assert read_offsets(path) == {TopicPartition("a", 0): 12, TopicPartition("b", 1): 9}
    assert read_offsets(tmp_path / "missing") == {}


def test_negative_checkpoint_offsets_mean_no_offset(tmp_path: Path) -> None:
    path = tmp_path / ".checkpoint"
    path.write_text("0\n2\napp-counts-changelog 0 -4\napp-counts-changelog 1 42\n")
    assert read_offsets(path) == {TopicPartition("app-counts-changelog", 1): 42}


def test_a_store_adopts_only_its_own_changelogs_checkpoint_offsets(tmp_path: Path) -> None:
    directory = tmp_path / "3_3" / "counts"
    make_legacy_store(directory)
    other = TopicPartition("app-totals-changelog", 3)
    write_offsets(
        directory / ".checkpoint",
        {CHANGELOG: 120, other: 999, TopicPartition("app-counts-changelog", 4): -4},
    )
    with RocksDBStore("counts", directory) as store:
        assert store.committed_offset(CHANGELOG) == 120
        assert store.committed_offset(other) is None
        assert store.committed_offset(TopicPartition("app-counts-changelog", 4)) is None


def test_a_checkpoint_file_that_is_not_utf8_names_itself(tmp_path: Path) -> None:
    path = tmp_path / ".checkpoint"
    path.write_bytes(b"0\n1\napp-counts-changelog 0 \xff\xfe\n")
    with pytest.raises(CheckpointFileError, match="not UTF-8") as error:
        read_offsets(path)
    assert str(path) in str(error.value)


@pytest.mark.parametrize("in_the_way", ["counts", "task"])
def test_a_file_where_the_store_directory_goes_is_named(tmp_path: Path, in_the_way: str) -> None:
    """Not a raw "[Errno 17] File exists": the store, the file in the way, and what to do."""
    (tmp_path / in_the_way).write_text("not a directory")
    directory = tmp_path / "task" / "counts" if in_the_way == "task" else tmp_path / "counts"
    with pytest.raises(StateStoreError) as refused:
        RocksDBStore("counts", directory)
    message = str(refused.value)
    assert f"{tmp_path / in_the_way} is a file" in message, message
    assert "move it out" in message


def test_entries_of_a_later_release_are_kept_and_never_read_as_offsets(tmp_path: Path) -> None:
    """A rollback to this release must not take a newer release's entries for positions."""
    directory = tmp_path / "counts"
    with RocksDBStore("counts", directory) as store:
        store.put(b"k", b"v")
        store.update_position(SOURCE, 500)
        store.commit({CHANGELOG: 200})
    later = {b"m:as-of": b"1764300000000", b"x\x00\x00\x00\x03words": b"\x00" * 8}
    options = Options(raw_mode=True)
    db = Rdict(str(directory), options, column_families={OFFSETS_COLUMN_FAMILY: options})
    offsets = db.get_column_family(OFFSETS_COLUMN_FAMILY)
    for key, value in later.items():
        offsets[key] = value
    offsets.close()
    db.close()
    with RocksDBStore("counts", directory) as store:
        assert store.position() == {SOURCE: 500}
        assert store.committed_offset(CHANGELOG) == 200
        store.put(b"k", b"w")
        store.commit({CHANGELOG: 201})
    db = Rdict(str(directory), options, column_families={OFFSETS_COLUMN_FAMILY: options})
    offsets = db.get_column_family(OFFSETS_COLUMN_FAMILY)
    try:
        assert {key: offsets[key] for key in later} == later
    finally:
        offsets.close()
        db.close()
