"""Records that cannot be processed: Kafka's exception handlers and dead-letter records.

Each test names the Kafka behaviour it follows: KIP-1033's
``ProcessingExceptionHandlerIntegrationTest`` (continue / fail / a handler
returning nothing), the deserialization handler of ``RecordDeserializerTest``
(``LogAndContinueExceptionHandler`` skips, ``LogAndFailExceptionHandler``
stops), ``DefaultProductionExceptionHandler`` for serialization errors, and
KIP-1034's dead-letter records (``ExceptionHandlerUtils``: the original bytes
and the ``__streams.errors.*`` headers).
"""

from __future__ import annotations

from typing import Any

import pytest

from eddyline_runtime.config import ExceptionHandlerKind
from eddyline_runtime.engine.record_failures import (
    PunctuationError,
    RecordFailures,
    TaskProcessingError,
)
from eddyline_runtime.engine.task_topology import TaskTopology
from eddyline_runtime.processing import Processor, PunctuationType, StreamsBuilder, Topology
from eddyline_runtime.processing.exception_handlers import (
    DeadLetterRecord,
    ErrorHandlerContext,
    Response,
    log_and_continue,
)
from eddyline_runtime.serde import serde_for
from eddyline_runtime.testing import TopologyTestDriver
from tests.support.stores import StoreFactory

LONGS = serde_for("long")
CONTINUE_ALL = {
    "deserialization.exception.handler": "log-and-continue",
    "processing.exception.handler": "log-and-continue",
    "production.exception.handler": "log-and-continue",
}


def parse_ints() -> StreamsBuilder:
    builder = StreamsBuilder()
    builder.stream("in", value_serde="string").map_values(int).to("out", value_serde="long")
    return builder


def headers_of(record: Any) -> dict[str, bytes]:
    return dict(record.headers)


def test_log_and_continue_skips_a_record_a_processor_raised_on_and_counts_it() -> None:
    """Kafka: ProcessingExceptionHandlerIntegrationTest, continue on a processing error."""
    config = {"processing.exception.handler": "LogAndContinueProcessingExceptionHandler"}
    with TopologyTestDriver(parse_ints(), config) as driver:
        driver.create_input_topic("in").pipe_value_list(["1", "one", "3"])
        assert driver.create_output_topic("out").read_values_to_list() == [1, 3]
        assert driver.dropped_records == 1
        reason = {"thread-id": "topology-test-driver-test-driver", "task-id": "0_0"}
        assert driver.metric("stream-task-metrics", "dropped-records-total", reason) == 1
        by_reason = {**reason, "reason": "processing-error"}
        assert (
            driver.metric("stream-task-metrics", "dropped-records-by-reason-total", by_reason) == 1
        )


def test_log_and_fail_is_the_default_and_names_the_record() -> None:
    """Kafka: LogAndFailProcessingExceptionHandler is the default (KIP-1033)."""
    with TopologyTestDriver(parse_ints()) as driver:
        topic = driver.create_input_topic("in")
        topic.pipe_input(None, "1")
        with pytest.raises(TaskProcessingError) as failed:
            topic.pipe_input(None, "one")
        error = failed.value
        assert (error.topic, error.partition, error.offset) == ("in", 0, 1)
        assert "\n" not in str(error)
        assert "processing.exception.handler" in str(error)


def test_a_value_that_does_not_deserialize_is_skipped_and_moves_no_stream_time() -> None:
    """Kafka: RecordDeserializerTest with LogAndContinueExceptionHandler."""
    config = {"deserialization.exception.handler": "log-and-continue"}
    with TopologyTestDriver(parse_ints(), config) as driver:
        raw = driver.create_input_topic("in", value_serde="bytes")
        raw.pipe_input(None, b"1", timestamp=5)
        raw.pipe_input(None, b"\xff\xfe", timestamp=99)  # not UTF-8
        raw.pipe_input(None, b"3", timestamp=6)
        out = driver.create_output_topic("out").read_records_to_list()
        assert [(r.value, r.timestamp) for r in out] == [(1, 5), (3, 6)]
        task = driver._tasks[0]
        assert task.topology.stream_time == 6
        assert task.topology.failures.dropped_by_reason["deserialization-error"] == 1


def test_the_dead_letter_record_carries_the_original_bytes_and_kip_1034_headers() -> None:
    """KIP-1034: the built-in handlers write the input record's key and value bytes, with
    __streams.errors.exception/.message/.stacktrace/.topic/.partition/.offset."""
    config = {**CONTINUE_ALL, "errors.dead.letter.queue.topic.name": "dlq"}
    with TopologyTestDriver(parse_ints(), config) as driver:
        topic = driver.create_input_topic("in", key_serde="string")
        topic.pipe_input("k0", "1", timestamp=1)
        topic.pipe_input("k1", "one", timestamp=2)
        dlq = driver.create_output_topic("dlq", key_serde="bytes", value_serde="bytes")
        [record] = dlq.read_records_to_list()
        assert (record.key, record.value, record.timestamp) == (b"k1", b"one", 2)
        headers = headers_of(record)
        assert headers["__streams.errors.exception"] == b"builtins.ValueError"
        assert b"invalid literal" in headers["__streams.errors.message"]
        assert b"Traceback" in headers["__streams.errors.stacktrace"]
        assert headers["__streams.errors.topic"] == b"in"
        assert headers["__streams.errors.partition"] == b"0"
        assert headers["__streams.errors.offset"] == b"1"
        assert driver.create_output_topic("out").read_values_to_list() == [1]
        task = driver._tasks[0]
        assert task.topology.failures.dead_letter_records == 1


def test_a_record_that_does_not_deserialize_reaches_the_dead_letter_topic_as_read() -> None:
    config = {**CONTINUE_ALL, "errors.dead.letter.queue.topic.name": "dlq"}
    with TopologyTestDriver(parse_ints(), config) as driver:
        driver.create_input_topic("in", value_serde="bytes").pipe_input(b"key", b"\xff")
        dlq = driver.create_output_topic("dlq", key_serde="bytes", value_serde="bytes")
        [record] = dlq.read_records_to_list()
        assert (record.key, record.value) == (b"key", b"\xff")
        assert headers_of(record)["__streams.errors.exception"].endswith(b"SerdeError")


def test_an_output_that_does_not_serialize_goes_to_the_production_handler() -> None:
    """Kafka: ProductionExceptionHandler.handleSerializationException."""
    builder = StreamsBuilder()
    builder.stream("in", value_serde="string").to("out", value_serde="long")  # strings as longs
    with TopologyTestDriver(builder, {"production.exception.handler": "log-and-continue"}) as d:
        d.create_input_topic("in").pipe_value_list(["a", "b"])
        assert d.create_output_topic("out").is_empty()
        assert d._tasks[0].topology.failures.dropped_by_reason["production-error"] == 2
    with TopologyTestDriver(builder) as driver, pytest.raises(TaskProcessingError) as failed:
        driver.create_input_topic("in").pipe_input(None, "a")
    assert failed.value.kind is ExceptionHandlerKind.PRODUCTION


def skip_value_errors(context: ErrorHandlerContext, exception: Exception) -> Response:
    """A user's handler: value errors to its own dead-letter record, anything else fails."""
    if not isinstance(exception, ValueError):
        return Response.fail()
    record = DeadLetterRecord(
        "dlq", context.source_raw_key, context.source_raw_value, (("why", b"not a number"),)
    )
    return Response.resume((record,))


def answer_nothing(context: ErrorHandlerContext, exception: Exception) -> Response:
    return None  # type: ignore[return-value]


def test_a_user_function_decides_and_returns_the_dead_letter_records() -> None:
    """KIP-1034: a user handler returns the records to send."""
    config = {
        "processing.exception.handler": f"{__name__}:skip_value_errors",
        "errors.dead.letter.queue.topic.name": "dlq",
    }
    with TopologyTestDriver(parse_ints(), config) as driver:
        driver.create_input_topic("in").pipe_value_list(["1", "x", "2"])
        assert driver.create_output_topic("out").read_values_to_list() == [1, 2]
        [record] = driver.create_output_topic("dlq", value_serde="bytes").read_records_to_list()
        assert (record.value, record.headers) == (b"x", (("why", b"not a number"),))


def test_a_user_handler_that_answers_nothing_stops_the_task() -> None:
    """Kafka: ProcessingExceptionHandlerIntegrationTest, a handler returning null fails."""
    config = {"processing.exception.handler": f"{__name__}:answer_nothing"}
    with TopologyTestDriver(parse_ints(), config) as driver, pytest.raises(TaskProcessingError):
        driver.create_input_topic("in").pipe_input(None, "x")


def raise_in_handler(context: ErrorHandlerContext, exception: Exception) -> Response:
    raise RuntimeError("the handler's own bug")


def test_a_handler_that_raises_stops_the_task_naming_both_errors() -> None:
    config = {"processing.exception.handler": f"{__name__}:raise_in_handler"}
    with (
        TopologyTestDriver(parse_ints(), config) as driver,
        pytest.raises(TaskProcessingError) as failed,
    ):
        driver.create_input_topic("in").pipe_input(None, "x")
    assert "raised RuntimeError: the handler's own bug" in str(failed.value)
    assert "ValueError: invalid literal" in str(failed.value)


def test_a_handler_reference_that_does_not_import_is_refused_by_name() -> None:
    config = {"processing.exception.handler": "no_such_module_here:handle"}
    with pytest.raises(Exception, match='cannot import module "no_such_module_here"'):
        TopologyTestDriver(parse_ints(), config).create_input_topic("in").pipe_input(None, "1")


# -- a punctuator that raises (KIP-1033: StreamTask.punctuate asks the processing handler) ---

seen_contexts: list[ErrorHandlerContext] = []


def keep_and_resume(context: ErrorHandlerContext, exception: Exception) -> Response:
    seen_contexts.append(context)
    return log_and_continue(context, exception)


class FailingTick(Processor):
    """Forwards each record; its stream-time punctuation (every 10 ms) raises at 20."""

    def init(self, context: Any) -> None:
        super().init(context)
        context.schedule(10, PunctuationType.STREAM_TIME, self.tick)

    def tick(self, now: int) -> None:
        if now == 20:
            raise ValueError(f"no tick at {now}")
        self.context.forward(b"tick", str(now).encode())

    def process(self, key: Any, value: Any) -> None:
        self.context.forward(key, value)


def failing_tick() -> Topology:
    topology = Topology()
    topology.add_source("in", ["in"])
    topology.add_processor("ticking", FailingTick, "in")
    topology.add_sink("sink", "out", "ticking")
    return topology


def test_a_failing_punctuator_goes_to_the_processing_handler_without_an_input_record() -> None:
    """Kafka: StreamTask.punctuate hands the exception to the processing handler, with a
    context naming the node and no record (topic null, partition and offset -1)."""
    seen_contexts.clear()
    config = {
        "processing.exception.handler": f"{__name__}:keep_and_resume",
        "errors.dead.letter.queue.topic.name": "dlq",
    }
    with TopologyTestDriver(failing_tick(), config) as driver:
        topic = driver.create_input_topic("in", value_serde="bytes")
        for t in (10, 20, 30):
            topic.pipe_input(None, str(t).encode(), timestamp=t)
        out = driver.create_output_topic("out", key_serde="bytes", value_serde="bytes")
        assert out.read_key_values_to_list() == [
            (None, b"10"),
            (b"tick", b"10"),
            (None, b"20"),
            (None, b"30"),
            (b"tick", b"30"),
        ]
        assert driver.create_output_topic("dlq").is_empty()  # no input record to set aside
        assert driver.dropped_records == 1
        failures = driver._tasks[0].topology.failures
        assert failures.dropped_by_reason["processing-error"] == 1
    [context] = seen_contexts
    assert context.kind is ExceptionHandlerKind.PROCESSING
    assert context.punctuation_type is PunctuationType.STREAM_TIME
    assert context.processor_node_id == "ticking"
    assert (context.topic, context.partition, context.offset) == (None, -1, -1)
    assert (context.timestamp, context.source_raw_key, context.source_raw_value) == (20, None, None)
    assert context.describe() == (
        'task 0_0: processing error in the STREAM_TIME punctuator of "ticking"'
    )


def test_a_handler_failing_a_punctuation_stops_the_task_naming_the_punctuator() -> None:
    config = {"processing.exception.handler": f"{__name__}:raise_in_handler"}
    with TopologyTestDriver(failing_tick(), config) as driver:
        topic = driver.create_input_topic("in", value_serde="bytes")
        topic.pipe_input(None, b"10", timestamp=10)
        with pytest.raises(PunctuationError) as failed:
            topic.pipe_input(None, b"20", timestamp=20)
    assert (failed.value.node, failed.value.punctuation_type) == (
        "ticking",
        PunctuationType.STREAM_TIME,
    )
    assert "raised RuntimeError: the handler's own bug" in str(failed.value)
    assert "ValueError: no tick at 20" in str(failed.value)


class RefuseTicks(Processor):
    def process(self, key: Any, value: Any) -> None:
        if key == b"tick":
            raise ValueError("a tick")


def test_a_record_a_punctuator_forwarded_fails_without_naming_an_input_record() -> None:
    """A child failing on what a punctuator forwarded: its context has no input record."""
    topology = failing_tick()
    topology.add_processor("refuse", RefuseTicks, "ticking")
    with TopologyTestDriver(topology) as driver, pytest.raises(TaskProcessingError) as failed:
        driver.create_input_topic("in", value_serde="bytes").pipe_input(None, b"1", timestamp=0)
    assert str(failed.value).startswith(
        "task 0_0 failed processing a record a punctuator forwarded: ValueError: a tick "
        '(processing error in "refuse")'
    )


# -- one poison record in a batch ------------------------------------------------------------


def poison(word: str) -> str:
    if word == "poison":
        raise ValueError(word)
    return word


def counting_with_failures(where: str) -> Topology:
    """Words counted, with a step that fails before the count or after it."""
    builder = StreamsBuilder()
    words = builder.stream("words", key_serde="string", value_serde="string")
    if where == "before":
        words = words.map_values(poison)
    counts = words.group_by_key().count("counts").to_stream()
    if where == "after":
        # Fails on each key's third record: the count is in the store, its output is not.
        counts = counts.map_values(lambda count: count // (3 - count) if count == 3 else count)
    counts.to("out", key_serde="string", value_serde="long")
    return builder.build()


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_failing_record_in_a_batch_leaves_the_others_applied_once(
    store_factory: StoreFactory, where: str
) -> None:
    """A batch step fails on one record: the records before it are not applied twice,
    the ones after it are applied, as record by record (the per-record path is the
    reference; Kafka processes record by record, so this is its behaviour)."""
    words = ["a", "b", "poison", "a", "c", "a", "poison", "b", "a"]
    keys = [w.encode() for w in words]
    values = [w.encode() for w in words]
    timestamps = list(range(len(words)))
    offsets = [100 + i for i in timestamps]
    runs = []
    for mode in ("record", "batch"):
        topology = counting_with_failures(where)
        task = TaskTopology(
            topology,
            topology.subtopologies()[0],
            0,
            {"counts": store_factory(f"counts-{where}-{mode}")},
            failures=RecordFailures({ExceptionHandlerKind.PROCESSING: log_and_continue}),
        )
        assert task.batching
        if mode == "batch":
            task.process_batch("words", keys, values, timestamps, offsets=offsets)
        else:
            for i in timestamps:
                task.process("words", keys[i], values[i], i, offset=offsets[i])
        store = task.stores["counts"]
        counts = {w: LONGS.deserialize(store.get(w.encode())) for w in ("a", "b", "c")}
        runs.append((task.drain_outputs(), counts, task.dropped_records))
    assert runs[0] == runs[1]
    outputs, counts, dropped = runs[1]
    if where == "before":
        assert counts == {"a": 4, "b": 2, "c": 1} and dropped == 2
    else:
        # "poison" is a word like any other here; "a" reaches 3 once, its output dropped.
        assert counts == {"a": 4, "b": 2, "c": 1, **{}} and dropped == 1
        assert [LONGS.deserialize(o.value) for o in outputs if o.key == b"a"] == [1, 2, 4]
