"""Session-windowed aggregations, as Kafka Streams runs them.

Worked from Kafka Streams' ``KStreamSessionWindowAggregateProcessorTest``
(apache/kafka, streams/src/test/java/org/apache/kafka/streams/kstream/internals/):
the record sequences, gaps, expected sessions, forwarded removals, output
timestamps (a session's end) and the late-record message of
``shouldImmediatelyForwardRemovedSessionsWhenMerging``,
``shouldHaveMultipleSessionsForSameIdWhenTimestampApartBySessionGap``,
``shouldHandleMultipleSessionsAndMerging``, ``shouldMergeSessions``,
``shouldLogAndMeterWhenSkippingLateRecordWithZeroGrace`` and ``...WithNonzeroGrace``
are carried over as facts (a session closes once stream time passes its end + gap
+ grace); the tests are ours.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from eddyline_runtime.engine.record_cache import ThreadCache
from eddyline_runtime.engine.task_store import TaskStore
from eddyline_runtime.engine.task_topology import TaskTopology
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing import (
    SessionWindow,
    SessionWindowedSerde,
    SessionWindows,
    StreamsBuilder,
    Topology,
    Windowed,
)
from eddyline_runtime.serde import serde_for
from eddyline_runtime.state import KeyRange
from tests.support.stores import StoreFactory

GAP = 5 * 60 * 1000
DAY = 86_400_000
STORE = "session-store"
LONGS = serde_for("long")

Output = tuple[str, str | None, int]


def sessions_topology(windows: SessionWindows) -> Topology:
    builder = StreamsBuilder()
    (
        builder.stream("topic", key_serde="string", value_serde="string")
        .group_by_key()
        .windowed_by(windows)
        .count(STORE)
        .to_stream()
        .map(lambda key, count: (str(key), None if count is None else str(count)))
        .to("output", key_serde="string", value_serde="string")
    )
    return builder.build()


class Sessions:
    """One task of the session count, fed record by record."""

    def __init__(self, windows: SessionWindows, store: object) -> None:
        topology = sessions_topology(windows)
        (sub,) = topology.subtopologies()
        self.task = TaskTopology(topology, sub, 0, {STORE: store})  # type: ignore[dict-item]
        self.offset = 0

    def send(self, key: str | None, timestamp: int, value: str = "v") -> None:
        self.task.process(
            "topic",
            None if key is None else key.encode(),
            value.encode(),
            timestamp,
            partition=0,
            offset=self.offset,
        )
        self.offset += 1

    def outputs(self) -> list[Output]:
        return [
            (o.key.decode(), None if o.value is None else o.value.decode(), o.timestamp)
            for o in self.task.drain_outputs()
            if o.key is not None
        ]


def cached(store_factory: StoreFactory) -> TaskStore:
    return TaskStore(
        store_factory(STORE),
        changelog=TopicPartition("app-session-store-changelog", 0),
        cache=ThreadCache(100_000),
        cache_name=STORE,
    )


def test_session_keys_print_and_serialize_as_kafka_streams_does() -> None:
    key = Windowed("a", SessionWindow(0, 5))
    assert str(key) == "[a@0/5]"
    serde = SessionWindowedSerde(serde_for("string"))
    data = serde.serialize(key)
    assert data == b"a" + (5).to_bytes(8, "big") + (0).to_bytes(8, "big")
    assert serde.deserialize(data) == key


def test_removed_sessions_are_forwarded_when_merging(store_factory: StoreFactory) -> None:
    """shouldImmediatelyForwardRemovedSessionsWhenMerging (no cache)."""
    sessions = Sessions(SessionWindows.of_inactivity_gap_with_grace(GAP, DAY), store_factory(STORE))
    sessions.send("a", 0)
    sessions.send("a", 5)
    assert sessions.outputs() == [("[a@0/0]", "1", 0), ("[a@0/0]", None, 0), ("[a@0/5]", "2", 5)]


def test_sessions_apart_by_the_gap_stay_apart(store_factory: StoreFactory) -> None:
    """shouldHaveMultipleSessionsForSameIdWhenTimestampApartBySessionGap (cached)."""
    store = cached(store_factory)
    sessions = Sessions(SessionWindows.of_inactivity_gap_with_grace(GAP, DAY), store)
    second, third = GAP + 1, 2 * (GAP + 1)
    for timestamp in (0, second, second, third, third, third):
        sessions.send("mel", timestamp)
    assert sessions.outputs() == []
    store.flush()
    assert sessions.outputs() == [
        ("[mel@0/0]", "1", 0),
        (f"[mel@{second}/{second}]", "2", second),
        (f"[mel@{third}/{third}]", "3", third),
    ]


def test_multiple_sessions_and_merging(store_factory: StoreFactory) -> None:
    """shouldHandleMultipleSessionsAndMerging (cached: one result per session per flush,
    and a merged session that never reached the store publishes nothing)."""
    store = cached(store_factory)
    sessions = Sessions(SessionWindows.of_inactivity_gap_with_grace(GAP, DAY), store)
    for key in "abcd":
        sessions.send(key, 0)
    sessions.send("d", GAP // 2)
    sessions.send("a", GAP + 1)
    sessions.send("b", GAP + 1)
    sessions.send("a", GAP + 1 + GAP // 2)
    sessions.send("c", GAP + 1 + GAP // 2)
    store.flush()
    late = GAP + 1 + GAP // 2
    assert sessions.outputs() == [
        ("[a@0/0]", "1", 0),
        ("[b@0/0]", "1", 0),
        ("[c@0/0]", "1", 0),
        (f"[d@0/{GAP // 2}]", "2", GAP // 2),
        (f"[b@{GAP + 1}/{GAP + 1}]", "1", GAP + 1),
        (f"[a@{GAP + 1}/{late}]", "2", late),
        (f"[c@{late}/{late}]", "1", late),
    ]


def test_a_record_between_two_sessions_merges_them(store_factory: StoreFactory) -> None:
    """shouldMergeSessions: 0, then GAP + 1 (a second session), then GAP / 2 bridges both."""
    sessions = Sessions(SessionWindows.of_inactivity_gap_with_grace(GAP, DAY), store_factory(STORE))
    sessions.send("mel", 0)
    sessions.send("mel", GAP + 1)
    sessions.send("mel", GAP // 2)
    view = sessions.task.session_stores[STORE]
    found = [(s, e, LONGS.deserialize(v)) for _, s, e, v in view.find_sessions(b"mel", 0, GAP + 1)]
    assert found == [(0, GAP + 1, 3)]
    assert sessions.outputs()[-3:] == [
        ("[mel@0/0]", None, 0),
        (f"[mel@{GAP + 1}/{GAP + 1}]", None, GAP + 1),
        (f"[mel@0/{GAP + 1}]", "3", GAP + 1),
    ]


def test_late_records_are_skipped_with_zero_grace(
    store_factory: StoreFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """shouldLogAndMeterWhenSkippingLateRecordWithZeroGrace: gap 10, stream time 11 (the
    gap plus 1) closes a session ending at 0."""
    caplog.set_level(logging.WARNING)
    sessions = Sessions(SessionWindows.of_inactivity_gap_without_grace(10), store_factory(STORE))
    sessions.send("dummy", 0)
    sessions.send("OnTime1", 0)
    sessions.send("dummy", 11)
    sessions.send("Late1", 0)
    assert sessions.task.dropped_records == 1
    assert (
        "Skipping record for expired window. key=[Late1] topic=[topic] partition=[0] "
        "offset=[3] timestamp=[0] window=[0,0] expiration=[1] streamTime=[11]"
    ) in caplog.messages
    assert ("[OnTime1@0/0]", "1", 0) in sessions.outputs()


def test_a_late_record_within_gap_and_grace_is_kept(
    store_factory: StoreFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """shouldLogAndMeterWhenSkippingLateRecordWithNonzeroGrace: gap 10, grace 1."""
    caplog.set_level(logging.WARNING)
    sessions = Sessions(SessionWindows.of_inactivity_gap_with_grace(10, 1), store_factory(STORE))
    sessions.send("dummy", 0)
    sessions.send("OnTime1", 0)
    sessions.send("dummy", 11)
    sessions.send("OnTime2", 0)  # ends at 0: closes once stream time passes 0 + 10 + 1
    assert sessions.task.dropped_records == 0
    assert sessions.outputs()[-1] == ("[OnTime2@0/0]", "1", 0)
    sessions.send("dummy", 12)
    sessions.send("Late1", 0)
    assert sessions.task.dropped_records == 1
    assert (
        "Skipping record for expired window. key=[Late1] topic=[topic] partition=[0] "
        "offset=[5] timestamp=[0] window=[0,0] expiration=[1] streamTime=[12]"
    ) in caplog.messages


def test_a_session_closed_before_a_restart_stays_closed(
    store_factory: StoreFactory, tmp_path: Path
) -> None:
    directory = tmp_path / "sessions"
    rocks = store_factory(STORE, directory=directory)
    windows = SessionWindows.of_inactivity_gap_with_grace(10, 0)
    first = Sessions(windows, rocks)
    first.send("u", 0)
    first.send("u", 100)
    rocks.commit({})
    rocks.close()
    second = Sessions(windows, store_factory(STORE, directory=directory))
    second.send("u", 5)  # would merge into [0, 0], which closed at stream time 100
    assert second.task.dropped_records == 1
    second.send("u", 105)
    assert second.outputs() == [("[u@100/100]", None, 100), ("[u@100/105]", "2", 105)]


def test_a_cached_scan_merges_dirty_entries_without_flushing(
    store_factory: StoreFactory,
) -> None:
    # What makes the cached session tests above hold: a scan (a session lookup) sees
    # the cache's dirty entries merged over the store, and forwards nothing.
    forwarded: list[bytes] = []
    store = cached(store_factory)
    store.set_flush_listener(lambda key, change: forwarded.append(key))
    store.logging.put(b"a", b"stored")
    store.logging.put(b"c", b"stored")
    store.put(b"b", b"dirty")
    store.put(b"c", b"dirty")
    store.delete(b"a")
    assert list(store.scan(KeyRange())) == [(b"b", b"dirty"), (b"c", b"dirty")]
    assert forwarded == []
    store.flush()
    assert forwarded == [b"b", b"c", b"a"]
    assert list(store.scan(KeyRange())) == [(b"b", b"dirty"), (b"c", b"dirty")]


def test_session_reduce_folds_values_and_a_bridging_record_merges_two_sessions(
    store_factory: StoreFactory,
) -> None:
    builder = StreamsBuilder()
    (
        builder.stream("topic", key_serde="string", value_serde="string")
        .group_by_key()
        # A day of grace keeps the first session in the store until the bridge comes.
        .windowed_by(SessionWindows.of_inactivity_gap_with_grace(GAP, DAY))
        .reduce(lambda joined, word: f"{joined}+{word}", STORE, value_serde="string")
        .to_stream()
        .map(lambda key, value: (str(key), value))
        .to("output", key_serde="string", value_serde="string")
    )
    topology = builder.build()
    (sub,) = topology.subtopologies()
    task = TaskTopology(topology, sub, 0, {STORE: store_factory(STORE)})
    for timestamp, word in ((0, "a"), (GAP * 2, "b"), (GAP, "bridge")):
        task.process("topic", b"k", word.encode(), timestamp, partition=0)
    outputs = [
        (o.key.decode() if o.key else None, o.value.decode() if o.value else None, o.timestamp)
        for o in task.drain_outputs()
    ]
    assert outputs == [
        ("[k@0/0]", "a", 0),
        (f"[k@{GAP * 2}/{GAP * 2}]", "b", GAP * 2),
        # The bridge removes both sessions, then writes the merged one: the first
        # session's value, the second's reduced into it, then the bridging record.
        ("[k@0/0]", None, 0),
        (f"[k@{GAP * 2}/{GAP * 2}]", None, GAP * 2),
        (f"[k@0/{GAP * 2}]", "a+b+bridge", GAP * 2),
    ]
