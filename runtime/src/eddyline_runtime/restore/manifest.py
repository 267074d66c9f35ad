"""Restore manifests: what a Spark restore build promises, and where a task finds it.

A build writes, per store partition, SST files and then **one manifest**, last,
by the driver (temporary name, fsync, rename). A manifest is the only thing
that makes files usable: ingest reads exactly the files a manifest lists and
checks each one's sha256, so files of a killed or retried attempt, or of a
build that never finished, are never picked up.

Layout under a build's output directory::

    OUTPUT/<application>/<store>/<build id>/
        p00003-s00001-a00017-000.sst        store partition 3, Spark partition 1,
                                            task attempt 17, file 0 of that task
        partition-3.manifest.json           written last; names its files

Build ids start with the UTC time, so they sort by age, and end with random
digits, so two builds never share a directory: nothing ever overwrites a file
a manifest names.

Offsets follow the stores' convention: ``offset`` is the changelog offset of
the **last record the files include** (what a store records as committed);
replay of the tail starts at ``offset + 1``. ``-1`` means the build read no
record of that partition.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import secrets
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from eddyline_runtime import __version__
from eddyline_runtime.errors import EddylineError
from eddyline_runtime.partitions import TopicPartition

# Bumped when a manifest or its files change in a way older readers would misread.
MANIFEST_FORMAT_VERSION: Final = 1
MANIFEST_SUFFIX: Final = ".manifest.json"


class ManifestError(EddylineError):
    """A manifest that cannot be read, or that does not fit the store it was offered to."""


class ManifestRefusedError(ManifestError):
    """A readable manifest that does not match the store, its changelog or this runtime.

    The task then falls back to replaying the changelog.
    """

    def __init__(self, manifest: str, reason: str) -> None:
        self.manifest = manifest
        self.reason = reason
        super().__init__(
            f"restore manifest {manifest} refused: {reason}; falling back to replaying the "
            "changelog (run `eddyline restore build` again for a usable one)"
        )


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ManifestFile(_Frozen):
    """One SST file of a store partition, in key order with the others."""

    name: str = Field(description="file name inside the manifest's directory")
    sha256: str
    bytes: int = Field(ge=1)
    keys: int = Field(ge=1)


class ChangelogRef(_Frozen):
    topic: str
    partition: int = Field(ge=0)


class RestoreManifest(_Frozen):
    """What a build wrote for one store partition."""

    format_version: int
    eddyline_version: str
    build_id: str
    created_at: str
    application: str
    store: str
    changelog: ChangelogRef
    offset: int = Field(ge=-1, description="offset of the last changelog record included")
    # The changelog's bounds as the build saw them (start inclusive, end exclusive).
    log_start: int = Field(ge=0)
    log_end: int = Field(ge=0)
    # The changelog's incarnation (Log.partition_epoch) the offset belongs to, kept beside
    # it as stores keep it: a changelog truncated or recreated since the build has
    # another. None: the log cannot tell.
    changelog_epoch: str | None = None
    records_read: int = Field(ge=0, description="keyed changelog records read, every version")
    keys: int = Field(ge=0, description="live keys after keeping the latest version of each")
    files: tuple[ManifestFile, ...]

    @property
    def changelog_partition(self) -> TopicPartition:
        return TopicPartition(self.changelog.topic, self.changelog.partition)


def new_build_id() -> str:
    now = datetime.datetime.now(datetime.UTC)
    return f"{now:%Y%m%dT%H%M%SZ}-{secrets.token_hex(4)}"


def build_directory(output: Path, application: str, store: str, build_id: str) -> Path:
    return output / application / store / build_id


def manifest_name(partition: int) -> str:
    return f"partition-{partition}{MANIFEST_SUFFIX}"


def sst_name(partition: int, spark_partition: int, attempt: int, sequence: int) -> str:
    """Unique per task attempt, and sorting in key order inside a store partition."""
    return f"p{partition:05d}-s{spark_partition:05d}-a{attempt:08d}-{sequence:03d}.sst"


def write_manifest(directory: Path, manifest: RestoreManifest) -> Path:
    """Write the manifest atomically: temporary name, fsync, rename, fsync the directory."""
    path = directory / manifest_name(manifest.changelog.partition)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(manifest.model_dump_json(indent=1))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):
            os.fsync(descriptor)
    finally:
        os.close(descriptor)
    return path


def read_manifest(path: Path) -> RestoreManifest:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ManifestError(f"restore manifest {path} does not exist; check the path") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ManifestError(f"restore manifest {path} is not JSON ({exc}); rebuild it") from None
    version = document.get("format_version") if isinstance(document, dict) else None
    if version != MANIFEST_FORMAT_VERSION:
        raise ManifestRefusedError(
            str(path),
            f"it has format version {version!r} and this eddyline ({__version__}) reads "
            f"version {MANIFEST_FORMAT_VERSION}",
        )
    try:
        return RestoreManifest.model_validate(document)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ManifestError(
            f"restore manifest {path} is not valid at {where}: {first['msg']}; rebuild it"
        ) from None


def manifests_for(output: Path, application: str, store: str, partition: int) -> Iterator[Path]:
    """Every manifest a build under ``output`` wrote for this store partition, newest first."""
    root = output / application / store
    if not root.is_dir():
        return
    name = manifest_name(partition)
    for build in sorted(root.iterdir(), key=lambda entry: entry.name, reverse=True):
        candidate = build / name
        if candidate.is_file():
            yield candidate


def describe_files(manifest: RestoreManifest) -> Sequence[str]:
    return [f"{file.name} ({file.keys} keys)" for file in manifest.files]
