"""Every example under examples/ runs from its own manifest and produces exactly what it should.

Each test loads the example's ``streamapp.yaml``, points its log and state
directory at ``tmp_path``, produces input into the embedded log and runs it
with ``run_app(..., until_caught_up=True)``, the path ``eddyline run
MANIFEST --until-caught-up`` takes.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.log import FetchedColumns, FetchResult, Log, Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition, partition_for_key
from eddyline_runtime.processing.loader import load_topology
from eddyline_runtime.runner import run_app
from eddyline_runtime.serde import LongSerde
from eddyline_runtime.spec import StreamApp, parse_manifest
from eddyline_runtime.testing import TopologyTestDriver

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(name: str, tmp_path: Path, **config: str | int) -> tuple[StreamApp, list[Path]]:
    """The example's manifest with its log and state.dir under tmp_path (and ``config``)."""
    manifest = EXAMPLES / name / "streamapp.yaml"
    document = yaml.safe_load(manifest.read_text(encoding="utf-8"))
    document["spec"]["log"]["url"] = f"sqlite:///{tmp_path / 'log.db'}"
    document["spec"]["config"]["state.dir"] = str(tmp_path / "state")
    document["spec"]["config"].update(config)
    return parse_manifest(document, source=str(manifest)), [manifest.parent]


def run(app: StreamApp, log: Log, search_path: list[Path]) -> tuple[StreamsInstance, str]:
    out = io.StringIO()
    instance = run_app(app, log, search_path=search_path, until_caught_up=True, out=out, timeout=60)
    return instance, out.getvalue()


def produce_keyed(log: Log, topic: str, records: Iterable[tuple[str, Any, int]]) -> None:
    """(key, JSON value, timestamp) records, each on the partition Kafka's partitioner gives
    its key (as the runtime's own outputs are); a None value is a tombstone."""
    partitions = log.topics()[topic].partitions
    for key, value, timestamp in records:
        tp = TopicPartition(topic, partition_for_key(key.encode(), partitions))
        data = None if value is None else json.dumps(value).encode()
        log.produce(tp, [Record(key.encode(), data, timestamp)])


def consume(log: Log, topic: str) -> dict[int, list[Record]]:
    """Every record of ``topic``, per partition, in offset order."""
    found: dict[int, list[Record]] = {}
    for partition in range(log.topics()[topic].partitions):
        tp = TopicPartition(topic, partition)
        position, records = log.beginning_offset(tp), []
        while True:
            fetched = log.fetch(tp, position)
            if not fetched.records:
                break
            records.extend(fetched.records)
            position = fetched.records[-1].offset + 1
        found[partition] = records
    return found


def committed_total(log: Log, app: StreamApp, topics: Iterable[str]) -> int:
    partitions = [
        TopicPartition(topic, p) for topic in topics for p in range(log.topics()[topic].partitions)
    ]
    return sum(log.committed_offsets(app.metadata.name, partitions).values())


@pytest.fixture
def log(tmp_path: Path) -> Iterable[SqliteLog]:
    log = SqliteLog(tmp_path / "log.db")
    yield log
    log.close()


# -- wordcount ---------------------------------------------------------------------------

LINES = [
    "the quick brown fox",
    "jumps over the lazy dog",
    "The dog sleeps",
    "a fox is quick and the dog is lazy",
    "",
    "eddy eddy eddy",
]


def test_wordcount_counts_every_word(tmp_path: Path, log: SqliteLog) -> None:
    app, search_path = load_example("wordcount", tmp_path)
    log.create_topic("text-lines", 3)
    for index, line in enumerate(LINES):  # keyless lines, spread over the partitions
        log.produce(TopicPartition("text-lines", index % 3), [Record(None, line.encode(), index)])

    instance, out = run(app, log, search_path)

    expected = Counter(word for line in LINES for word in line.lower().split())
    latest: dict[str, int] = {}
    per_word: dict[str, list[int]] = {}
    for records in consume(log, "word-counts").values():
        for record in records:
            assert record.key is not None
            count = LongSerde.deserialize(record.value)
            assert count is not None
            per_word.setdefault(record.key.decode(), []).append(count)
            latest[record.key.decode()] = count
    assert latest == dict(expected)
    for word, counts in per_word.items():  # each word's updates only ever go up
        assert counts == sorted(set(counts)), word
    assert instance.processed == len(LINES) + sum(expected.values())  # lines + repartitioned
    assert committed_total(log, app, ["text-lines"]) == len(LINES)
    assert f"processed {instance.processed} records" in out


# -- click enrichment ----------------------------------------------------------------------

PROFILES = [  # (user, profile, timestamp): all before the first click
    ("alice", {"region": "eu"}, 1_000),
    ("bob", {"region": "us"}, 1_001),
    ("carol", {"region": "apac"}, 1_002),
]
CLICKS = [
    ("alice", {"page": "/home"}, 2_000),
    ("bob", {"page": "/pricing"}, 2_001),
    ("dave", {"page": "/home"}, 2_002),  # no profile: the inner join drops it
    ("carol", {"page": "/docs"}, 2_003),
    ("alice", {"page": "/checkout"}, 2_004),
    ("bob", {"page": "/docs"}, 3_000),  # after bob moved (below)
]
BOB_MOVES = ("bob", {"region": "eu"}, 2_500)


def enriched(log: Log) -> list[tuple[str, dict[str, Any]]]:
    """The enriched clicks, per partition in order, partitions in turn."""
    return [
        (record.key.decode(), json.loads(record.value))
        for records in consume(log, "enriched-clicks").values()
        for record in records
        if record.key is not None and record.value is not None
    ]


def test_click_enrichment_joins_each_click_with_the_profile_current_at_its_time(
    tmp_path: Path, log: SqliteLog
) -> None:
    app, search_path = load_example("click_enrichment", tmp_path)
    log.create_topic("clicks", 2)  # co-partitioned: the same number of partitions
    log.create_topic("user-profiles", 2)
    produce_keyed(log, "user-profiles", [*PROFILES, BOB_MOVES])
    produce_keyed(log, "clicks", CLICKS)

    instance, _ = run(app, log, search_path)

    assert sorted(enriched(log), key=lambda kv: (kv[0], kv[1]["page"])) == [
        ("alice", {"page": "/checkout", "region": "eu"}),
        ("alice", {"page": "/home", "region": "eu"}),
        ("bob", {"page": "/docs", "region": "eu"}),  # 3_000: after the move at 2_500
        ("bob", {"page": "/pricing", "region": "us"}),  # 2_001: before it
        ("carol", {"page": "/docs", "region": "apac"}),
    ]
    # Outputs keep the input's key, so each lands on its user's partition, in click order.
    for partition, records in consume(log, "enriched-clicks").items():
        for record in records:
            assert record.key is not None
            assert partition_for_key(record.key, 2) == partition
        timestamps = [record.timestamp for record in records]
        assert timestamps == sorted(timestamps)
    assert instance.processed == len(CLICKS) + len(PROFILES) + 1
    assert committed_total(log, app, ["clicks", "user-profiles"]) == len(CLICKS) + len(PROFILES) + 1


class OneRecordPerFetchLog(SqliteLog):
    """A slow broker: every fetch returns at most one record, so a partition the task
    has fetched may still have lag (profiles produced but not fetched yet)."""

    def fetch(self, tp: TopicPartition, offset: int, max_records: int = 10_000) -> FetchResult:
        return super().fetch(tp, offset, 1)

    def fetch_columns(
        self, tp: TopicPartition, offset: int, max_records: int = 10_000
    ) -> FetchedColumns:
        return super().fetch_columns(tp, offset, 1)  # what the processing loop fetches with


# Each click's profile is further down the profile partition than the last: the
# later the click in the clicks partition, the earlier its user's profile.
USERS = ["u1", "u2", "u3", "u4", "u5"]
SLOW_PROFILES = [(user, {"region": f"r-{user}"}, 100 + i) for i, user in enumerate(USERS)]
SLOW_CLICKS = [(user, {"page": f"/{user}"}, 200 + i) for i, user in enumerate(reversed(USERS))]


@pytest.mark.parametrize(
    ("max_task_idle_ms", "enriched_users"),
    [
        # The manifest's choice (KIP-695's default): the task does not take a click
        # while the profile partition has lag, so every profile (all produced before
        # every click) is in the store first: every click is enriched.
        (None, USERS),
        # -1 never waits: a click buffered while its profile is still unfetched is
        # processed at once and dropped by the inner join (here u5 and u4, whose
        # profiles are last).
        (-1, ["u1", "u2", "u3"]),
    ],
    ids=["manifest-0", "minus-1"],
)
def test_click_enrichment_waits_for_profiles_produced_before_the_clicks(
    tmp_path: Path, max_task_idle_ms: int | None, enriched_users: list[str]
) -> None:
    """KIP-695: with a slow fetch, only waiting while the profile partition has lag
    lets every click see the profile produced before it."""
    override = {} if max_task_idle_ms is None else {"max.task.idle.ms": max_task_idle_ms}
    app, search_path = load_example("click_enrichment", tmp_path, **override)
    if max_task_idle_ms is None:
        assert app.streams_config().max_task_idle_ms == 0
    log = OneRecordPerFetchLog(tmp_path / "log.db")
    try:
        log.create_topic("clicks", 1)
        log.create_topic("user-profiles", 1)
        produce_keyed(log, "user-profiles", SLOW_PROFILES)
        produce_keyed(log, "clicks", SLOW_CLICKS)

        instance, _ = run(app, log, search_path)

        assert instance.processed == len(SLOW_PROFILES) + len(SLOW_CLICKS)
        assert sorted(user for user, _ in enriched(log)) == enriched_users
        for user, value in enriched(log):
            assert value == {"page": f"/{user}", "region": f"r-{user}"}
    finally:
        log.close()


# -- custom processor (deduplication) --------------------------------------------------------


def test_order_enrichment_converges_to_each_order_joined_with_its_customer_in_eur(
    tmp_path: Path, log: SqliteLog
) -> None:
    """The foreign-key join across two partitions per table: orders and customers are
    read by different tasks, which interleave as they please, so which intermediate
    rows go out differs from the driver's; the table they end in may not. The rates
    are written before the run: the global table holds the latest before any order."""
    app, search_path = load_example("order_enrichment", tmp_path)
    log.create_topic("orders", 2)
    log.create_topic("customers", 2)
    log.create_topic("currency-rates", 1)
    rates = {"USD": 0.9, "GBP": 1.2}  # no CHF: those orders have eur null
    currencies = ["USD", "GBP", "CHF"]
    customers = [(f"c{i}", {"name": f"n{i}", "tier": "basic"}, i) for i in range(4)]
    orders = [
        (f"o{i}", {"customer_id": f"c{i % 5}", "amount": i, "currency": currencies[i % 3]}, 10 + i)
        for i in range(12)
    ]
    updates = [("c2", {"name": "n2", "tier": "gold"}, 50), ("c3", None, 51)]
    moves = [("o1", {"customer_id": "c2", "amount": 1, "currency": "GBP"}, 60), ("o6", None, 61)]
    produce_keyed(log, "currency-rates", [("USD", 0.5, 0), *[(c, r, 1) for c, r in rates.items()]])
    produce_keyed(log, "customers", customers)
    produce_keyed(log, "orders", orders)
    produce_keyed(log, "customers", updates)
    produce_keyed(log, "orders", moves)

    run(app, log, search_path)

    table: dict[str, Any] = {}
    for key, value, _ in records_of(log, "enriched-orders"):
        table[key] = value
    final_customers = {key: value for key, value, _ in customers + updates}
    final_orders = {key: value for key, value, _ in orders + moves}

    def eur(order: dict[str, Any]) -> float | None:
        rate = rates.get(order["currency"])
        return None if rate is None else round(order["amount"] * rate, 2)

    assert {key: value for key, value in table.items() if value is not None} == {
        key: {
            "order": order,
            "customer": final_customers.get(order["customer_id"]),
            "eur": eur(order),
        }
        for key, order in final_orders.items()
        if order is not None
    }
    assert table["o6"] is None  # the deleted order's last word is its tombstone


def test_custom_processor_forwards_each_event_id_once_across_restarts(
    tmp_path: Path, log: SqliteLog
) -> None:
    app, search_path = load_example("custom_processor", tmp_path)
    log.create_topic("events", 2)
    first = [
        ("e1", {"n": 1}, 10),
        ("e2", {"n": 2}, 11),
        ("e1", {"n": 1, "retry": True}, 12),
        ("e3", {"n": 3}, 13),
        ("e2", {"n": 2, "retry": True}, 14),
        ("e4", {"n": 4}, 15),
        ("e4", {"n": 4, "retry": True}, 16),
    ]
    produce_keyed(log, "events", first)

    run(app, log, search_path)

    def forwarded() -> list[tuple[str, dict[str, Any], int]]:
        return sorted(
            (r.key.decode(), json.loads(r.value), r.timestamp)
            for records in consume(log, "unique-events").values()
            for r in records
            if r.key is not None and r.value is not None
        )

    assert forwarded() == [
        ("e1", {"n": 1}, 10),
        ("e2", {"n": 2}, 11),
        ("e3", {"n": 3}, 13),
        ("e4", {"n": 4}, 15),
    ]
    assert committed_total(log, app, ["events"]) == len(first)

    # A second run resumes with the seen ids in its stores: old ids stay suppressed.
    produce_keyed(log, "events", [("e3", {"n": 3, "retry": True}, 20), ("e5", {"n": 5}, 21)])
    instance, _ = run(app, log, search_path)

    assert instance.processed == 2
    assert forwarded()[-1] == ("e5", {"n": 5}, 21)
    assert len(forwarded()) == 5


# -- poison orders (exception handlers and a dead-letter topic) -------------------------------


@pytest.mark.parametrize("guarantee", ["exactly_once_v2", "at_least_once"])
def test_poison_orders_sends_each_bad_order_to_the_dead_letter_topic_and_sums_the_rest(
    tmp_path: Path, log: SqliteLog, guarantee: str
) -> None:
    app, search_path = load_example(
        "poison_orders", tmp_path, **{"processing.guarantee": guarantee}
    )
    log.create_topic("orders", 1)
    log.create_topic("orders-dlq", 1)  # the app does not create it (KIP-1034)
    orders = TopicPartition("orders", 0)
    log.produce(
        orders,
        [
            Record(b"ann", b'{"quantity": 2, "price": 3}', 1),
            Record(b"ann", b"{not json", 2),  # deserialization error
            Record(b"bo", b'{"quantity": 1}', 3),  # no price: processing error
            Record(b"bo", b'{"quantity": 5, "price": 1}', 4),
            Record(b"ann", b'{"quantity": -1, "price": 9}', 5),  # processing error
            Record(b"ann", b'{"quantity": 1, "price": 4}', 6),
        ],
    )

    instance, _ = run(app, log, search_path)

    revenue = dict((r.key, r.value) for r in consume(log, "revenue")[0])  # the cache dedups
    assert revenue == {b"ann": b"10", b"bo": b"5"}
    dead = consume(log, "orders-dlq")[0]
    assert [(r.key, r.value) for r in dead] == [
        (b"ann", b"{not json"),
        (b"bo", b'{"quantity": 1}'),
        (b"ann", b'{"quantity": -1, "price": 9}'),
    ]
    headers = [dict(r.headers) for r in dead]
    assert [h["__streams.errors.offset"] for h in headers] == [b"1", b"2", b"4"]
    assert headers[0]["__streams.errors.exception"].endswith(b"SerdeError")
    assert headers[1]["__streams.errors.exception"] == b"builtins.KeyError"
    assert headers[2]["__streams.errors.message"] == b"negative quantity -1"
    assert committed_total(log, app, ["orders"]) == 6  # the skipped ones are consumed too
    reasons = {
        dict(name.tags)["reason"]: value
        for name, value in instance.final_metrics.items()
        if name.name == "dropped-records-by-reason-total"
    }
    assert reasons["deserialization-error"] == 1 and reasons["processing-error"] == 2


def test_poison_orders_stop_at_the_first_bad_order_under_the_default_handlers(
    tmp_path: Path, log: SqliteLog
) -> None:
    """Kafka's default, log-and-fail: `eddyline run` ends with one line naming the record
    (topic, partition, offset, exception), and nothing after the last commit is written."""
    _app, _ = load_example("poison_orders", tmp_path)
    log.create_topic("orders", 1)
    log.create_topic("orders-dlq", 1)
    log.produce(
        TopicPartition("orders", 0),
        [Record(b"ann", b'{"quantity": 2, "price": 3}', 1), Record(b"bo", b'{"quantity": 1}', 2)],
    )
    log.close()
    document = yaml.safe_load((EXAMPLES / "poison_orders" / "streamapp.yaml").read_text())
    document["spec"]["log"]["url"] = f"sqlite:///{tmp_path / 'log.db'}"
    document["spec"]["config"]["state.dir"] = str(tmp_path / "state")
    del document["spec"]["config"]["processing.exception.handler"]  # Kafka's default
    manifest = tmp_path / "streamapp.yaml"
    manifest.write_text(yaml.safe_dump(document))
    shutil.copy(EXAMPLES / "poison_orders" / "poison_orders.py", tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "eddyline_runtime.cli", "run", str(manifest), "--until-caught-up"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    assert (
        "failed processing orders-0 at offset 1: KeyError: 'price' (processing error in"
        in (errors[0])
    )
    reopened = SqliteLog(tmp_path / "log.db")
    try:
        assert consume(reopened, "orders-dlq")[0] == []  # a failing task writes nothing
    finally:
        reopened.close()


# -- the examples whose outputs the test driver computes ---------------------------------------
#
# What these examples compute, record by record, is tested through the test driver
# (tests/unit/test_example_topologies.py); here each runs from its manifest, as
# `eddyline run --until-caught-up` runs it, and must write what the driver computes
# for the same records.

MINUTE = 60_000
DAY = 24 * 60 * MINUTE  # custom_processor's RETENTION_MS

Inputs = dict[str, list[tuple[str, Any, int]]]

EXAMPLE_RUNS: list[tuple[str, Inputs, str, dict[str, str | int]]] = [
    (
        "custom_processor",
        {
            "events": [
                ("e1", {"n": 1}, 10),
                ("e1", {"n": 1, "retry": True}, 20),  # within retention: suppressed
                ("e2", {"n": 2}, DAY + 1_000),  # stream time passes e1's retention
                ("e2", {"n": 2, "retry": True}, 2 * DAY),  # e2's first was < a day ago
                ("e1", {"n": 1, "again": True}, 2 * DAY + 1),  # e1 was purged: forwarded again
            ]
        },
        "unique-events",
        {},
    ),
    (
        "ad_clicks",
        {
            "impressions": [
                ("imp-1", {"campaign": "a"}, 0),
                ("imp-2", {"campaign": "b"}, 1 * MINUTE),
                ("imp-3", {"campaign": "a"}, 2 * MINUTE),
                ("imp-4", {"campaign": "b"}, 30 * MINUTE),  # closes imp-2's window
            ],
            "clicks": [
                ("imp-1", {"page": "/a"}, MINUTE // 2),
                ("imp-9", {"page": "/x"}, 100_000),  # no such impression: nothing
                ("imp-3", {"page": "/a"}, 11 * MINUTE + 40_000),  # 9 min 40 s after imp-3
            ],
        },
        "ad-results",
        {},
    ),
    (
        "customer_accounts",
        {
            "customers": [
                ("c1", {"name": "Ann"}, 1000),
                ("c2", {"name": "Bo"}, 2000),
                ("c1", None, 5000),  # Ann leaves
            ],
            "accounts": [
                ("c1", {"balance": 10}, 1500),
                ("c2", {"balance": 5}, 3000),
                ("c1", {"balance": 20}, 4000),
            ],
        },
        "customer-accounts",
        {},
    ),
    (
        "currency_conversion",
        {
            # All produced before the run: the global table is loaded before any order.
            "currency-rates": [("USD", 0.92, 0), ("GBP", 1.17, 0), ("USD", 0.93, 0)],
            "orders": [
                ("o1", {"currency": "USD", "amount": 100}, 1_000),
                ("o2", {"currency": "CHF", "amount": 50}, 2_000),  # no rate: eur null
                ("o3", {"currency": "GBP", "amount": 10}, 3_000),
            ],
        },
        "orders-in-eur",
        {},
    ),
    (
        "page_views",
        {
            "page-views": [
                ("alice", {"region": "eu", "page": "/a"}, 1_000),
                ("bob", {"region": "us", "page": "/b"}, 2_000),
                ("carol", {"region": "eu", "page": "/c"}, 59_999),  # end exclusive: minute 0
                ("dave", {"region": "eu", "page": "/d"}, MINUTE),  # minute 1
                ("erin", {"region": "us", "page": "/e"}, MINUTE + 5_000),
                ("frank", {"region": "eu", "page": "/f"}, 55_000),  # late, within 10 s grace
                ("gina", {"region": "eu", "page": "/g"}, 2 * MINUTE + 10_000),  # closes minute 0
                ("hank", {"region": "us", "page": "/h"}, 20_000),  # beyond grace: dropped
                ("ivan", {"region": "us", "page": "/i"}, 3 * MINUTE + 10_000),  # closes minute 1
            ]
        },
        "page-views-per-minute",
        {},
    ),
    (
        "user_sessions",
        {
            "clicks": [
                (user, {"page": "/"}, t)
                for user, t in [
                    ("alice", 0),
                    ("alice", 10 * MINUTE),
                    ("bob", 5 * MINUTE),
                    ("alice", 42 * MINUTE),  # 32 min after the last: a new session
                    ("alice", 25 * MINUTE),  # late, within grace: bridges both sessions
                    ("bob", 100 * MINUTE),
                ]
            ]
        },
        "user-sessions",
        # Without the record cache every change goes out, the merged sessions' removals
        # too, as the driver's commit after every record sends them.
        {"statestore.cache.max.bytes": 0},
    ),
]


def records_of(log: Log, topic: str) -> list[tuple[str, Any, int]]:
    """(key, JSON value or None, timestamp) of every record, partitions in turn."""
    return [
        (r.key.decode(), None if r.value is None else json.loads(r.value), r.timestamp)
        for records in consume(log, topic).values()
        for r in records
        if r.key is not None
    ]


def in_the_order_a_task_takes_them(inputs: Inputs) -> list[tuple[str, str, Any, int]]:
    """One input partition per topic, all produced before the run: the task takes the
    oldest head first (KIP-695), each topic's records in offset order."""
    heads = {topic: list(records) for topic, records in inputs.items()}
    merged: list[tuple[str, str, Any, int]] = []
    while any(heads.values()):
        topic = min((t for t in heads if heads[t]), key=lambda t: heads[t][0][2])
        key, value, timestamp = heads[topic].pop(0)
        merged.append((topic, key, value, timestamp))
    return merged


def through_the_driver(
    app: StreamApp, search_path: list[Path], inputs: Inputs, output: str
) -> list[tuple[Any, Any, int]]:
    topology = load_topology(app.spec.topology.ref, search_path)
    with TopologyTestDriver(topology, app.streams_config()) as driver:
        for topic, key, value, timestamp in in_the_order_a_task_takes_them(inputs):
            driver.create_input_topic(topic).pipe_input(key, value, timestamp)
        return [
            (r.key, r.value, r.timestamp)
            for r in driver.create_output_topic(output).read_records_to_list()
        ]


@pytest.mark.parametrize("example_run", EXAMPLE_RUNS, ids=[run[0] for run in EXAMPLE_RUNS])
def test_an_example_run_from_its_manifest_writes_what_the_test_driver_computes(
    tmp_path: Path,
    log: SqliteLog,
    example_run: tuple[str, Inputs, str, dict[str, str | int]],
) -> None:
    example, inputs, output, config = example_run
    app, search_path = load_example(example, tmp_path, **config)
    for topic, records in inputs.items():
        log.create_topic(topic, 1)
        produce_keyed(log, topic, records)

    run(app, log, search_path)

    # A global table's topic is read by every instance, not by the group: no committed offsets.
    topology = load_topology(app.spec.topology.ref, search_path)
    global_topics = {spec.topic for spec in topology.global_stores.values()}
    grouped = {topic: records for topic, records in inputs.items() if topic not in global_topics}
    assert committed_total(log, app, grouped) == sum(len(records) for records in grouped.values())
    expected = through_the_driver(app, search_path, inputs, output)
    assert expected  # each example writes something for these records
    assert records_of(log, output) == expected
