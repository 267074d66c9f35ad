"""The client router of KIP-535: query the active copy, else the freshest acceptable standby.

``QueryRouter.get(store, key)``:

1. asks any reachable instance for the key's ``KeyQueryMetadata``;
2. queries the active host (fresh data only);
3. if the active host is unreachable, restoring or gone, asks each standby
   host (and a restoring active host) for its lag on that store partition
   and queries, with ``allow_stale``, the most caught-up copy whose lag is
   within ``acceptable_lag``;
4. otherwise fails with :class:`QueryFailedError`, saying what each host
   answered.

Plain ``urllib``: the router is a few blocking calls, run from the CLI or
from user code that may have no event loop.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eddyline_runtime.config import IsolationLevel
from eddyline_runtime.errors import EddylineError, InvalidArgumentError
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.query.position import (
    POSITION_BOUND_PARAMETER,
    Position,
    PositionNotReachedError,
    format_position_bound,
    position_from_json,
)

DEFAULT_TIMEOUT_SECONDS = 2.0


class QueryFailedError(EddylineError):
    """No host could answer acceptably; ``attempts`` says what each one did."""

    def __init__(self, store: str, key: str, attempts: Sequence[str]) -> None:
        self.attempts = list(attempts)
        super().__init__(
            f'no host answered for key "{key}" of store "{store}": '
            + "; ".join(attempts)
            + ". Retry later, or accept staler answers (a larger acceptable lag)"
        )


@dataclass(frozen=True)
class QueryResult:
    found: bool
    value: Any
    host: str
    role: str  # "active" or "standby"
    stale: bool
    lag: int
    partition: int


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

    def metadata(self, store: str, key: str) -> dict[str, Any]:
        attempts: list[str] = []
        path = f"/v1/stores/{_quote(store)}/metadata/{_quote(key)}"
        for host in self.bootstrap:
            status, body = self._get(host, path)
            if status == 200:
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
    ) -> QueryResult:
        """The key's value from the best copy; see the module docstring.

        With ``position_bound`` (KIP-796) every copy is asked in turn, active
        first, and the first that reached the bound answers; when none has,
        :class:`PositionNotReachedError` says how far they got.
        """
        metadata = self.metadata(store, key)
        query: dict[str, str] = {}
        if isolation is not None:
            query["isolation"] = IsolationLevel.parse(isolation, key="isolation").value
        path = f"/v1/stores/{_quote(store)}/keys/{_quote(key)}"
        if position_bound is not None:
            return self._get_bounded(store, key, path, metadata, query=query, bound=position_bound)
        host, body = self._routed(store, key, path, metadata, query)
        return _result(host, body)

    def _routed(
        self,
        store: str,
        key: str,
        path: str,
        metadata: dict[str, Any],
        query: dict[str, str],
    ) -> tuple[str, dict[str, Any]]:
        """Steps 2 to 4 of the module docstring for one key's ``path``: (host, body)."""
        partition = int(metadata["partition"])
        attempts: list[str] = []
        active = metadata.get("active_host")
        stale_candidates = list(metadata.get("standby_hosts", []))
        if active:
            status, body = self._get(active, path, query)
            if status == 200:
                return active, body
            attempts.append(f"active {active}: {_describe(status, body)}")
            if status == 503:
                # Restoring (a promotion in progress): it may well be the freshest copy.
                stale_candidates.append(active)
        else:
            attempts.append("no active host (the task is being reassigned)")
        for lag, host in self._copies_by_lag(store, partition, stale_candidates, attempts):
            status, body = self._get(host, path, {**query, "allow_stale": "true"})
            if status == 200:
                return host, body
            attempts.append(f"copy on {host} (lag {lag}): {_describe(status, body)}")
        raise QueryFailedError(store, key, attempts)

    # -- window and session stores ----------------------------------------------------

    def fetch_windows(
        self,
        store: str,
        key: str,
        time_from: int | None = None,
        time_to: int | None = None,
        *,
        isolation: IsolationLevel | str | None = None,
    ) -> WindowedResult:
        """``key``'s windows starting in [time_from, time_to] (Kafka's
        ``ReadOnlyWindowStore.fetch(key, from, to)``) from the best copy, every page."""
        query = _bounds("from", time_from, "to", time_to)
        return self._key_entries(store, key, "windows", query, isolation)

    def fetch_sessions(
        self,
        store: str,
        key: str,
        earliest_end: int | None = None,
        latest_start: int | None = None,
        *,
        isolation: IsolationLevel | str | None = None,
    ) -> WindowedResult:
        """``key``'s sessions ending at or after ``earliest_end`` and starting at or before
        ``latest_start`` (Kafka's ``findSessions``; no bounds: ``fetch(key)``)."""
        query = _bounds("earliest_end", earliest_end, "latest_start", latest_start)
        return self._key_entries(store, key, "sessions", query, isolation)

    def fetch_all_windows(
        self,
        store: str,
        time_from: int | None = None,
        time_to: int | None = None,
        *,
        isolation: IsolationLevel | str | None = None,
    ) -> list[WindowedEntry]:
        """Every key's windows starting in [time_from, time_to] (Kafka's ``fetchAll``).

        Asks every bootstrap host for the partitions it holds actively; all-key
        queries therefore need ``bootstrap`` to name every instance. Raises
        :class:`QueryFailedError` when a partition of the store answered nowhere.
        """
        query = _bounds("from", time_from, "to", time_to)
        return self._all_entries(store, "windows", query, isolation)

    def fetch_all_sessions(
        self,
        store: str,
        earliest_end: int | None = None,
        latest_start: int | None = None,
        *,
        isolation: IsolationLevel | str | None = None,
    ) -> list[WindowedEntry]:
        """Every key's sessions so bounded; see :meth:`fetch_all_windows`."""
        query = _bounds("earliest_end", earliest_end, "latest_start", latest_start)
        return self._all_entries(store, "sessions", query, isolation)

    def _key_entries(
        self,
        store: str,
        key: str,
        what: str,
        query: dict[str, str],
        isolation: IsolationLevel | str | None,
    ) -> WindowedResult:
        if isolation is not None:
            query["isolation"] = IsolationLevel.parse(isolation, key="isolation").value
        metadata = self.metadata(store, key)
        path = f"/v1/stores/{_quote(store)}/{what}/{_quote(key)}"
        host, body = self._routed(store, key, path, metadata, query)
        entries = _entries(body)
        while body.get("next_cursor"):
            # Later pages from the copy that served the first: one consistent source.
            paged = {**query, "cursor": body["next_cursor"]}
            if body.get("stale"):
                paged["allow_stale"] = "true"
            status, body = self._get(host, path, paged)
            if status != 200:
                raise QueryFailedError(store, key, [f"{host}: {_describe(status, body)}"])
            entries.extend(_entries(body))
        return WindowedResult(
            entries=entries,
            host=host,
            role=str(body["role"]),
            stale=bool(body["stale"]),
            lag=int(body["lag"]),
            partition=int(body["partition"]),
        )

    def _all_entries(
        self,
        store: str,
        what: str,
        query: dict[str, str],
        isolation: IsolationLevel | str | None,
    ) -> list[WindowedEntry]:
        if isolation is not None:
            query["isolation"] = IsolationLevel.parse(isolation, key="isolation").value
        path = f"/v1/stores/{_quote(store)}/{what}"
        entries: list[WindowedEntry] = []
        served: set[int] = set()
        unserved: set[int] = set()
        attempts: list[str] = []
        for host in self.bootstrap:
            status, body = self._get(host, path, query)
            while status == 200:
                fresh = [p for p in body["partitions"] if p not in served]
                if fresh != body["partitions"]:
                    # A partition twice (a moving task): not a consistent answer.
                    attempts.append(f"{host}: served partitions another host served too")
                    break
                entries.extend(_entries(body))
                if not body.get("next_cursor"):
                    served.update(body["partitions"])
                    unserved.update(body["skipped_partitions"])
                    break
                status, body = self._get(host, path, {**query, "cursor": body["next_cursor"]})
            if status != 200:
                attempts.append(f"{host}: {_describe(status, body)}")
        missing = sorted(unserved - served)
        if missing or attempts:
            attempts.append(f"partitions {missing} answered nowhere" if missing else "")
            raise QueryFailedError(store, "*", [a for a in attempts if a])
        return entries

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
            if status == 409:
                not_reached = True
                for tp, offset in position_from_json(body.get("position")).items():
                    best[tp] = max(best.get(tp, -1), offset)
        if not_reached:
            raise PositionNotReachedError(store, bound, best)
        raise QueryFailedError(store, key, attempts)

    def _copies_by_lag(
        self, store: str, partition: int, hosts: list[str], attempts: list[str]
    ) -> list[tuple[int, str]]:
        """The hosts whose copy is within the acceptable lag, freshest first."""
        candidates: list[tuple[int, str]] = []
        for host in hosts:
            status, body = self._get(host, "/v1/lags")
            if status != 200:
                attempts.append(f"standby {host}: {_describe(status, body)}")
                continue
            lag_info = body.get(store, {}).get(str(partition))
            if lag_info is None:
                attempts.append(f"standby {host}: does not hold partition {partition} yet")
                continue
            lag = int(lag_info["offset_lag"])
            if self.acceptable_lag is not None and lag > self.acceptable_lag:
                attempts.append(
                    f"standby {host}: lag {lag} exceeds the acceptable {self.acceptable_lag}"
                )
                continue
            candidates.append((lag, host))
        return sorted(candidates)

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
    )


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


def _describe(status: int, body: dict[str, Any]) -> str:
    error = body.get("error", "")
    return f"{status} {error}".strip() if status else str(error)


def _quote(text: str) -> str:
    return urllib.parse.quote(text, safe="")
