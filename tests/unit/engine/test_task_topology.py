"""Batch-at-a-time gives what record-by-record gives: outputs, stores, forwards, failures.

Each test runs one topology twice, on fresh stores: once record by record
(``TaskTopology.process``, the reference) and once in batches
(``process_batch``), and compares everything an application can observe.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from eddyline_runtime.engine.record_cache import ThreadCache
from eddyline_runtime.engine.record_failures import TaskProcessingError
from eddyline_runtime.engine.task_store import TaskStore
from eddyline_runtime.engine.task_topology import TaskTopology
from eddyline_runtime.processing import Processor
from eddyline_runtime.processing.dsl import StreamsBuilder
from eddyline_runtime.processing.topology import PunctuationType, Topology
from eddyline_runtime.serde import SerdeError, serde_for
from tests.support.stores import StoreFactory

LONGS = serde_for("long")
WORDS = ["apple", "pear", "fig", "kiwi", "plum", "end"]
Input = tuple[bytes | None, bytes | None, int]


def lines(count: int, seed: int = 7) -> list[Input]:
    rng = random.Random(seed)
    return [
        (None, " ".join(rng.choices(WORDS, k=rng.randint(0, 6))).encode(), 1_000 + offset)
        for offset in range(count)
    ]


def run_both(
    build: Callable[[], Topology],
    records: list[Input],
    open_stores: Callable[[str], dict[str, Any]],
    *,
    topic: str,
    batch_size: int = 37,
    subtopology: int = 0,
) -> tuple[TaskTopology, TaskTopology]:
    """The same records through one topology record by record and in batches."""
    tasks = []
    for mode in ("records", "batches"):
        topology = build()
        sub = topology.subtopologies()[subtopology]
        task = TaskTopology(topology, sub, 0, open_stores(mode))
        if mode == "records":
            for key, value, timestamp in records:
                task.process(topic, key, value, timestamp)
        else:
            for start in range(0, len(records), batch_size):
                chunk = records[start : start + batch_size]
                task.process_batch(
                    topic, [r[0] for r in chunk], [r[1] for r in chunk], [r[2] for r in chunk]
                )
        tasks.append(task)
    return tasks[0], tasks[1]


def stateless() -> Topology:
    builder = StreamsBuilder()
    (
        builder.stream("lines", value_serde="string")
        .flat_map_values(str.split)
        .filter(lambda _, word: word != "end")
        .map(lambda _, word: (word[0], word))
        .map_values(str.upper)
        .peek(lambda key, value: None)
        .flat_map(lambda key, value: [(key, value), (key, value + "!")])
        .group_by(lambda _, word: word)
        .count("counts")
        .to_stream()
        .to("out", key_serde="string", value_serde="long")
    )
    return builder.build()


def test_a_dsl_chain_emits_the_same_records_in_batches(store_factory: StoreFactory) -> None:
    by_record, by_batch = run_both(stateless, lines(500), lambda _: {}, topic="lines")
    first = by_record.drain_outputs()
    assert len(first) > 1_000
    assert by_batch.drain_outputs() == first
    assert by_batch.timestamp == by_record.timestamp == 1_499


# More distinct keys than a batch finds by scanning (dsl._SCANNED_KEYS): one dict per end.
MANY_WORDS = [f"word{i}" for i in range(40)]


def count_words(
    store_factory: StoreFactory, cache_bytes: int, batch_size: int, vocabulary: list[str] = WORDS
) -> tuple[TaskTopology, TaskTopology, list[Input]]:
    """The counting sub-topology over 700 words, record by record and in batches."""
    chosen = random.Random(3).choices(vocabulary, k=700)
    words = [(w.encode(), b"x", t) for t, w in enumerate(chosen)]
    caches: dict[str, ThreadCache] = {}

    def stores(mode: str) -> dict[str, Any]:
        cache = caches[mode] = ThreadCache(cache_bytes)
        store = store_factory(f"counts-{mode}-{cache_bytes}")
        return {"counts": TaskStore(store, changelog=None, cache=cache, cache_name=mode)}

    by_record, by_batch = run_both(
        counting, words, stores, topic=repartition_topic(), batch_size=batch_size, subtopology=1
    )
    for cache in caches.values():
        cache.flush()
    return by_record, by_batch, words


@pytest.mark.parametrize("vocabulary", [WORDS, MANY_WORDS], ids=["6-words", "40-words"])
@pytest.mark.parametrize("cache_bytes", [0, 1 << 20], ids=["no-cache", "cache"])
def test_counting_in_batches_stores_and_forwards_what_record_by_record_does(
    store_factory: StoreFactory, cache_bytes: int, vocabulary: list[str]
) -> None:
    by_record, by_batch, words = count_words(store_factory, cache_bytes, 256, vocabulary)
    reference = by_record.drain_outputs()
    assert by_batch.drain_outputs() == reference
    counts = by_batch.stores["counts"]
    for word in vocabulary:
        expected = sum(1 for w, _, _ in words if w == word.encode())
        found = counts.get(word.encode())
        assert found == by_record.stores["counts"].get(word.encode())
        assert (0 if found is None else LONGS.deserialize(found)) == expected


@pytest.mark.parametrize("vocabulary", [WORDS, MANY_WORDS], ids=["6-words", "40-words"])
def test_under_cache_pressure_each_key_forwards_rising_counts_ending_with_the_last(
    store_factory: StoreFactory, vocabulary: list[str]
) -> None:
    """A cache evicting mid-batch forwards fewer intermediate counts than record by
    record (the batch folds them), never a repeated or a lower one (KIP-63)."""
    every_update = count_words(store_factory, 0, 64, vocabulary)[0].drain_outputs()
    by_record, by_batch, _ = count_words(store_factory, 64, 64, vocabulary)
    for task in (by_record, by_batch):
        forwarded = per_key(task.drain_outputs())
        for word, counts in forwarded.items():
            all_counts = per_key(every_update)[word]
            assert counts == sorted(set(counts)), word  # strictly rising
            assert set(counts) <= set(all_counts) and counts[-1] == all_counts[-1], word


def per_key(outputs: list[Any]) -> dict[bytes, list[int]]:
    found: dict[bytes, list[int]] = {}
    for output in outputs:
        found.setdefault(output.key, []).append(LONGS.deserialize(output.value))
    return found


def counting() -> Topology:
    builder = StreamsBuilder()
    (
        builder.stream("words", key_serde="string", value_serde="string")
        .group_by(lambda key, _: key, value_serde="string")
        .count("counts")
        .to_stream()
        .to("out", key_serde="string", value_serde="long")
    )
    return builder.build()


def repartition_topic() -> str:
    return counting().subtopologies()[1].source_topics[0]


def test_a_mutable_aggregate_forwards_each_update_as_it_was(store_factory: StoreFactory) -> None:
    def build() -> Topology:
        builder = StreamsBuilder()
        (
            builder.stream("events", key_serde="string", value_serde="string")
            .group_by_key()
            .aggregate(
                list,
                lambda _, value, seen: (
                    [*seen, value] if len(seen) % 2 else (seen.append(value) or seen)
                ),
                "seen",
            )
            .to_stream()
            .to("out", key_serde="string", value_serde="json")
        )
        return builder.build()

    events = [(b"k%d" % (i % 3), b"v%d" % i, i) for i in range(40)]
    by_record, by_batch = run_both(
        build, events, lambda mode: {"seen": store_factory(f"seen-{mode}")}, topic="events"
    )
    assert by_batch.drain_outputs() == by_record.drain_outputs()


def test_a_branching_topology_keeps_depth_first_order() -> None:
    def build() -> Topology:
        builder = StreamsBuilder()
        words = builder.stream("lines", value_serde="string").flat_map_values(str.split)
        words.map_values(str.upper).to("out", value_serde="string")
        words.map_values(len).to("out", value_serde="int")
        return builder.build()

    by_record, by_batch = run_both(build, lines(60), lambda _: {}, topic="lines")
    assert by_batch.drain_outputs() == by_record.drain_outputs()


class Doubler(Processor):
    def process(self, key: Any, value: Any) -> None:
        self.context.forward(key, value * 2)


def test_a_processor_api_node_runs_record_by_record_inside_a_batch() -> None:
    def build() -> Topology:
        return (
            Topology()
            .add_source("in", ["numbers"], value_serde="int")
            .add_processor("double", Doubler, "in")
            .add_sink("out", "doubled", "double", value_serde="int")
        )

    numbers = [(None, serde_for("int").serialize(n), n) for n in range(25)]
    by_record, by_batch = run_both(build, numbers, lambda _: {}, topic="numbers")
    outputs = by_batch.drain_outputs()
    assert outputs == by_record.drain_outputs()
    assert [o.timestamp for o in outputs] == list(range(25))


def test_a_failing_record_is_named_by_its_index_in_the_batch() -> None:
    def build() -> Topology:
        builder = StreamsBuilder()
        (
            builder.stream("lines", value_serde="string")
            .map_values(lambda line: 1 // (len(line) - 3))
            .to("out", value_serde="long")
        )
        return builder.build()

    topology = build()
    task = TaskTopology(topology, topology.subtopologies()[0], 0, {})
    values = [b"a", b"bb", b"ccc", b"dddd"]
    with pytest.raises(TaskProcessingError) as failed:
        task.process_batch("lines", [None] * 4, values, [0, 1, 2, 3], offsets=[10, 11, 12, 13])
    assert failed.value.offset == 12
    assert isinstance(failed.value.cause, ZeroDivisionError)


def boom(word: str) -> str:
    if word == "boom":
        raise KeyError(word)
    return word


@pytest.mark.parametrize("step", ["map_values", "filter", "group_by"])
def test_a_step_failing_after_a_flat_map_names_the_record_the_item_came_from(step: str) -> None:
    builder = StreamsBuilder()
    words = builder.stream("lines", value_serde="string").flat_map_values(str.split)
    if step == "map_values":
        words.map_values(boom).to("out", value_serde="string")
    elif step == "filter":
        words.filter(lambda _, word: bool(boom(word))).to("out", value_serde="string")
    else:
        words.group_by(lambda _, word: boom(word), value_serde="string").count("counts")
    topology = builder.build()
    task = TaskTopology(topology, topology.subtopologies()[0], 0, {})
    values = [b"a b", b"", b"c d e", b"x boom", b"z"]  # boom ends its line
    with pytest.raises(TaskProcessingError) as failed:
        task.process_batch("lines", [None] * 5, values, [0, 1, 2, 3, 4], offsets=[5, 6, 7, 8, 9])
    assert failed.value.offset == 8
    assert isinstance(failed.value.cause, KeyError)


def test_bytes_a_source_serde_cannot_read_are_named_by_their_offset() -> None:
    topology = stateless()
    task = TaskTopology(topology, topology.subtopologies()[0], 0, {})
    with pytest.raises(TaskProcessingError) as failed:
        task.process_batch(
            "lines", [None] * 3, [b"ok", b"\xff\xfe", b"ok"], [0, 1, 2], offsets=[4, 5, 6]
        )
    assert failed.value.offset == 5
    assert isinstance(failed.value.cause, SerdeError)


def test_a_batch_whose_records_carry_headers_gives_each_output_its_records_headers() -> None:
    topology = stateless()
    records = lines(40)
    headers = [(("id", b"%d" % i),) if i % 3 == 0 else () for i in range(len(records))]
    reference = TaskTopology(topology, topology.subtopologies()[0], 0, {})
    for (key, value, timestamp), record_headers in zip(records, headers, strict=True):
        reference.process("lines", key, value, timestamp, record_headers)
    batched = TaskTopology(topology, topology.subtopologies()[0], 0, {})
    batched.process_batch(
        "lines", [r[0] for r in records], [r[1] for r in records], [r[2] for r in records], headers
    )
    outputs = batched.drain_outputs()
    assert outputs == reference.drain_outputs()
    assert {o.headers for o in outputs} >= {(("id", b"0"),), ()}


def test_outputs_without_headers_after_some_with_keep_one_entry_each() -> None:
    topology = stateless()
    records = lines(30)
    task = TaskTopology(topology, topology.subtopologies()[0], 0, {})
    first, rest = records[:10], records[10:]
    task.process_batch(
        "lines",
        [r[0] for r in first],
        [r[1] for r in first],
        [r[2] for r in first],
        [(("h", b"1"),)] * len(first),
    )
    task.process_batch("lines", [r[0] for r in rest], [r[1] for r in rest], [r[2] for r in rest])
    (columns,) = task.drain_output_columns().values()  # the repartition topic's
    assert columns.headers is not None and len(columns.headers) == len(columns.keys)
    assert columns.headers[-1] == ()


def test_a_batch_leaves_record_context_stream_time_and_lateness_as_record_by_record() -> None:
    topology = stateless()
    records = [(None, b"fig pear", t) for t in (50, 20, 70, 60, 10)]
    offsets = [100, 101, 102, 103, 104]
    reference = TaskTopology(topology, topology.subtopologies()[0], 3, {})
    for (key, value, timestamp), offset in zip(records, offsets, strict=True):
        reference.process("lines", key, value, timestamp, partition=3, offset=offset)
    batched = TaskTopology(topology, topology.subtopologies()[0], 3, {})
    batched.process_batch(
        "lines",
        [r[0] for r in records],
        [r[1] for r in records],
        [r[2] for r in records],
        partition=3,
        offsets=offsets,
    )
    assert batched.record_context == reference.record_context
    assert batched.record_context.offset == 104
    assert (batched.stream_time, batched.record_lateness) == (70, 60)
    assert (reference.stream_time, reference.record_lateness) == (70, 60)


def test_cached_writes_in_a_batch_keep_the_whole_context_of_their_record(
    store_factory: StoreFactory,
) -> None:
    cache = ThreadCache(1 << 20)
    store = TaskStore(store_factory("counts"), changelog=None, cache=cache, cache_name="c")
    topology = counting()
    task = TaskTopology(topology, topology.subtopologies()[1], 2, {"counts": store})
    words = [b"fig", b"pear", b"fig", b"kiwi", b"pear"]
    task.process_batch(
        repartition_topic(),
        words,
        [b"x"] * len(words),
        [10, 20, 30, 40, 50],
        partition=2,
        offsets=[7, 8, 9, 10, 11],
    )
    dirty = cache.named_cache("c").dirty
    contexts = {key: context for key, (_, context) in dirty.items()}
    assert {key: (c.timestamp, c.partition, c.offset) for key, c in contexts.items()} == {
        b"fig": (30, 2, 9),
        b"pear": (50, 2, 11),
        b"kiwi": (40, 2, 10),
    }
    assert all(c.topic == repartition_topic() for c in contexts.values())
    # Last-write order, as record by record: fig@30, kiwi@40, pear@50.
    assert list(dirty) == [b"fig", b"kiwi", b"pear"]


class Ticker(Processor):
    def init(self, context: Any) -> None:
        super().init(context)
        context.schedule(10, PunctuationType.STREAM_TIME, lambda now: None)

    def process(self, key: Any, value: Any) -> None:
        self.context.forward(key, value)


def test_a_task_batches_only_dsl_chains_without_stream_time_punctuation() -> None:
    assert TaskTopology(stateless(), stateless().subtopologies()[0], 0, {}).batching
    topology = (
        Topology()
        .add_source("in", ["numbers"])
        .add_processor("tick", Ticker, "in")
        .add_sink("out", "ticked", "tick")
    )
    task = TaskTopology(topology, topology.subtopologies()[0], 0, {})
    assert not task.batching
