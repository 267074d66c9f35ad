"""Ingesting a restore manifest, and every reason a manifest is refused (no Spark needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eddyline_runtime import __version__
from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.restore.ingest.sst_restore import (
    IngestResult,
    ingest_latest_manifest,
    ingest_manifest,
    rebuild_store,
)
from eddyline_runtime.restore.manifest import (
    MANIFEST_FORMAT_VERSION,
    ChangelogRef,
    ManifestError,
    ManifestFile,
    ManifestRefusedError,
    RestoreManifest,
    build_directory,
    manifests_for,
    read_manifest,
    sst_name,
    write_manifest,
)
from eddyline_runtime.restore.replay import ReplayVerdict, judge
from eddyline_runtime.restore.spark.changelog_source import (
    ChangelogBounds,
    ChangelogShrankError,
    read_bounds,
)
from eddyline_runtime.state import KeyRange, RocksDBStore
from eddyline_runtime.state.sst_files import SortedFileWriter, store_exists

APP, STORE = "app", "counts"
CHANGELOG = TopicPartition("app-counts-changelog", 2)
ENTRIES = [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]


def make_manifest(
    output: Path,
    build_id: str = "20260101T000000Z-00000001",
    *,
    offset: int = 99,
    entries: list[tuple[bytes, bytes]] = ENTRIES,
    **overrides: object,
) -> Path:
    directory = build_directory(output, APP, STORE, build_id)
    directory.mkdir(parents=True)
    writer = SortedFileWriter(directory / sst_name(CHANGELOG.partition, 0, 1, 0), store=STORE)
    writer.add([k for k, _ in entries], [v for _, v in entries])
    finished = writer.finish()
    assert finished is not None
    fields: dict[str, object] = {
        "format_version": MANIFEST_FORMAT_VERSION,
        "eddyline_version": __version__,
        "build_id": build_id,
        "created_at": "2026-01-01T00:00:00+00:00",
        "application": APP,
        "store": STORE,
        "changelog": ChangelogRef(topic=CHANGELOG.topic, partition=CHANGELOG.partition),
        "offset": offset,
        "log_start": 0,
        "log_end": offset + 1,
        "records_read": 10,
        "keys": len(entries),
        "files": (
            ManifestFile(
                name=finished.path.name,
                sha256=finished.sha256,
                bytes=finished.size,
                keys=finished.entries,
            ),
        ),
    }
    fields.update(overrides)
    return write_manifest(directory, RestoreManifest.model_validate(fields))


def ingest(
    path: Path,
    target: Path,
    *,
    log_start: int = 0,
    log_end: int = 150,
    changelog_epoch: str | None = None,
    epoch_ends: dict[str, int] | None = None,
) -> IngestResult:
    """``epoch_ends``: where each earlier epoch ended, as ``Log.epoch_end_offset`` says."""
    return ingest_manifest(
        path,
        application=APP,
        store=STORE,
        changelog=CHANGELOG,
        directory=target,
        log_start=log_start,
        log_end=log_end,
        changelog_epoch=changelog_epoch,
        epoch_end_offset=None if epoch_ends is None else epoch_ends.get,
    )


def test_a_matching_manifest_rebuilds_the_store_with_its_offset(tmp_path: Path) -> None:
    path = make_manifest(tmp_path / "out")
    target = tmp_path / "state" / "1_2" / STORE
    result = ingest(path, target)
    assert (result.offset, result.keys, result.files) == (99, 3, 1)
    with RocksDBStore(STORE, target) as store:
        assert store.committed_offset(CHANGELOG) == 99
        assert list(store.scan(KeyRange.closed(None, None))) == ENTRIES


def test_a_manifest_is_written_atomically_and_read_back_equal(tmp_path: Path) -> None:
    path = make_manifest(tmp_path)
    assert [p.name for p in path.parent.iterdir() if p.suffix != ".sst"] == [path.name]
    manifest = read_manifest(path)
    assert (manifest.offset, manifest.keys, manifest.changelog_partition) == (99, 3, CHANGELOG)
    assert manifest.changelog_epoch is None  # kept for the integrity checks


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"application": "other"}, 'built for application "other", not "app"'),
        ({"store": "other"}, 'built for store "other", not "counts"'),
        (
            {"changelog": ChangelogRef(topic=CHANGELOG.topic, partition=0)},
            "covers changelog app-counts-changelog-0",
        ),
        (
            {"changelog": ChangelogRef(topic="app-x-changelog", partition=2)},
            "covers changelog app-x-changelog-2",
        ),
        ({"offset": 150}, "beyond the end.*reset or replaced"),
        ({"offset": 30}, r"before the start of .* \(40\): records 31\.\.39"),
    ],
)
def test_a_manifest_that_does_not_fit_is_refused_and_leaves_no_store(
    tmp_path: Path, overrides: dict[str, object], reason: str
) -> None:
    path = make_manifest(tmp_path / "out", **overrides)
    target = tmp_path / "state" / STORE
    with pytest.raises(ManifestRefusedError, match=reason) as refused:
        ingest(path, target, log_start=40)
    assert "falling back to replaying the changelog" in str(refused.value)
    assert not target.exists()


def test_a_manifest_from_another_changelog_epoch_is_refused(tmp_path: Path) -> None:
    path = make_manifest(tmp_path / "out", changelog_epoch="topic-a:0")
    target = tmp_path / "state" / STORE
    with pytest.raises(ManifestRefusedError, match=r"epoch topic-a:0 .*epoch topic-a:1 now"):
        ingest(path, target, changelog_epoch="topic-a:1")
    assert not target.exists()


def test_a_manifest_of_an_earlier_epoch_fits_while_that_epoch_ended_after_its_offset(
    tmp_path: Path,
) -> None:
    """A build is judged as a store is (KIP-101): its epoch ended after offset 99 means the
    changelog still holds the records it read; ended at or below 99, they were replaced."""
    path = make_manifest(tmp_path / "out", changelog_epoch="topic-a:0")
    target = tmp_path / "state" / STORE
    with pytest.raises(ManifestRefusedError, match=r"offset 99 was written in epoch topic-a:0"):
        ingest(path, target, changelog_epoch="topic-a:1", epoch_ends={"topic-a:0": 99})
    with pytest.raises(ManifestRefusedError, match="put back from a backup"):
        ingest(path, target, changelog_epoch="topic-a:1", epoch_ends={})  # history lost
    assert not target.exists()
    result = ingest(path, target, changelog_epoch="topic-a:1", epoch_ends={"topic-a:0": 100})
    assert result.offset == 99
    with RocksDBStore(STORE, target) as store:  # the store names the epoch its data is from
        assert store.changelog_epoch(CHANGELOG) == "topic-a:0"


def test_an_ingested_store_carries_the_manifests_changelog_epoch(tmp_path: Path) -> None:
    path = make_manifest(tmp_path / "out", changelog_epoch="topic-a:0")
    target = tmp_path / "state" / STORE
    ingest(path, target, changelog_epoch="topic-a:0")
    with RocksDBStore(STORE, target) as store:
        assert store.changelog_epoch(CHANGELOG) == "topic-a:0"
        assert store.committed_offset(CHANGELOG) == 99


def test_a_manifest_of_another_format_version_is_refused(tmp_path: Path) -> None:
    path = make_manifest(tmp_path / "out")
    document = json.loads(path.read_text())
    document["format_version"] = MANIFEST_FORMAT_VERSION + 1
    path.write_text(json.dumps(document))
    with pytest.raises(ManifestRefusedError, match=r"format version 2.*reads version 1"):
        ingest(path, tmp_path / STORE)


def test_a_manifest_whose_file_was_changed_is_refused_and_leaves_no_store(
    tmp_path: Path,
) -> None:
    path = make_manifest(tmp_path / "out")
    sst = next(path.parent.glob("*.sst"))
    data = bytearray(sst.read_bytes())
    data[len(data) // 2] ^= 0xFF
    sst.write_bytes(bytes(data))
    target = tmp_path / "state" / STORE
    with pytest.raises(ManifestRefusedError, match="changed or damaged"):
        ingest(path, target)
    assert not target.exists() and list(target.parent.iterdir()) == []


def test_a_manifest_whose_file_is_gone_is_refused(tmp_path: Path) -> None:
    path = make_manifest(tmp_path / "out")
    next(path.parent.glob("*.sst")).unlink()
    with pytest.raises(ManifestRefusedError, match="missing"):
        ingest(path, tmp_path / STORE)


def test_a_manifest_that_is_not_json_says_to_rebuild(tmp_path: Path) -> None:
    path = make_manifest(tmp_path / "out")
    path.write_text("{half")
    with pytest.raises(ManifestError, match=r"not JSON.*rebuild"):
        ingest(path, tmp_path / STORE)


def test_the_newest_fitting_manifest_is_ingested_after_refusing_newer_ones(
    tmp_path: Path,
) -> None:
    output = tmp_path / "out"
    make_manifest(output, "20260101T000000Z-00000001", offset=50, entries=[(b"old", b"1")])
    make_manifest(output, "20260102T000000Z-00000002", offset=500)  # beyond the end: refused
    assert len(list(manifests_for(output, APP, STORE, CHANGELOG.partition))) == 2
    target = tmp_path / "state" / STORE
    attempt = ingest_latest_manifest(
        output,
        application=APP,
        store=STORE,
        changelog=CHANGELOG,
        directory=target,
        log_start=0,
        log_end=150,
    )
    assert attempt.result is not None and attempt.result.offset == 50
    assert len(attempt.refusals) == 1 and "beyond the end" in attempt.refusals[0]
    with RocksDBStore(STORE, target) as store:
        assert store.get(b"old") == b"1"


def test_no_manifest_is_ingested_over_an_existing_store(tmp_path: Path) -> None:
    output = tmp_path / "out"
    make_manifest(output)
    target = tmp_path / STORE
    with RocksDBStore(STORE, target) as store:
        store.put(b"mine", b"1")
        store.commit({CHANGELOG: 120})
    attempt = ingest_latest_manifest(
        output,
        application=APP,
        store=STORE,
        changelog=CHANGELOG,
        directory=target,
        log_start=0,
        log_end=150,
    )
    assert (attempt.result, attempt.refusals) == (None, ())
    assert store_exists(target)
    with RocksDBStore(STORE, target) as store:
        assert (store.get(b"mine"), store.get(b"a")) == (b"1", None)


def test_rebuilding_a_missing_store_ingests_then_replays_only_the_tail(tmp_path: Path) -> None:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic(CHANGELOG.topic, 3, compacted=True)
    log.produce(CHANGELOG, [Record(b"a", b"1", 0), Record(b"b", b"2", 0), Record(b"a", None, 0)])
    # A build covering offsets 0..2 holds b only; the tail deletes b and adds c.
    make_manifest(tmp_path / "out", offset=2, entries=[(b"b", b"2")])
    log.produce(CHANGELOG, [Record(b"b", None, 0), Record(b"c", b"3", 0)])
    target = tmp_path / "state" / STORE
    rebuilt = rebuild_store(STORE, target, log, CHANGELOG, application=APP, output=tmp_path / "out")
    assert rebuilt.ingested is not None and rebuilt.ingested.offset == 2
    assert (rebuilt.replayed.first_offset, rebuilt.replayed.records) == (3, 2)
    with RocksDBStore(STORE, target) as store:
        assert list(store.scan(KeyRange.closed(None, None))) == [(b"c", b"3")]
        assert store.committed_offset(CHANGELOG) == 4
    log.close()


def test_rebuilding_with_only_refused_manifests_replays_the_whole_changelog(
    tmp_path: Path,
) -> None:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic(CHANGELOG.topic, 3, compacted=True)
    log.produce(CHANGELOG, [Record(b"a", b"1", 0), Record(b"b", b"2", 0)])
    make_manifest(tmp_path / "out", offset=7)  # beyond the changelog's end
    target = tmp_path / "state" / STORE
    rebuilt = rebuild_store(STORE, target, log, CHANGELOG, application=APP, output=tmp_path / "out")
    assert rebuilt.ingested is None and len(rebuilt.refusals) == 1
    assert (rebuilt.replayed.first_offset, rebuilt.replayed.records) == (0, 2)
    with RocksDBStore(STORE, target) as store:
        assert list(store.scan(KeyRange.closed(None, None))) == [(b"a", b"1"), (b"b", b"2")]
    log.close()


def build_from(log: SqliteLog, output: Path) -> int:
    """A build of the changelog as it is now, stamped as a Spark build stamps it (the epoch
    that wrote its last offset: ``read_bounds``); returns its offset."""
    bounds = read_bounds(log, CHANGELOG)
    make_manifest(
        output,
        offset=bounds.end - 1,
        entries=[(b"b", b"2")],
        changelog_epoch=bounds.epoch,
        log_end=bounds.end,
    )
    return bounds.end - 1


def test_a_build_made_before_the_next_writer_began_its_epoch_is_ingested(
    tmp_path: Path,
) -> None:
    """The case that refused every Spark build: a task begins a new epoch at the changelog's
    end when it starts (docs/state.md, "Epochs"), so a build is always of an earlier
    epoch by the time a store needs it. It still holds what the changelog holds."""
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic(CHANGELOG.topic, 3, compacted=True)
    log.start_epoch(CHANGELOG)  # the writer of the records the build reads
    log.produce(CHANGELOG, [Record(b"a", b"1", 0), Record(b"b", b"2", 0), Record(b"a", None, 0)])
    offset = build_from(log, tmp_path / "out")
    log.start_epoch(CHANGELOG)  # the task restarted, or moved to another pod
    log.produce(CHANGELOG, [Record(b"c", b"3", 0)])
    target = tmp_path / "state" / STORE
    rebuilt = rebuild_store(STORE, target, log, CHANGELOG, application=APP, output=tmp_path / "out")
    assert rebuilt.refusals == ()
    assert rebuilt.ingested is not None and rebuilt.ingested.offset == offset == 2
    assert (rebuilt.replayed.first_offset, rebuilt.replayed.records) == (3, 1)
    log.start_epoch(CHANGELOG)  # the task starts on the rebuilt store: it resumes
    with RocksDBStore(STORE, target) as store:
        assert list(store.scan(KeyRange.closed(None, None))) == [(b"b", b"2"), (b"c", b"3")]
        # The tail it replayed was written in a later epoch than the build's: the store
        # names that one, so the offset it holds is its epoch's (else it is REPLACED).
        assert store.changelog_epoch(CHANGELOG) == log.epoch_at(CHANGELOG, 3)
        assert judge(store, log, CHANGELOG).verdict is ReplayVerdict.CAUGHT_UP
    log.close()


def test_a_build_of_records_the_changelog_lost_is_refused_though_it_grew_back(
    tmp_path: Path,
) -> None:
    """A build of offsets 0..4, then the changelog put back to offset 2 and written again
    past 4 by a new writer: offsets 2..4 are other records now, so the build is refused."""
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic(CHANGELOG.topic, 3, compacted=True)
    log.start_epoch(CHANGELOG)
    log.produce(CHANGELOG, [Record(b"k%d" % i, b"v", 0) for i in range(5)])
    build_from(log, tmp_path / "out")
    log.truncate(CHANGELOG, 2)
    log.start_epoch(CHANGELOG)
    log.produce(CHANGELOG, [Record(b"x%d" % i, b"w", 0) for i in range(5)])
    target = tmp_path / "state" / STORE
    rebuilt = rebuild_store(STORE, target, log, CHANGELOG, application=APP, output=tmp_path / "out")
    assert rebuilt.ingested is None and len(rebuilt.refusals) == 1
    assert "offset 4 was written in epoch" in rebuilt.refusals[0]
    assert rebuilt.replayed.first_offset == 0
    log.close()


def test_bounds_read_while_the_changelog_shrinks_stop_the_build(tmp_path: Path) -> None:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic(CHANGELOG.topic, 3, compacted=True)
    log.produce(CHANGELOG, [Record(b"k%d" % i, b"v", 0) for i in range(5)])
    assert read_bounds(log, CHANGELOG) == ChangelogBounds(0, 5, log.epoch_at(CHANGELOG, 4))
    log.truncate(CHANGELOG, 2)  # after the build read its end (5)
    with pytest.raises(ChangelogShrankError, match=r"ended at offset 5 and then lost records"):
        read_bounds(log, CHANGELOG, end=5)
    log.close()
