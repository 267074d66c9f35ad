"""Ingesting a Spark restore build: a missing store rebuilt from SST files, then its tail.

A task whose store is missing (a new volume, a lost node, a store wiped after
the integrity checks) looks for a manifest of its store partition; if one
matches, it ingests the files into a fresh store in a staging directory,
records the manifest's offset, renames the store into place
(:func:`~eddyline_runtime.state.sst_files.build_store_from_sst_files`), and
then replays only the changelog after that offset. Nothing here imports
Spark: the runtime image ingests without a JVM.

A manifest is **refused** (:class:`ManifestRefusedError`, and the task
replays the changelog instead) when it was built for another application,
store or changelog partition, by another manifest format version, when its
offset is beyond the changelog's end (the changelog was reset after the
build) or before its start (records after the offset are gone, so the tail
cannot be replayed), when the changelog's records at its offset are not the
ones it read any more (truncated, rewritten, recreated or put back from a
backup since the build: judged by epochs as a store is, by
:func:`~eddyline_runtime.restore.replay.changelog_replay.replay_start`), or
when a listed file is missing or fails its checksum.
A refused or interrupted ingest leaves no store behind.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from eddyline_runtime.log import Log
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.restore.manifest import (
    ManifestError,
    ManifestRefusedError,
    RestoreManifest,
    manifests_for,
    read_manifest,
)
from eddyline_runtime.restore.replay.changelog_replay import (
    ReplayVerdict,
    recorded_epoch_end,
    replay_start,
)
from eddyline_runtime.restore.replay.restoration import RestoreResult, restore
from eddyline_runtime.state import RocksDBStore, RocksDBStoreOptions
from eddyline_runtime.state.sst_files import (
    SstFileError,
    build_store_from_sst_files,
    store_exists,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class IngestResult:
    """A store rebuilt from a manifest; replay resumes at ``offset + 1``."""

    manifest: Path
    store: str
    directory: Path
    changelog: TopicPartition
    offset: int  # the changelog offset of the last record the files include (-1: none)
    keys: int
    files: int
    bytes: int
    seconds: float  # everything: read and check the manifest, verify, build, rename
    ingest_seconds: float  # RocksDB's ingest call alone

    @property
    def keys_per_second(self) -> float:
        return self.keys / self.seconds if self.seconds > 0 else float("inf")


@dataclass(frozen=True, slots=True)
class IngestAttempt:
    """What looking for a manifest gave: the store ingested (or None) and every refusal."""

    result: IngestResult | None
    refusals: Sequence[str] = field(default_factory=tuple)


def check_manifest(
    path: Path,
    manifest: RestoreManifest,
    *,
    application: str,
    store: str,
    changelog: TopicPartition,
    log_start: int,
    log_end: int,
    changelog_epoch: str | None = None,
    epoch_end_offset: Callable[[str], int | None] | None = None,
) -> None:
    """Raise :class:`ManifestRefusedError` unless ``manifest`` fits this store partition.

    ``changelog_epoch`` is the changelog's epoch now (``Log.partition_epoch``), and
    ``epoch_end_offset`` where an earlier epoch of it ended (``Log.epoch_end_offset``
    of the partition; None: unknown, so a build of an earlier epoch is refused). A
    build is stamped with the epoch that wrote its last offset, so it is judged as a
    store is: one of an earlier epoch fits while that epoch ended after its offset
    (every new writer begins an epoch, so this is the usual case).
    """

    def refuse(reason: str) -> ManifestRefusedError:
        return ManifestRefusedError(str(path), reason)

    if manifest.application != application:
        raise refuse(f'it was built for application "{manifest.application}", not "{application}"')
    if manifest.store != store:
        raise refuse(f'it was built for store "{manifest.store}", not "{store}"')
    if manifest.changelog_partition != changelog:
        raise refuse(f"it covers changelog {manifest.changelog_partition}, not {changelog}")
    offset = manifest.offset
    # The files stand for a store committed at the manifest's offset: the one rule for
    # where replay starts judges it as it judges any store.
    start = replay_start(
        offset if offset >= 0 else None,
        log_start,
        log_end,
        store_epoch=manifest.changelog_epoch,
        log_epoch=changelog_epoch,
        store_epoch_end=recorded_epoch_end(
            manifest.changelog_epoch, changelog_epoch, epoch_end_offset
        ),
    )
    if start.verdict is ReplayVerdict.REPLACED:
        raise refuse(
            f"its offset {offset} was written in epoch {manifest.changelog_epoch} of "
            f"{changelog}, and the changelog's records there are not that epoch's any more "
            f"(epoch {changelog_epoch} now): the changelog was truncated, rewritten, "
            "recreated or put back from a backup after the build"
        )
    if start.verdict is ReplayVerdict.AHEAD:
        raise refuse(
            f"its offset {offset} is beyond the end of {changelog} (next offset {log_end}): "
            "the changelog was reset or replaced after the build"
        )
    if start.verdict is ReplayVerdict.GAP:
        raise refuse(
            f"its offset {offset} is before the start of {changelog} ({log_start}): records "
            f"{offset + 1}..{log_start - 1} after it are gone, so its tail cannot be replayed"
        )


def ingest_manifest(
    path: Path,
    *,
    application: str,
    store: str,
    changelog: TopicPartition,
    directory: Path,
    log_start: int,
    log_end: int,
    changelog_epoch: str | None = None,
    epoch_end_offset: Callable[[str], int | None] | None = None,
) -> IngestResult:
    """Check the manifest, then build the missing store at ``directory`` from its files.

    Raises :class:`ManifestRefusedError` (nothing is left behind) when the
    manifest does not fit or a file fails its checksum; ``directory`` must
    not hold a store already.
    """
    started = time.perf_counter()
    manifest = read_manifest(path)
    check_manifest(
        path,
        manifest,
        application=application,
        store=store,
        changelog=changelog,
        log_start=log_start,
        log_end=log_end,
        changelog_epoch=changelog_epoch,
        epoch_end_offset=epoch_end_offset,
    )
    files = [(path.parent / entry.name, entry.sha256, entry.keys) for entry in manifest.files]
    offsets = {changelog: manifest.offset} if manifest.offset >= 0 else {}
    epochs = (
        {changelog: manifest.changelog_epoch}
        if offsets and manifest.changelog_epoch is not None
        else {}
    )
    try:
        built = build_store_from_sst_files(store, directory, files, offsets, epochs)
    except SstFileError as error:
        raise ManifestRefusedError(str(path), str(error)) from error
    return IngestResult(
        manifest=path,
        store=store,
        directory=built.directory,
        changelog=changelog,
        offset=manifest.offset,
        keys=built.entries,
        files=built.files,
        bytes=built.bytes,
        seconds=time.perf_counter() - started,
        ingest_seconds=built.ingest_seconds,
    )


def ingest_latest_manifest(
    output: Path,
    *,
    application: str,
    store: str,
    changelog: TopicPartition,
    directory: Path,
    log_start: int,
    log_end: int,
    changelog_epoch: str | None = None,
    epoch_end_offset: Callable[[str], int | None] | None = None,
) -> IngestAttempt:
    """Ingest the newest manifest under ``output`` that fits, when the store is missing.

    Refused manifests are logged and skipped (an older build may still fit);
    with none left the caller replays the whole changelog. A store that
    exists is left alone: its own committed offset is worth more than a build.
    """
    if store_exists(directory):
        return IngestAttempt(None)
    refusals: list[str] = []
    for path in manifests_for(output, application, store, changelog.partition):
        try:
            result = ingest_manifest(
                path,
                application=application,
                store=store,
                changelog=changelog,
                directory=directory,
                log_start=log_start,
                log_end=log_end,
                changelog_epoch=changelog_epoch,
                epoch_end_offset=epoch_end_offset,
            )
        except ManifestError as error:
            logger.warning("%s", error)
            refusals.append(str(error))
            continue
        logger.info(
            'state store "%s" for %s rebuilt from %s: %d keys in %d files up to offset %d '
            "in %.2f s",
            store,
            changelog,
            path,
            result.keys,
            result.files,
            result.offset,
            result.seconds,
        )
        return IngestAttempt(result, tuple(refusals))
    return IngestAttempt(None, tuple(refusals))


@dataclass(frozen=True, slots=True)
class RebuildResult:
    """A store brought up to its changelog: from a build's files and the tail, or by replay."""

    ingested: IngestResult | None  # None: no manifest fitted (or the store existed)
    refusals: Sequence[str]
    replayed: RestoreResult  # the replay after the ingest (the tail), or the whole replay


def rebuild_store(
    store: str,
    directory: Path,
    log: Log,
    changelog: TopicPartition,
    *,
    application: str,
    output: Path,
    options: RocksDBStoreOptions | None = None,
) -> RebuildResult:
    """A task's store brought up to date, through the newest fitting build when it is missing.

    Ingests the newest manifest under ``output`` that fits (when the store is
    missing), then replays the changelog after the store's committed offset:
    after an ingest only the tail after the manifest's offset; with no
    fitting manifest, the whole changelog.
    """
    attempt = ingest_latest_manifest(
        output,
        application=application,
        store=store,
        changelog=changelog,
        directory=directory,
        log_start=log.beginning_offset(changelog),
        log_end=log.end_offset(changelog),
        changelog_epoch=log.partition_epoch(changelog),
        epoch_end_offset=partial(log.epoch_end_offset, changelog),
    )
    with RocksDBStore(store, directory, options) as opened:
        replayed = restore(opened, log, changelog)
    return RebuildResult(attempt.result, attempt.refusals, replayed)
