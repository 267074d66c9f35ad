"""SST files: written sorted, renamed when finished, ingested into a fresh store with its offset."""

from __future__ import annotations

from pathlib import Path

import pytest

from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.state import KeyRange, RocksDBStore, StateStoreError
from eddyline_runtime.state.sst_files import (
    SortedFileWriter,
    SstFile,
    SstFileError,
    build_store_from_sst_files,
    file_sha256,
    store_exists,
)

CHANGELOG = TopicPartition("app-counts-changelog", 0)
EVERYTHING = KeyRange.closed(None, None)


def write_file(path: Path, entries: list[tuple[bytes, bytes]]) -> SstFile:
    writer = SortedFileWriter(path, store="counts")
    writer.add([k for k, _ in entries], [v for _, v in entries])
    finished = writer.finish()
    assert finished is not None
    return finished


def listed(*files: SstFile) -> list[tuple[Path, str, int]]:
    return [(f.path, f.sha256, f.entries) for f in files]


def test_a_finished_file_has_its_final_name_checksum_and_entry_count(tmp_path: Path) -> None:
    finished = write_file(tmp_path / "a.sst", [(b"", b"empty key"), (b"a", b"1"), (b"\xff", b"2")])
    assert finished.entries == 3
    assert finished.sha256 == file_sha256(tmp_path / "a.sst")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.sst"]


def test_an_unfinished_file_exists_only_under_a_temporary_name(tmp_path: Path) -> None:
    writer = SortedFileWriter(tmp_path / "a.sst", store="counts")
    writer.add([b"a"], [b"1"])
    assert [p.name for p in tmp_path.iterdir()] == ["a.sst.tmp"]
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_a_file_without_entries_is_not_written(tmp_path: Path) -> None:
    assert SortedFileWriter(tmp_path / "a.sst", store="counts").finish() is None
    assert list(tmp_path.iterdir()) == []


def test_keys_out_of_order_or_repeated_are_refused_with_the_store_named(tmp_path: Path) -> None:
    writer = SortedFileWriter(tmp_path / "a.sst", store="counts")
    writer.add([b"b"], [b"1"])
    with pytest.raises(SstFileError, match=r'store "counts".*strictly ascending'):
        writer.add([b"a"], [b"2"])
    writer.abort()


def test_a_store_built_from_files_holds_their_entries_and_the_committed_offset(
    tmp_path: Path,
) -> None:
    first = write_file(tmp_path / "1.sst", [(b"a", b"1"), (b"b", b"2")])
    second = write_file(tmp_path / "2.sst", [(b"c", b"3"), (b"\x80", b"4")])
    target = tmp_path / "0_0" / "counts"
    built = build_store_from_sst_files("counts", target, listed(first, second), {CHANGELOG: 41})
    assert (built.files, built.entries) == (2, 4)
    # The sources stay (another task or a retry may read them); no staging is left.
    assert first.path.exists() and second.path.exists()
    assert [p.name for p in target.parent.iterdir()] == ["counts"]
    with RocksDBStore("counts", target) as store:
        assert store.committed_offset(CHANGELOG) == 41
        assert list(store.scan(EVERYTHING)) == [
            (b"a", b"1"),
            (b"b", b"2"),
            (b"c", b"3"),
            (b"\x80", b"4"),
        ]
        store.put(b"d", b"5")  # an ordinary store from here on
        store.commit({CHANGELOG: 42})
    with RocksDBStore("counts", target) as store:
        assert (store.get(b"d"), store.committed_offset(CHANGELOG)) == (b"5", 42)


def test_a_store_built_from_no_files_is_empty_with_the_offset(tmp_path: Path) -> None:
    target = tmp_path / "counts"
    build_store_from_sst_files("counts", target, [], {CHANGELOG: 9})
    with RocksDBStore("counts", target) as store:
        assert (list(store.scan(EVERYTHING)), store.committed_offset(CHANGELOG)) == ([], 9)


def test_a_file_that_fails_its_checksum_leaves_no_store(tmp_path: Path) -> None:
    good = write_file(tmp_path / "1.sst", [(b"a", b"1")])
    bad = write_file(tmp_path / "2.sst", [(b"b", b"2")])
    target = tmp_path / "0_0" / "counts"
    with pytest.raises(SstFileError, match=r"2\.sst.*sha256.*changed or damaged"):
        build_store_from_sst_files(
            "counts", target, [*listed(good), (bad.path, "0" * 64, 1)], {CHANGELOG: 1}
        )
    assert not target.exists()
    assert list(target.parent.iterdir()) == []


def test_a_missing_file_leaves_no_store(tmp_path: Path) -> None:
    target = tmp_path / "counts"
    with pytest.raises(SstFileError, match="missing"):
        build_store_from_sst_files("counts", target, [(tmp_path / "x.sst", "0", 1)], {})
    assert not target.exists()


def test_an_existing_store_is_never_replaced(tmp_path: Path) -> None:
    target = tmp_path / "counts"
    with RocksDBStore("counts", target) as store:
        store.put(b"old", b"1")
        store.commit({CHANGELOG: 3})
    source = write_file(tmp_path / "1.sst", [(b"new", b"2")])
    with pytest.raises(StateStoreError, match="already exists"):
        build_store_from_sst_files("counts", target, listed(source), {CHANGELOG: 9})
    with RocksDBStore("counts", target) as store:
        assert (store.get(b"old"), store.get(b"new")) == (b"1", None)


def test_a_wiped_store_directory_holding_only_its_lock_is_rebuilt(tmp_path: Path) -> None:
    target = tmp_path / "counts"
    target.mkdir()
    (target / "eddyline.lock").write_text("123")
    assert not store_exists(target)
    source = write_file(tmp_path / "1.sst", [(b"a", b"1")])
    build_store_from_sst_files("counts", target, listed(source), {CHANGELOG: 0})
    with RocksDBStore("counts", target) as store:
        assert store.get(b"a") == b"1"


def test_a_store_directory_held_open_is_not_touched(tmp_path: Path) -> None:
    target = tmp_path / "counts"
    source = write_file(tmp_path / "1.sst", [(b"a", b"1")])
    with RocksDBStore("counts", target) as store:
        # Open but empty (no CURRENT yet would be a wiped store): RocksDB has created it.
        assert store_exists(target)
        with pytest.raises(StateStoreError):
            build_store_from_sst_files("counts", target, listed(source), {CHANGELOG: 0})
        assert store.get(b"a") is None


def test_leftovers_of_an_interrupted_ingest_are_removed_by_the_next(tmp_path: Path) -> None:
    target = tmp_path / "counts"
    leftover = tmp_path / ".ingest-counts-dead1234"
    (leftover / "sub").mkdir(parents=True)
    source = write_file(tmp_path / "1.sst", [(b"a", b"1")])
    build_store_from_sst_files("counts", target, listed(source), {CHANGELOG: 0})
    assert not leftover.exists()
