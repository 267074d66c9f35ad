"""SST files: rebuilding a store from sorted files instead of replaying records.

A Spark restore build (``eddyline_runtime.restore``) collapses a changelog to
the latest value per key and writes each store partition's keys, sorted, as
RocksDB SST files inside its executors; a task whose store is missing then
ingests those files into a fresh store and replays only the changelog after
the offset they cover. Both ends live here, beside the store, because both
must match the store's RocksDB options: raw mode, whose comparator is
RocksDB's bytewise one (files written with rocksdict's default options carry
its own comparator, and ingest refuses them). ``rocksdict`` stays inside
``state/``; ``restore/`` calls these functions.

Crash safety, at both ends:

* :class:`SortedFileWriter` writes ``NAME.tmp`` and renames it to ``NAME``
  only when the file is finished and synced: a killed writer leaves nothing
  under a final name.
* :func:`build_store_from_sst_files` builds the store in a staging directory
  beside the target (ingest, committed offsets, flush), then renames it into
  place in one step: a crash at any instant leaves the target as it was
  (missing) or the whole new store, never a store without its offsets.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from rocksdict import IngestExternalFileOptions, Options, SstFileWriter, WriteBatch

from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.state.errors import StateStoreError
from eddyline_runtime.state.rocksdb_store import (
    _CHANGELOG_KIND,
    _EPOCH_KIND,
    _FORMAT,
    _FORMAT_KEY,
    _OFFSET,
    OFFSETS_COLUMN_FAMILY,
    _offset_key,
    _open_database,
)
from eddyline_runtime.state.state_directory import (
    DirectoryLock,
    remove_staging_directories,
    staging_directory,
)

# RocksDB's CURRENT file names the live MANIFEST: a directory without it holds no database.
_CURRENT: Final = "CURRENT"
# Staging directories sit beside the target (same filesystem: the final rename is atomic)
# and are hidden, so nothing scanning task directories mistakes one for a store.
_COPY_CHUNK_BYTES: Final = 1024 * 1024


class SstFileError(StateStoreError):
    """An SST file could not be written, or does not hold what it should."""


@dataclass(frozen=True, slots=True)
class SstFile:
    """A finished SST file: where it is, how many keys it holds, its size and checksum."""

    path: Path
    entries: int
    size: int
    sha256: str


class SortedFileWriter:
    """Writes one SST file of keys in strictly ascending bytewise order.

    ``finish()`` returns None and leaves no file when nothing was added
    (RocksDB cannot write an empty SST file, and a partition without live keys
    needs none).
    """

    def __init__(self, path: Path | str, *, store: str = "") -> None:
        self.path = Path(path)
        self.store = store
        self.entries = 0
        self._temporary = self.path.with_name(self.path.name + ".tmp")
        # Raw mode: bytes keys, bytewise comparator, as the store opens its database.
        self._writer: SstFileWriter | None = SstFileWriter(Options(raw_mode=True))
        self._writer.open(str(self._temporary))

    def add(self, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        """Append entries; every key must sort after the previous one."""
        writer = self._writer
        if writer is None:
            raise SstFileError(self.store, f"SST file {self.path} is already finished")
        try:
            for key, value in zip(keys, values, strict=True):
                writer[key] = value
        except Exception as exc:
            raise SstFileError(
                self.store,
                f'SST file {self.path} for store "{self.store}" refused an entry after '
                f"{self.entries} keys: {exc}; keys must be bytes in strictly ascending "
                "bytewise order, each once",
            ) from exc
        self.entries += len(keys)

    def finish(self) -> SstFile | None:
        """Finish, sync and rename the file; None (and no file) when it is empty."""
        writer, self._writer = self._writer, None
        if writer is None:
            raise SstFileError(self.store, f"SST file {self.path} is already finished")
        if self.entries == 0:
            del writer
            self._temporary.unlink(missing_ok=True)
            return None
        writer.finish()
        del writer
        _fsync_file(self._temporary)
        os.replace(self._temporary, self.path)
        _fsync_directory(self.path.parent)
        return SstFile(self.path, self.entries, self.path.stat().st_size, file_sha256(self.path))

    def abort(self) -> None:
        """Drop the unfinished file."""
        self._writer = None
        self._temporary.unlink(missing_ok=True)


def file_sha256(path: Path | str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_COPY_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def store_exists(directory: Path | str) -> bool:
    """Whether ``directory`` holds a RocksDB database (a lock or checkpoint file alone does not)."""
    return (Path(directory) / _CURRENT).is_file()


@dataclass(frozen=True, slots=True)
class IngestedStore:
    directory: Path
    files: int
    entries: int
    bytes: int
    # RocksDB's ingest call alone; the rest (checksums, copies, creating the database,
    # flushes, the rename) is a fixed cost per store plus a copy.
    ingest_seconds: float


def build_store_from_sst_files(
    store: str,
    directory: Path | str,
    files: Sequence[tuple[Path, str, int]],
    changelog_offsets: Mapping[TopicPartition, int],
    changelog_epochs: Mapping[TopicPartition, str] | None = None,
) -> IngestedStore:
    """Create the missing store at ``directory`` from SST files, with these committed offsets.

    ``files`` are (path, sha256, entries), in key order, not overlapping; each
    is copied into the staging directory and checked against its checksum
    there, so the files ingested are exactly the bytes checked and the source
    files stay as they were (other tasks or a retry may read them). The
    offsets are the changelog offsets of the last records the files include,
    as :meth:`RocksDBStore.commit` records them, and ``changelog_epochs`` the
    changelog incarnations they belong to (``Log.partition_epoch``), recorded
    beside them as a store records them. Refuses a directory that
    already holds a database: ingest only rebuilds a missing store.
    """
    target = Path(directory)
    if store_exists(target):
        raise StateStoreError(
            store,
            f'state store "{store}" already exists at {target}; ingest only rebuilds a '
            "missing store: delete the directory first if it must be rebuilt",
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_staging_directories(target)
    staging = staging_directory(target)
    incoming = staging.with_name(staging.name + ".files")
    try:
        incoming.mkdir()
        copies = [
            _copy_checked(store, source, incoming / f"{index:06d}.sst", sha256)
            for index, (source, sha256, _) in enumerate(files)
        ]
        ingest_seconds = _ingest(store, staging, copies, changelog_offsets, changelog_epochs or {})
        _install(store, staging, target)
    finally:
        shutil.rmtree(incoming, ignore_errors=True)
        shutil.rmtree(staging, ignore_errors=True)
    return IngestedStore(
        target,
        len(files),
        sum(entries for _, _, entries in files),
        sum(path.stat().st_size for path, _, _ in files),
        ingest_seconds,
    )


def _copy_checked(store: str, source: Path, copy: Path, sha256: str) -> Path:
    digest = hashlib.sha256()
    try:
        with open(source, "rb") as reading, open(copy, "wb") as writing:
            while chunk := reading.read(_COPY_CHUNK_BYTES):
                digest.update(chunk)
                writing.write(chunk)
    except FileNotFoundError:
        raise SstFileError(
            store, f'SST file {source} for state store "{store}" is missing; rebuild it'
        ) from None
    if digest.hexdigest() != sha256:
        raise SstFileError(
            store,
            f'SST file {source} for state store "{store}" has sha256 {digest.hexdigest()}, '
            f"not {sha256} as listed: it was changed or damaged after the build; rebuild it",
        )
    return copy


def _ingest(
    store: str,
    staging: Path,
    files: Sequence[Path],
    changelog_offsets: Mapping[TopicPartition, int],
    changelog_epochs: Mapping[TopicPartition, str],
) -> float:
    """Open a fresh database with the store's options, ingest, record the offsets, flush.

    Returns the seconds the ingest call took.
    """
    db = _open_database(store, staging)
    offsets_db = db.get_column_family(OFFSETS_COLUMN_FAMILY)
    offsets_handle = db.get_column_family_handle(OFFSETS_COLUMN_FAMILY)
    ingest_seconds = 0.0
    try:
        if files:
            options = IngestExternalFileOptions()
            # Move the staging copies in (a hard link): nothing is copied twice.
            options.set_move_files(True)
            started = time.perf_counter()
            try:
                db.ingest_external_file([str(path) for path in files], options)
            except Exception as exc:
                raise SstFileError(
                    store, f'state store "{store}": RocksDB refused the SST files: {exc}'
                ) from exc
            ingest_seconds = time.perf_counter() - started
        # Offsets, epochs and eddyline's format mark in one batch, as a store writes them.
        batch = WriteBatch(raw_mode=True)
        batch.put(_FORMAT_KEY, _FORMAT, offsets_handle)
        for tp, offset in changelog_offsets.items():
            batch.put(_offset_key(_CHANGELOG_KIND, tp), _OFFSET.pack(offset), offsets_handle)
        for tp, epoch in changelog_epochs.items():
            batch.put(_offset_key(_EPOCH_KIND, tp), epoch.encode(), offsets_handle)
        db.write(batch)
        db.flush(wait=True)
        offsets_db.flush(wait=True)
        db.flush_wal(sync=True)
    finally:
        offsets_db.close()
        db.close()
        del offsets_handle
    return ingest_seconds


def _install(store: str, staging: Path, target: Path) -> None:
    """Rename the built store into place; the one step that makes it visible."""
    if target.exists():
        # What is there holds no database (checked): a lock or checkpoint file left by a
        # store that was wiped. Hold its lock, so no process has it open, and clear it.
        lock = DirectoryLock.acquire(store, target)
        try:
            if store_exists(target):
                raise StateStoreError(
                    store, f'state store "{store}" appeared at {target} during ingest; not replaced'
                )
            shutil.rmtree(target)
        finally:
            lock.release()
    _fsync_directory(staging)
    os.replace(staging, target)
    _fsync_directory(target.parent)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def _fsync_directory(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):  # some filesystems refuse fsync on directories
            os.fsync(descriptor)
    finally:
        os.close(descriptor)
