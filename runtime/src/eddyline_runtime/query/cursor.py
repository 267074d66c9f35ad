"""Page cursors of ``/range``, ``/all``, ``/windows`` and ``/sessions``, and what a cursor
may continue on after a task moved.

A cursor names a *key position* (the last entry served: its key, and for windows and
sessions its two times), never a copy: any copy of the same store partitions continues
it, so a page may come from another member than the one before it (a one-key window or
session query is routed again when its copy went away, query/client.py).

A query over every key reads every copy the answering member serves, so its cursor also
names the partitions its first page read (``partitions``). A later page reads exactly
those: when this member no longer serves one of them (its task moved away, or its copy
fell beyond the query's ``max_staleness_ms``), continuing would silently leave out the
rest of that partition, so the page is refused with 410 Gone and the error says to
start the query again without a cursor (:class:`CursorMovedError`). A partition this
member serves now but the cursor does not name is listed in ``skipped_partitions``: a
router reads it elsewhere or in a new query.

The text form is ``P1.P2...~KEYPOSITION``: the partitions (empty for a one-key query),
``~``, then the key position in URL-safe base64 without padding. ``~`` and ``.`` are
outside base64's URL alphabet, so a cursor of the earlier form (the bare key position)
is recognised and refused with the same "start again" advice instead of being misread.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from dataclasses import dataclass

from eddyline_runtime.errors import EddylineError, InvalidArgumentError

# The query parameter a router names the partitions it read elsewhere in (a page over every
# key leaves them out, so two members never both answer one partition).
EXCLUDE_PARTITIONS_PARAMETER = "exclude_partitions"
# Separates a cursor's partitions from its key position.
_SEPARATOR = "~"


@dataclass(frozen=True)
class PageCursor:
    """Where the next page starts: after ``after`` (a key position), reading exactly
    ``partitions`` (None: a one-key query, whose partition the key gives)."""

    after: bytes
    partitions: tuple[int, ...] | None = None

    def text(self) -> str:
        named = "" if self.partitions is None else ".".join(str(p) for p in self.partitions)
        position = base64.urlsafe_b64encode(self.after).decode().rstrip("=")
        return f"{named}{_SEPARATOR}{position}"


def parse_cursor(raw: str, *, every_key: bool) -> PageCursor:
    """A cursor as :meth:`PageCursor.text` wrote it; :class:`InvalidArgumentError`
    naming the way out otherwise. ``every_key``: the query reads every key (its cursor
    names partitions), else one key (its cursor names none)."""
    named, separator, position = raw.partition(_SEPARATOR)
    after = _decoded(position) if separator else b""
    partitions: tuple[int, ...] | None = None
    if named:
        parts = named.split(".")
        partitions = tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else ()
    if not after or partitions == () or (partitions is not None) != every_key:
        raise InvalidArgumentError(
            f'cursor "{raw}" is not one this server returned for this query (or one from '
            "before an upgrade); pass the next_cursor of the previous page unchanged, or "
            "start the query again without a cursor"
        )
    return PageCursor(after, partitions)


def _decoded(position: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(position + "=" * (-len(position) % 4))
    except (binascii.Error, ValueError):
        return b""


class CursorMovedError(EddylineError):
    """A later page's cursor names partitions this member no longer serves."""

    def __init__(self, store: str, cursor: PageCursor, gone: Iterable[int]) -> None:
        self.store = store
        self.partitions = list(cursor.partitions or ())
        self.gone = sorted(gone)
        super().__init__(
            f'the cursor reads partitions {self.partitions} of store "{store}", but this '
            f"member no longer serves {self.gone} for this query (the task moved to another "
            "member, or its copy is no longer within the query's bounds) since the cursor "
            "was handed out; start the query again without a cursor"
        )


def continued(
    cursor: PageCursor | None, serving: Iterable[int], store: str
) -> tuple[set[int], list[int]]:
    """Of the partitions this member would serve an every-key query (``serving``): those
    the page reads, and those it leaves to others (``skipped_partitions``). Without a
    cursor, all of them; with one, exactly its partitions, or :class:`CursorMovedError`
    when one of them is no longer among ``serving``."""
    serving = set(serving)
    if cursor is None or cursor.partitions is None:
        return serving, []
    named = set(cursor.partitions)
    gone = named - serving
    if gone:
        raise CursorMovedError(store, cursor, gone)
    return named, sorted(serving - named)
