"""How current a closed store copy was, kept beside it for its next open (``.as-of``).

A query reports how stale a copy's data is (``as_of_ms``, query/staleness.py): the
copy includes every write its task committed by then. A running copy knows it; one
that reopens behind its changelog did not, until it first caught up again, so a
standby or a restoring active copy answered no ``max_staleness_ms`` query after a
restart however recent its data. Its owner knew, at close, when the copy last had
everything (an active's last commit, a standby's last time at its changelog's end):
the store writes that time here, with the changelog offsets it committed, when it
closes, and its next open reads it.

Not in the store's ``offsets`` column family, where the offsets live: the reader of
the release before this one takes any key kind it does not know there for a
position, so a rollback would show a bogus position. Here, an older release
ignores the file. The rules that keep it from ever naming a time too new:

* written only on a clean close (after the last commit), from the offsets then
  committed: a copy killed mid-run leaves no file of that run;
* read once and removed at open, before anything can change the store: whatever
  follows (a crash, a wipe, an ingest) finds no file;
* trusted only if its offsets are exactly the store's committed ones at open; a
  torn or foreign file (a machine crash mid-write) reads as none.

Its data can only grow from then on in changelog order, so the time stays a lower
bound for as long as the copy replays: the engine uses it as the copy's
``LagInfo.caught_up_at_ms`` until the copy catches up again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from eddyline_runtime.partitions import TopicPartition

logger = logging.getLogger(__name__)

AS_OF_FILE_NAME = ".as-of"


def write_as_of(directory: Path, offsets: Mapping[TopicPartition, int], as_of_ms: int) -> None:
    """Record that the store's data at ``offsets`` includes every write committed by
    ``as_of_ms``; replaced in one rename, so a reader finds the old file, the new one,
    or (after a machine crash) one it cannot parse and ignores."""
    document = {
        "as_of_ms": as_of_ms,
        "changelog_offsets": [[tp.topic, tp.partition, o] for tp, o in sorted(offsets.items())],
    }
    path = directory / AS_OF_FILE_NAME
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(document), encoding="utf-8")
    os.replace(temporary, path)


def take_as_of(directory: Path, committed: Mapping[TopicPartition, int]) -> int | None:
    """The recorded time if its offsets are ``committed`` exactly, else None; the file is
    removed either way (see the module docstring)."""
    path = directory / AS_OF_FILE_NAME
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        logger.info("ignoring %s: %s", path, error)
        text = ""
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    try:
        document = json.loads(text)
        recorded = {
            TopicPartition(str(topic), int(partition)): int(offset)
            for topic, partition, offset in document["changelog_offsets"]
        }
        as_of_ms = int(document["as_of_ms"])
    except (ValueError, TypeError, KeyError):
        return None
    if not recorded or recorded != dict(committed):
        return None
    return as_of_ms
