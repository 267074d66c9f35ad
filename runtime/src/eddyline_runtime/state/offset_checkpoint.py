"""Kafka Streams' ``.checkpoint`` / ``.position`` files (the OffsetCheckpoint format).

Before KIP-892 a task's changelog offsets lived in ``.checkpoint`` and a
store's KIP-796 position in ``.position``, both in this text format::

    0                      <- format version
    2                      <- number of entries
    app-counts-changelog 0 4711
    app-counts-changelog 1 42

Stores that manage their own offsets import these files once on upgrade and
keep writing ``.checkpoint`` on close, so tools that read it (assignment by
lag, operators) keep working.

Kafka writes a negative offset (-4, ``OFFSET_UNKNOWN``) for a partition whose
offset it does not know; any negative offset reads as "no offset" here, never
as a position to resume from. A task-level ``.checkpoint`` names every store's
changelog: :func:`read_changelog_offsets` keeps only one store's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from eddyline_runtime.partitions import TopicPartition, is_changelog_of
from eddyline_runtime.state.errors import CheckpointFileError

CHECKPOINT_FILE_NAME = ".checkpoint"
POSITION_FILE_NAME = ".position"
_FORMAT_VERSION = 0


def read_offsets(path: Path) -> dict[TopicPartition, int]:
    """The offsets in ``path``; an empty mapping if the file does not exist."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except UnicodeDecodeError as exc:
        raise CheckpointFileError(path, f"it is not UTF-8 text: {exc.reason}") from None
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise CheckpointFileError(path, "the file is empty")
    if lines[0].strip() != str(_FORMAT_VERSION):
        raise CheckpointFileError(path, f"unknown format version {lines[0].strip()!r}")
    try:
        expected = int(lines[1])
    except (IndexError, ValueError):
        raise CheckpointFileError(path, "the entry count is missing") from None
    offsets: dict[TopicPartition, int] = {}
    entries = 0
    for number, line in enumerate(lines[2:], start=3):
        fields = line.split()
        if len(fields) != 3:
            raise CheckpointFileError(path, f"line {number} is not 'topic partition offset'")
        topic, partition, offset = fields
        try:
            tp, value = TopicPartition(topic, int(partition)), int(offset)
        except ValueError:
            raise CheckpointFileError(path, f"line {number} has a non-numeric field") from None
        entries += 1
        if value >= 0:  # negative: Kafka's sentinel for an unknown offset
            offsets[tp] = value
    if entries != expected:
        raise CheckpointFileError(path, f"{entries} entries where the header says {expected}")
    return offsets


def read_changelog_offsets(path: Path, store: str) -> dict[TopicPartition, int]:
    """The offsets in ``path`` of ``store``'s changelog (see
    :func:`~eddyline_runtime.partitions.changelog_topic`).

    Kafka Streams keeps one ``.checkpoint`` per task, naming the changelogs of
    all its stores; a store adopting another store's offset would skip that
    much of its own changelog on restore.
    """
    return {
        tp: offset for tp, offset in read_offsets(path).items() if is_changelog_of(tp.topic, store)
    }


def write_offsets(path: Path, offsets: Mapping[TopicPartition, int]) -> None:
    """Replace ``path`` atomically: a crash leaves either the old file or the new one."""
    lines = [str(_FORMAT_VERSION), str(len(offsets))]
    lines += [f"{tp.topic} {tp.partition} {offset}" for tp, offset in sorted(offsets.items())]
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
