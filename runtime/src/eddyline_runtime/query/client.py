"""The client router of KIP-535: query the active copy, else the freshest copy that answers.

``QueryRouter.get(store, key)``:

1. asks any reachable instance for the key's ``KeyQueryMetadata`` (its
   partition, the assigned active and standby hosts, and every member's host);
2. queries the active host for fresh data;
3. if the active host is unreachable, restoring, has not opened the partition
   yet (421), or is gone, and the query allows stale answers (the default):
   asks every member it knows of for its ``/v1/layout`` (the store partitions
   it holds: active, restoring, standby, warm-up, and copies a previous owner
   still has open after a new assignment) and queries, with ``allow_stale``,
   each copy within ``acceptable_lag`` in turn, the freshest first (least
   reported lag; the assigned active first among equals);
4. otherwise fails with :class:`QueryFailedError`, saying what each host
   answered.

With ``max_staleness_ms`` (query/staleness.py) the bound, not the role, says
which copy will do: the active host is asked first, with the bound; then, from
the layouts of step 3, only the copies their members report within the bound
(each layout carries every copy's ``staleness_ms``), the active first, then the
least stale; a copy reported beyond it, or not knowing its staleness, would
refuse and is not asked. When none answers,
:class:`~eddyline_runtime.query.staleness.StalenessBoundError` says how stale
the freshest was. Every result says what it reflects: the member and topology
revision that answered, the copy's position, its last commit as the active
copy, and its ``as_of_ms`` and ``staleness_ms``.

A copy that trails its changelog and has not got the key (a copy restoring
from empty answers "not found" for every key) is not the last word while a
fresher copy might have it: the router asks the remaining copies, and answers
"not found" only when none has the key. A fresh query (``allow_stale=False``)
goes to the assigned active host only, as KIP-535's default, and fails saying
so when that copy is not ready.

Plain ``urllib``: the router is a few blocking calls, run from the CLI or
from user code that may have no event loop.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from eddyline_runtime.config import IsolationLevel
from eddyline_runtime.errors import EddylineError, InvalidArgumentError
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.query.cursor import EXCLUDE_PARTITIONS_PARAMETER
from eddyline_runtime.query.position import (
    POSITION_BOUND_PARAMETER,
    Position,
    PositionNotReachedError,
    format_position_bound,
    position_from_json,
)
from eddyline_runtime.query.staleness import MAX_STALENESS_PARAMETER, StalenessBoundError

DEFAULT_TIMEOUT_SECONDS = 2.0
# The roles a member's /v1/layout names for a copy that can answer a stale query; a copy
# waiting for a Spark build ("restorePending") holds nothing yet.
QUERYABLE_ROLES = frozenset({"active", "restoring", "standby"})
# Hosts the router remembers beyond its bootstrap list: a member that left the assignment
# (scaled in, evicted) may still hold a copy for a moment. One that stops answering is
# forgotten, so a long-lived router does not keep asking pods long gone.
REMEMBERED_HOSTS = 64
# How often a query over every key starts one host's pages again after a move refused its
# cursor (410): each restart follows a task move, so more than a few in one query means
# the group is rebalancing without pause and the caller had better retry later.
CURSOR_RESTARTS = 3
# Layout requests in flight at once when the router looks for copies.
LAYOUT_FAN_OUT = 8
STALE_HINT = "Retry later, or accept staler answers (a larger acceptable lag)"
FRESH_HINT = "A fresh answer comes only from the active copy: retry shortly, or allow stale answers"


class QueryFailedError(EddylineError):
    """No host could answer acceptably; ``attempts`` says what each one did."""

    def __init__(
        self, store: str, key: str, attempts: Sequence[str], hint: str = STALE_HINT
    ) -> None:
        self.attempts = list(attempts)
        super().__init__(
            f'no host answered for key "{key}" of store "{store}": '
            + "; ".join(attempts)
            + f". {hint}"
        )


@dataclass(frozen=True)
class Reflects:
    """What an answer reflects (the server's module docstring defines each field); not part
    of a result's equality, as two answers of the same value may be read at other times."""

    member: str | None = None  # the member that answered, and the topology revision it runs
    revision: str | None = None
    position: dict[TopicPartition, int] = field(default_factory=dict)  # KIP-796
    changelog_offset: int | None = None  # the last changelog record the copy includes
    committed_at_ms: int | None = None  # the copy's last commit as its task's active copy
    as_of_ms: int | None = None  # the copy includes every write committed by then
    staleness_ms: int | None = None  # answer time - as_of_ms; None: the copy cannot tell

    @classmethod
    def of(cls, body: dict[str, Any]) -> Reflects:
        def optional(name: str) -> int | None:
            value = body.get(name)
            return None if value is None else int(value)

        return cls(
            member=None if body.get("member") is None else str(body["member"]),
            revision=None if body.get("revision") is None else str(body["revision"]),
            position=position_from_json(body.get("position")),
            changelog_offset=optional("changelog_offset"),
            committed_at_ms=optional("committed_at_ms"),
            as_of_ms=optional("as_of_ms"),
            staleness_ms=optional("staleness_ms"),
        )


@dataclass(frozen=True)
class QueryResult:
    found: bool
    value: Any
    host: str
    role: str  # "active", "standby" (a copy its host no longer owns: "active", stale), "global"
    stale: bool
    lag: int
    partition: int
    reflects: Reflects = field(default=Reflects(), compare=False)


@dataclass(frozen=True)
class StoreCopyInfo:
    """A copy of a store partition a member reports in its ``/v1/layout``."""

    host: str
    role: str  # active, restoring or standby (warm-ups are standbys to their member)
    lag: int
    assigned_active: bool  # the host the key's metadata names active
    # How stale the copy's committed data was when its member reported (None: it cannot
    # tell); ``reports_staleness`` False: a runtime that does not report it at all.
    staleness_ms: int | None = None
    reports_staleness: bool = False

    def reported_within(self, max_staleness_ms: int) -> bool:
        return self.staleness_ms is not None and self.staleness_ms <= max_staleness_ms

    def reported_beyond(self, max_staleness_ms: int) -> bool:
        """Its member said it is staler than the bound, or that it cannot tell: asking it
        would be refused (409), so the router does not."""
        return self.reports_staleness and not self.reported_within(max_staleness_ms)


@dataclass(frozen=True)
class WindowedEntry:
    """A window (end = start + size; None when the store has no known size) or a
    session (both ends inclusive) and its value."""

    key: Any
    start: int
    end: int | None
    value: Any


@dataclass(frozen=True)
class WindowedResult:
    entries: list[WindowedEntry]
    host: str
    role: str
    stale: bool
    lag: int
    partition: int
    reflects: Reflects = field(default=Reflects(), compare=False)  # of the first page


class QueryRouter:
    def __init__(
        self,
        bootstrap: Sequence[str],
        *,
        acceptable_lag: int | None = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        """``bootstrap``: host:port addresses of some instances; ``acceptable_lag``:
        the most changelog records a standby may trail (None: any)."""
        if not bootstrap:
            raise InvalidArgumentError("the router needs at least one host:port to start from")
        self.bootstrap = list(bootstrap)
        self.acceptable_lag = acceptable_lag
        self.timeout = timeout
        # Member hosts seen in metadata and layouts, oldest first (see REMEMBERED_HOSTS).
        self._remembered: dict[str, None] = {}

    def metadata(self, store: str, key: str) -> dict[str, Any]:
        """The key's ``KeyQueryMetadata``, from the bootstrap hosts, then from the member
        hosts earlier answers named, newest first.

        The bootstrap is often the query Service, whose endpoints are only the pods
        Ready (processing): while every pod restarts, restores or closes, it may have
        none, or send the request to a closing pod (503), though members it named
        before still serve their copies; asking them too keeps the router answering."""
        attempts: list[str] = []
        path = f"/v1/stores/{_quote(store)}/metadata/{_quote(key)}"
        for host in dict.fromkeys([*self.bootstrap, *reversed(self._remembered)]):
            status, body = self._get(host, path)
            if status == 200:
                self._remember(_named_hosts(body))
                return body
            attempts.append(f"{host}: {_describe(status, body)}")
            if status == 404:
                break  # the store does not exist: every host will say so
        raise QueryFailedError(store, key, attempts)

    def get(
        self,
        store: str,
        key: str,
        *,
        isolation: IsolationLevel | str | None = None,
        position_bound: Position | None = None,
        allow_stale: bool = True,
        max_staleness_ms: int | None = None,
    ) -> QueryResult:
        """The key's value from the best copy; see the module docstring.

        ``allow_stale=False``: only the assigned active copy may answer (KIP-535's
        default ``StoreQueryParameters``); the router fails when it is not ready.

        ``max_staleness_ms``: any copy whose committed data is at most that stale
        may answer, whatever ``allow_stale`` says; :class:`StalenessBoundError` when
        none is.

        With ``position_bound`` (KIP-796) every copy is asked in turn, active
        first, and the first that reached the bound answers; when none has,
        :class:`PositionNotReachedError` says how far they got.
        """
        metadata = self.metadata(store, key)
        query = _staleness_query(max_staleness_ms)
        if isolation is not None:
            query["isolation"] = IsolationLevel.parse(isolation, key="isolation").value
        path = f"/v1/stores/{_quote(store)}/keys/{_quote(key)}"
        if position_bound is not None:
            return self._get_bounded(store, key, path, metadata, query=query, bound=position_bound)
        host, body = self._routed(store, key, path, metadata, query, allow_stale=allow_stale)
        return _result(host, body)

    def _routed(
        self,
        store: str,
        key: str,
        path: str,
        metadata: dict[str, Any],
        query: dict[str, str],
        *,
        allow_stale: bool,
    ) -> tuple[str, dict[str, Any]]:
        """Steps 2 to 4 of the module docstring for one key's ``path``: (host, body)."""
        partition = int(metadata["partition"])
        self._remember(_named_hosts(metadata))
        attempts: list[str] = []
        # Hosts whose failure is in ``attempts`` already: one line each.
        reported: set[str] = set()
        unreachable: set[str] = set()
        active = metadata.get("active_host")
        # With a staleness bound: how stale each copy that refused for it (409) was.
        too_stale: list[int | None] = []
        bounded = MAX_STALENESS_PARAMETER in query
        # Hosts that refused this query for the staleness bound already: not asked again.
        refused_bound: set[str] = set()
        if active:
            status, body = self._get(active, path, query)
            if status == 200:
                return active, body
            attempts.append(f"active {active}: {_describe(status, body)}")
            reported.add(active)
            if status == 0:
                unreachable.add(active)
            if _note_too_stale(status, body, too_stale):
                refused_bound.add(active)
        else:
            attempts.append("no active host (the task is being reassigned)")
        if not (allow_stale or bounded):
            raise QueryFailedError(store, key, attempts, FRESH_HINT)
        # The freshest copy that has the key answers; a lagging copy without it (one that
        # restores from empty has no key yet) answers only when no other copy has it.
        without_key: tuple[str, dict[str, Any]] | None = None
        copies = self._copies(
            store,
            partition,
            metadata,
            attempts=attempts,
            reported=reported,
            unreachable=unreachable,
        )
        if bounded:
            copies = _by_staleness(
                copies,
                int(query[MAX_STALENESS_PARAMETER]),
                refused=refused_bound,
                attempts=attempts,
                too_stale=too_stale,
            )
        for copy in copies:
            status, body = self._get(copy.host, path, {**query, "allow_stale": "true"})
            if status != 200:
                attempts.append(
                    f"{copy.role} copy on {copy.host} (lag {copy.lag}): {_describe(status, body)}"
                )
                _note_too_stale(status, body, too_stale)
                continue
            if int(body.get("lag", 0)) > 0 and _without_key(body):
                without_key = without_key or (copy.host, body)
                continue
            return copy.host, body
        if without_key is not None:
            return without_key
        if too_stale:
            known = [staleness for staleness in too_stale if staleness is not None]
            bound = int(query[MAX_STALENESS_PARAMETER])
            raise StalenessBoundError(store, key, bound, min(known) if known else None, attempts)
        raise QueryFailedError(store, key, attempts)

    def _copies(
        self,
        store: str,
        partition: int,
        metadata: dict[str, Any],
        *,
        attempts: list[str],
        reported: set[str],
        unreachable: set[str],
    ) -> list[StoreCopyInfo]:
        """Every copy of the store partition the members report holding, within the
        acceptable lag: least lag first, the assigned active first among equals.

        Asks each known host (the metadata's, those remembered, the bootstrap ones) for
        its ``/v1/layout``. Hosts the metadata names get a line in ``attempts`` when they
        hold no usable copy; other members are only asked.
        """
        active = metadata.get("active_host")
        standbys = set(metadata.get("standby_hosts", []))
        hosts = [
            h
            for h in dict.fromkeys([*_named_hosts(metadata), *self._remembered, *self.bootstrap])
            if h not in unreachable
        ]
        found: dict[str, StoreCopyInfo] = {}  # by member id: the Service is a pod too
        answered, held = 0, 0
        for host, (status, body) in zip(hosts, self._layouts(hosts), strict=True):
            named = host == active or host in standbys
            label = f"{'active' if host == active else 'standby'} {host}"
            if status != 200:
                if status == 0:
                    self._remembered.pop(host, None)
                if named and host not in reported:
                    attempts.append(f"{label}: {_describe(status, body)}")
                continue
            answered += 1
            address = str(body.get("address") or host)
            self._remember([address])
            copy = body.get("stores", {}).get(store, {}).get(str(partition))
            if copy is None:
                if named and host not in reported:
                    attempts.append(f"{label}: does not hold partition {partition} yet")
                continue
            held += 1
            role, lag = str(copy.get("role")), int(copy.get("lag", 0))
            who = label if named else f"{role} copy on {address}"
            if role not in QUERYABLE_ROLES:
                attempts.append(f"{who}: holds no data yet ({role})")
                continue
            if self.acceptable_lag is not None and lag > self.acceptable_lag:
                attempts.append(f"{who}: lag {lag} exceeds the acceptable {self.acceptable_lag}")
                continue
            member = str(body.get("member") or address)
            staleness = copy.get("staleness_ms")
            found.setdefault(
                member,
                StoreCopyInfo(
                    address,
                    role,
                    lag,
                    address == active,
                    staleness_ms=None if staleness is None else int(staleness),
                    reports_staleness="staleness_ms" in copy,
                ),
            )
        if not held:
            # Say so: no copy is open anywhere (a task between its old owner closing it and
            # its new owner opening it), which no routing can help.
            attempts.append(
                f"none of the {answered} members that answered ({len(hosts)} asked) holds "
                f"partition {partition} of the store"
            )
        return sorted(found.values(), key=lambda c: (c.lag, not c.assigned_active, c.host))

    def _layouts(self, hosts: list[str]) -> list[tuple[int, dict[str, Any]]]:
        """Each host's ``/v1/layout`` (status, body), asked in parallel: a pod that went
        away costs one timeout, not one per host."""
        if not hosts:
            return []
        with ThreadPoolExecutor(max_workers=min(LAYOUT_FAN_OUT, len(hosts))) as pool:
            return list(pool.map(lambda host: self._get(host, "/v1/layout"), hosts))

    def _remember(self, hosts: Iterable[str]) -> None:
        for host in hosts:
            self._remembered.pop(host, None)
            self._remembered[host] = None  # the newest last
        while len(self._remembered) > REMEMBERED_HOSTS:
            del self._remembered[next(iter(self._remembered))]

    # -- window and session stores ----------------------------------------------------

    def fetch_windows(
        self,
        store: str,
        key: str,
        time_from: int | None = None,
        time_to: int | None = None,
        *,
        isolation: IsolationLevel | str | None = None,
        allow_stale: bool = True,
        backward: bool = False,
        max_staleness_ms: int | None = None,
    ) -> WindowedResult:
        """``key``'s windows starting in [time_from, time_to] (Kafka's
        ``ReadOnlyWindowStore.fetch(key, from, to)``; ``backward``: newest first, its
        ``backwardFetch``) from the best copy, every page (``max_staleness_ms``: as
        :meth:`get`'s)."""
        query = _bounds("from", time_from, "to", time_to) | _direction(backward)
        query |= _staleness_query(max_staleness_ms)
        return self._key_entries(store, key, "windows", query, isolation, allow_stale=allow_stale)

    def fetch_sessions(
        self,
        store: str,
        key: str,
        earliest_end: int | None = None,
        latest_start: int | None = None,
        *,
        isolation: IsolationLevel | str | None = None,
        allow_stale: bool = True,
        backward: bool = False,
        max_staleness_ms: int | None = None,
    ) -> WindowedResult:
        """``key``'s sessions ending at or after ``earliest_end`` and starting at or before
        ``latest_start`` (Kafka's ``findSessions``; no bounds: ``fetch(key)``; ``backward``:
        exactly reversed, ``backwardFindSessions``; ``max_staleness_ms``: as :meth:`get`'s)."""
        query = _bounds("earliest_end", earliest_end, "latest_start", latest_start)
        query |= _direction(backward) | _staleness_query(max_staleness_ms)
        return self._key_entries(store, key, "sessions", query, isolation, allow_stale=allow_stale)

    def fetch_all_windows(
        self,
        store: str,
        time_from: int | None = None,
        time_to: int | None = None,
        *,
        isolation: IsolationLevel | str | None = None,
        key_from: str | None = None,
        key_to: str | None = None,
        backward: bool = False,
        max_staleness_ms: int | None = None,
    ) -> list[WindowedEntry]:
        """Every key's windows starting in [time_from, time_to] (Kafka's ``fetchAll``), or
        those of keys ``key_from..key_to`` (inclusive, None: open; Kafka's ``fetch(keyFrom,
        keyTo, from, to)``); ``backward``: each host's answer exactly reversed.

        Asks every bootstrap host for the partitions it holds actively (with
        ``max_staleness_ms``: every copy it holds within the bound, as :meth:`get`'s),
        each partition from one host only; all-key queries therefore need ``bootstrap``
        to name every instance. Each host's entries come in key, then time order; hosts
        follow one another. A host whose partitions moved between its pages (410) is
        asked again from the start; raises :class:`QueryFailedError` when a partition
        of the store answered nowhere.
        """
        query = _bounds("from", time_from, "to", time_to) | _key_bounds(key_from, key_to)
        query |= _direction(backward) | _staleness_query(max_staleness_ms)
        return self._all_entries(store, "windows", query, isolation)

    def fetch_all_sessions(
        self,
        store: str,
        earliest_end: int | None = None,
        latest_start: int | None = None,
        *,
        isolation: IsolationLevel | str | None = None,
        key_from: str | None = None,
        key_to: str | None = None,
        backward: bool = False,
        max_staleness_ms: int | None = None,
    ) -> list[WindowedEntry]:
        """Every key's sessions so bounded, or a key range's; see :meth:`fetch_all_windows`
        (``max_staleness_ms`` too)."""
        query = _bounds("earliest_end", earliest_end, "latest_start", latest_start)
        query |= _key_bounds(key_from, key_to) | _direction(backward)
        query |= _staleness_query(max_staleness_ms)
        return self._all_entries(store, "sessions", query, isolation)

    def _key_entries(
        self,
        store: str,
        key: str,
        what: str,
        query: dict[str, str],
        isolation: IsolationLevel | str | None,
        *,
        allow_stale: bool,
    ) -> WindowedResult:
        if isolation is not None:
            query["isolation"] = IsolationLevel.parse(isolation, key="isolation").value
        metadata = self.metadata(store, key)
        path = f"/v1/stores/{_quote(store)}/{what}/{_quote(key)}"
        host, body = self._routed(store, key, path, metadata, query, allow_stale=allow_stale)
        reflects = Reflects.of(body)
        entries = _entries(body)
        while body.get("next_cursor"):
            # Later pages from the copy that served the first while it can: one source.
            paged = {**query, "cursor": body["next_cursor"]}
            if body.get("stale"):
                paged["allow_stale"] = "true"
            status, answer = self._get(host, path, paged)
            if status != 200:
                # That copy went away (its task moved): the cursor is a key position any
                # copy of the partition continues from, so the next page is routed anew.
                metadata = self.metadata(store, key)
                query_on = {**query, "cursor": body["next_cursor"]}
                host, answer = self._routed(
                    store, key, path, metadata, query_on, allow_stale=allow_stale
                )
            body = answer
            entries.extend(_entries(body))
        return WindowedResult(
            entries=entries,
            host=host,
            role=str(body["role"]),
            stale=bool(body["stale"]),
            lag=int(body["lag"]),
            partition=int(body["partition"]),
            reflects=reflects,
        )

    def _all_entries(
        self,
        store: str,
        what: str,
        query: dict[str, str],
        isolation: IsolationLevel | str | None,
    ) -> list[WindowedEntry]:
        """Each bootstrap host's pages in turn, every partition from one host only.

        A host is asked to leave out the partitions read already (``exclude_partitions``);
        its entries count only once its last page came (a move that refuses its cursor,
        410, discards them and starts that host again). With the store's partitions known
        (a member's layout), the hosts are asked once more for any none answered (a
        partition that moved to a host asked before it got there).
        """
        if isolation is not None:
            query["isolation"] = IsolationLevel.parse(isolation, key="isolation").value
        path = f"/v1/stores/{_quote(store)}/{what}"
        expected = self._store_partitions(store)
        entries: list[WindowedEntry] = []
        served: set[int] = set()
        unserved: set[int] = set()
        failures: list[str] = []
        for _ in range(1 if expected is None else 2):
            for host in self.bootstrap:
                if expected is not None and expected <= served:
                    break
                read = self._host_entries(
                    store, host, path, query, served=served, failures=failures
                )
                if read is not None:
                    partitions, skipped, found = read
                    served |= partitions
                    unserved |= skipped
                    entries.extend(found)
            if expected is None or expected <= served:
                break
        missing = sorted((unserved | (expected or set())) - served)
        if missing or (expected is None and failures):
            why = [*failures, f"partitions {missing} answered nowhere" if missing else ""]
            hint = STALE_HINT
            if MAX_STALENESS_PARAMETER in query:
                hint = "Retry later, or raise max_staleness_ms"
            raise QueryFailedError(store, "*", [a for a in why if a], hint)
        return entries

    def _host_entries(
        self,
        store: str,
        host: str,
        path: str,
        query: dict[str, str],
        *,
        served: set[int],
        failures: list[str],
    ) -> tuple[set[int], set[int], list[WindowedEntry]] | None:
        """One host's pages: (partitions read, partitions it skipped, entries), or None
        (with a line in ``failures``) when it could not answer them all."""
        asked = dict(query)
        if served:
            asked[EXCLUDE_PARTITIONS_PARAMETER] = ",".join(str(p) for p in sorted(served))
        for _ in range(CURSOR_RESTARTS + 1):
            found: list[WindowedEntry] = []
            status, body = self._get(host, path, asked)
            while status == 200:
                partitions = {int(p) for p in body["partitions"]}
                if partitions & served:
                    # A server that ignores exclude_partitions (an older runtime) answered
                    # a partition another host did: not one consistent answer.
                    failures.append(f"{host}: served partitions another host served too")
                    return None
                found.extend(_entries(body))
                if not body.get("next_cursor"):
                    skipped = {int(p) for p in body["skipped_partitions"]}
                    return partitions, skipped, found
                status, body = self._get(host, path, {**asked, "cursor": body["next_cursor"]})
            if status != 410:
                failures.append(f"{host}: {_describe(status, body)}")
                return None
            # A partition the cursor reads moved away between two pages: start again.
        failures.append(
            f"{host}: its partitions moved {CURSOR_RESTARTS + 1} times during one query "
            f'of store "{store}"'
        )
        return None

    def _store_partitions(self, store: str) -> set[int] | None:
        """The store's partitions, from the first member layout a bootstrap host gives
        (its tasks of the sub-topology that owns the store); None when none answers or
        the store has no task (a global store)."""
        for host in self.bootstrap:
            status, body = self._get(host, "/v1/layout")
            if status != 200:
                continue
            owner = (body.get("store_owners") or {}).get(store)
            if owner is None:
                return None
            tasks = (TaskId.parse(str(task)) for task in body.get("tasks", []))
            return {task.partition for task in tasks if task.subtopology == int(owner)}
        return None

    def _get_bounded(
        self,
        store: str,
        key: str,
        path: str,
        metadata: dict[str, Any],
        *,
        query: dict[str, str],
        bound: Position,
    ) -> QueryResult:
        attempts: list[str] = []
        hosts = [h for h in [metadata.get("active_host"), *metadata.get("standby_hosts", [])] if h]
        bounded = {**query, POSITION_BOUND_PARAMETER: format_position_bound(bound)}
        best: dict[TopicPartition, int] = {}
        not_reached = False
        for host in hosts:
            status, body = self._get(host, path, bounded)
            if status == 200:
                return _result(host, body)
            attempts.append(f"{host}: {_describe(status, body)}")
            if status == 409 and MAX_STALENESS_PARAMETER not in body:
                not_reached = True
                for tp, offset in position_from_json(body.get("position")).items():
                    best[tp] = max(best.get(tp, -1), offset)
        if not_reached:
            raise PositionNotReachedError(store, bound, best)
        raise QueryFailedError(store, key, attempts)

    def _get(
        self, host: str, path: str, query: dict[str, str] | None = None
    ) -> tuple[int, dict[str, Any]]:
        """(status, JSON body); status 0 when the host cannot be reached."""
        url = f"http://{host}{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as response:
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as error:
            try:
                body = json.loads(error.read() or b"{}")
            except ValueError:
                body = {"error": error.reason}
            return error.code, body
        except (OSError, ValueError) as error:
            return 0, {"error": f"unreachable ({error})"}


def _result(host: str, body: dict[str, Any]) -> QueryResult:
    return QueryResult(
        found=bool(body["found"]),
        value=body["value"],
        host=host,
        role=str(body["role"]),
        stale=bool(body["stale"]),
        lag=int(body["lag"]),
        partition=int(body["partition"]),
        reflects=Reflects.of(body),
    )


def _staleness_query(max_staleness_ms: int | None) -> dict[str, str]:
    if max_staleness_ms is None:
        return {}
    if max_staleness_ms < 0:
        raise InvalidArgumentError(
            f"max_staleness_ms={max_staleness_ms} is negative; pass 0 or more milliseconds "
            "(None: no bound)"
        )
    return {MAX_STALENESS_PARAMETER: str(max_staleness_ms)}


def _note_too_stale(status: int, body: dict[str, Any], too_stale: list[int | None]) -> bool:
    """A 409 for the staleness bound (not a position bound's): how stale the copy was.
    True when it was one."""
    if status == 409 and MAX_STALENESS_PARAMETER in body:
        staleness = body.get("staleness_ms")
        too_stale.append(None if staleness is None else int(staleness))
        return True
    return False


def _by_staleness(
    copies: Sequence[StoreCopyInfo],
    max_staleness_ms: int,
    *,
    refused: set[str],
    attempts: list[str],
    too_stale: list[int | None],
) -> list[StoreCopyInfo]:
    """The copies worth asking under a staleness bound, in the order to ask them.

    First those whose member reported them within the bound: the active first, then
    the least stale (a report is a moment old, so a copy may have crossed the bound
    since: it then refuses and the next is asked). Then copies of members that report
    no staleness (an older runtime), least lag first, as without a bound. Copies
    reported beyond the bound, or not knowing their staleness, are not asked: each
    would refuse; their reported staleness goes into the error when none answers.
    """
    within: list[StoreCopyInfo] = []
    unreported: list[StoreCopyInfo] = []
    for copy in copies:
        if copy.host in refused:
            continue
        if copy.reported_within(max_staleness_ms):
            within.append(copy)
        elif copy.reported_beyond(max_staleness_ms):
            stale = "unknown" if copy.staleness_ms is None else f"{copy.staleness_ms} ms"
            attempts.append(
                f"{copy.role} copy on {copy.host}: reported staleness {stale}, beyond "
                f"{MAX_STALENESS_PARAMETER}={max_staleness_ms} (not asked)"
            )
            too_stale.append(copy.staleness_ms)
        else:
            unreported.append(copy)
    within.sort(key=lambda c: (c.role != "active", c.staleness_ms, c.lag, c.host))
    return [*within, *unreported]


def _named_hosts(metadata: dict[str, Any]) -> list[str]:
    """The hosts a key's metadata names: active, standbys, then every member's."""
    named = [metadata.get("active_host"), *metadata.get("standby_hosts", [])]
    return [str(h) for h in [*named, *metadata.get("member_hosts", [])] if h]


def _without_key(body: dict[str, Any]) -> bool:
    """An answer that has nothing for the key: "not found", or no windows or sessions."""
    return body.get("found") is False or body.get("entries") == []


def _entries(body: dict[str, Any]) -> list[WindowedEntry]:
    return [WindowedEntry(e["key"], e["start"], e["end"], e["value"]) for e in body["entries"]]


def _bounds(
    lower_name: str, lower: int | None, upper_name: str, upper: int | None
) -> dict[str, str]:
    return {
        name: str(value)
        for name, value in ((lower_name, lower), (upper_name, upper))
        if value is not None
    }


def _key_bounds(key_from: str | None, key_to: str | None) -> dict[str, str]:
    return {
        name: value
        for name, value in (("key_from", key_from), ("key_to", key_to))
        if value is not None
    }


def _direction(backward: bool) -> dict[str, str]:
    return {"backward": "true"} if backward else {}


def _describe(status: int, body: dict[str, Any]) -> str:
    error = body.get("error", "")
    return f"{status} {error}".strip() if status else str(error)


def _quote(text: str) -> str:
    return urllib.parse.quote(text, safe="")
