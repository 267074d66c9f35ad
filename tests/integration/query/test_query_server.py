"""The interactive-query HTTP API (KIP-535) of a group of instances on one log.

Three instances run a word count in one process, each with its own state
directory, its own SqliteLog object on the shared log file (as separate
processes would) and its own query server, under one assignment with a
standby for every stateful task. With three partitions each instance runs
one partition of the counts store actively, keeps a standby of another and
does not hold the third, so every answer of the API can be checked against
the assignment: fresh values on the active host, 421 elsewhere, 503 or stale
values on the standby, lags against the changelog's end offsets.
"""

from __future__ import annotations

import contextlib
import threading
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeAlias

import pytest

from eddyline_runtime.assignor import Assignment, Member
from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing import Processor, StoreSpec, Topology
from eddyline_runtime.query.layout import topology_hash
from eddyline_runtime.query.server import QueryServer
from tests.support.http_client import http_get
from tests.support.prometheus import promtool
from tests.support.query_cluster import (
    COUNTS_SUBTOPOLOGY,
    DEADLINE_SECONDS,
    PARTITIONS,
    STORE,
    partition_of,
    started_cluster,
)
from tests.support.query_cluster import Cluster as HarnessCluster
from tests.support.waiting import wait_for
from tests.support.word_count import streams_config, word_count

# The harness's group, each member reading the log through a plain SqliteLog.
Cluster: TypeAlias = HarnessCluster[SqliteLog]


def key_path(word: str, store: str = STORE) -> str:
    return f"/v1/stores/{store}/keys/{urllib.parse.quote(word, safe='')}"


VOCABULARY = [
    "apple",
    "banana",
    "cherry",
    "date",
    "elder",
    "fig",
    "grape",
    "hazel",
    "iris",
    "juniper",
    "kiwi",
    "lemon",
    "café",
    "and/or",
    "x+y",
    "50%",
]
LINES = [" ".join(word for j, word in enumerate(VOCABULARY) if (i + j) % 4 != 0) for i in range(24)]
EXPECTED = Counter(" ".join(LINES).split())


def words_in(partition: int) -> list[str]:
    return sorted(word for word in EXPECTED if partition_of(word) == partition)


# ---------------------------------------------------------------------------------------
# The shared, read-only group
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    group = started_cluster(tmp_path_factory.mktemp("query-server"), LINES, SqliteLog)
    try:
        yield group
    finally:
        group.close()


def test_the_vocabulary_covers_every_partition() -> None:
    assert all(words_in(partition) for partition in range(PARTITIONS))


def test_the_assignment_gives_each_instance_one_active_and_one_standby_partition(
    cluster: Cluster,
) -> None:
    for partition in range(PARTITIONS):
        holders = {
            cluster.active_node(partition).member.id,
            cluster.standby_node(partition).member.id,
            cluster.other_node(partition).member.id,
        }
        assert len(holders) == 3


def test_stores_lists_the_stores_and_their_serdes(cluster: Cluster) -> None:
    response = http_get(cluster.nodes[0].address, "/v1/stores")
    assert response.status == 200
    assert response.json() == {
        "stores": [{"name": STORE, "key_serde": "string", "value_serde": "long"}]
    }


# -- one key ----------------------------------------------------------------------------


# The fields that say what an answer reflects (query/server.py).
REFLECTS = (
    *("member", "host", "revision", "position", "changelog_offset"),
    *("committed_at_ms", "as_of_ms", "staleness_ms"),
)


def test_a_key_on_its_active_host_is_the_fresh_count(cluster: Cluster) -> None:
    for partition in range(PARTITIONS):
        active = cluster.active_node(partition)
        for word in words_in(partition):
            response = http_get(active.address, key_path(word))
            assert response.status == 200, response.text
            body = response.json()
            # What the answer reflects: who answered, its position, and how fresh it is.
            reflects = {name: body.pop(name) for name in REFLECTS}
            assert (reflects["member"], reflects["host"]) == (active.member.id, active.address)
            assert reflects["revision"] == topology_hash(word_count().describe())
            assert reflects["position"], "the counts store records the position of its input"
            assert reflects["staleness_ms"] == 0
            assert reflects["as_of_ms"] >= reflects["committed_at_ms"] > 0
            assert body == {
                "store": STORE,
                "key": word,
                "found": True,
                "value": EXPECTED[word],
                "partition": partition,
                "task": f"{COUNTS_SUBTOPOLOGY}_{partition}",
                "role": "active",
                "stale": False,
                "lag": 0,
                # exactly_once_v2 without default.state.isolation.level: READ_COMMITTED.
                "isolation": "READ_COMMITTED",
            }


def test_a_missing_key_on_its_active_host_is_found_false(cluster: Cluster) -> None:
    word = "no-such-word"
    response = http_get(cluster.active_node(partition_of(word)).address, key_path(word))
    assert response.status == 200
    body = response.json()
    assert (body["found"], body["value"], body["role"]) == (False, None, "active")


def test_both_isolation_levels_are_accepted_in_any_case(cluster: Cluster) -> None:
    word = words_in(0)[0]
    active = cluster.active_node(0)
    for given, echoed in [
        ("READ_UNCOMMITTED", "READ_UNCOMMITTED"),
        ("READ_COMMITTED", "READ_COMMITTED"),
        ("read_uncommitted", "READ_UNCOMMITTED"),
    ]:
        response = http_get(active.address, key_path(word), isolation=given)
        assert response.status == 200, response.text
        body = response.json()
        assert (body["isolation"], body["value"]) == (echoed, EXPECTED[word])


def test_a_bad_isolation_level_is_400_naming_the_accepted_ones(cluster: Cluster) -> None:
    word = words_in(0)[0]
    address = cluster.active_node(0).address
    for path in (key_path(word), f"/v1/stores/{STORE}/all", f"/v1/stores/{STORE}/range"):
        response = http_get(address, path, isolation="SERIALIZABLE")
        assert response.status == 400, (path, response.text)
        error = response.json()["error"]
        assert "SERIALIZABLE" in error
        assert "READ_COMMITTED" in error and "READ_UNCOMMITTED" in error


def test_a_bad_allow_stale_is_400(cluster: Cluster) -> None:
    word = words_in(0)[0]
    response = http_get(cluster.active_node(0).address, key_path(word), allow_stale="maybe")
    assert response.status == 400
    assert "allow_stale must be true or false" in response.json()["error"]


def test_a_key_on_a_host_without_its_partition_is_421_naming_the_hosts(cluster: Cluster) -> None:
    for partition in range(PARTITIONS):
        word = words_in(partition)[0]
        other = cluster.other_node(partition)
        for allow_stale in ("false", "true"):
            response = http_get(other.address, key_path(word), allow_stale=allow_stale)
            assert response.status == 421, response.text
            body = response.json()
            metadata = other.instance.key_query_metadata(STORE, word.encode())
            assert body["active_host"] == str(metadata.active_host)
            assert body["standby_hosts"] == [str(h) for h in metadata.standby_hosts]
            assert body["partition"] == metadata.partition == partition
            assert body["active_host"] == cluster.active_node(partition).address
            assert body["standby_hosts"] == [cluster.standby_node(partition).address]
            assert f"partition {partition}" in body["error"]


def test_a_key_on_its_standby_host_is_503_with_retry_after(cluster: Cluster) -> None:
    for partition in range(PARTITIONS):
        word = words_in(partition)[0]
        standby = cluster.standby_node(partition)
        response = http_get(standby.address, key_path(word))
        assert response.status == 503, response.text
        assert int(response.headers["Retry-After"]) >= 1
        body = response.json()
        assert body["active_host"] == cluster.active_node(partition).address
        assert body["standby_hosts"] == [standby.address]
        assert body["partition"] == partition
        assert body["lag"] == 0
        assert "standby" in body["error"] and "allow_stale=true" in body["error"]


def test_a_key_on_its_standby_host_with_allow_stale_is_the_replicated_count(
    cluster: Cluster,
) -> None:
    for partition in range(PARTITIONS):
        standby = cluster.standby_node(partition)
        for word in words_in(partition):
            response = http_get(standby.address, key_path(word), allow_stale="true")
            assert response.status == 200, response.text
            body = response.json()
            assert body["value"] == EXPECTED[word]
            assert (body["role"], body["stale"], body["lag"]) == ("standby", True, 0)
            assert (body["partition"], body["task"]) == (partition, f"1_{partition}")


def test_allow_stale_on_the_active_host_still_answers_as_active(cluster: Cluster) -> None:
    word = words_in(1)[0]
    response = http_get(cluster.active_node(1).address, key_path(word), allow_stale="true")
    body = response.json()
    assert (body["role"], body["stale"], body["value"]) == ("active", False, EXPECTED[word])


def test_an_unknown_store_is_404_listing_the_stores(cluster: Cluster) -> None:
    address = cluster.nodes[0].address
    for path in (
        key_path("apple", store="nope"),
        "/v1/stores/nope/all",
        "/v1/stores/nope/range",
        "/v1/stores/nope/metadata/apple",
    ):
        response = http_get(address, path)
        assert response.status == 404, (path, response.text)
        body = response.json()
        assert body["stores"] == [STORE]
        assert '"nope"' in body["error"] and STORE in body["error"]


# -- range and all ----------------------------------------------------------------------


def test_all_serves_only_the_active_partition_and_skips_the_standby(cluster: Cluster) -> None:
    for node in cluster.nodes:
        mine = cluster.assignment.tasks_of(node.member.id)
        active = [t.partition for t in mine.active if t.subtopology == COUNTS_SUBTOPOLOGY]
        standby = [t.partition for t in mine.standby]
        response = http_get(node.address, f"/v1/stores/{STORE}/all")
        assert response.status == 200, response.text
        body = response.json()
        assert body["partitions"] == sorted(active)
        assert body["skipped_partitions"] == sorted(standby)
        assert body["isolation"] == "READ_COMMITTED"
        expected = sorted(w for w in EXPECTED if partition_of(w) in active)
        assert [key for key, _ in body["entries"]] == sorted(expected, key=str.encode)
        assert dict(body["entries"]) == {w: EXPECTED[w] for w in expected}


def test_all_with_allow_stale_merges_active_and_standby_in_key_order(cluster: Cluster) -> None:
    for node in cluster.nodes:
        mine = cluster.assignment.tasks_of(node.member.id)
        held = sorted(
            t.partition for t in mine.active | mine.standby if t.subtopology == COUNTS_SUBTOPOLOGY
        )
        body = http_get(node.address, f"/v1/stores/{STORE}/all", allow_stale="true").json()
        assert (body["partitions"], body["skipped_partitions"]) == (held, [])
        expected = sorted((w for w in EXPECTED if partition_of(w) in held), key=str.encode)
        assert body["entries"] == [[w, EXPECTED[w]] for w in expected]


def test_range_is_inclusive_at_both_ends_and_either_end_may_be_omitted(cluster: Cluster) -> None:
    node = cluster.nodes[0]
    path = f"/v1/stores/{STORE}/range"
    held = {p.partition for p in node.instance.local_store_partitions(STORE)}
    assert len(held) == 2
    ordered = sorted((w for w in EXPECTED if partition_of(w) in held), key=str.encode)
    low, high = ordered[1], ordered[-2]

    def keys(**query: str) -> list[str]:
        response = http_get(node.address, path, allow_stale="true", **query)
        assert response.status == 200, response.text
        return [key for key, _ in response.json()["entries"]]

    assert keys(**{"from": low, "to": high}) == ordered[1:-1]
    assert keys(**{"from": low}) == ordered[1:]
    assert keys(to=high) == ordered[:-1]
    assert keys() == ordered
    assert keys(**{"from": high, "to": low}) == []  # an empty range, not an error


# -- metadata and lags ------------------------------------------------------------------


def test_key_metadata_matches_the_assignment_on_every_host(cluster: Cluster) -> None:
    for word in EXPECTED:
        partition = partition_of(word)
        expected = {
            "active_host": cluster.active_node(partition).address,
            "standby_hosts": [cluster.standby_node(partition).address],
            "partition": partition,
            # Every member's host: where a router looks for other copies.
            "member_hosts": sorted(node.address for node in cluster.nodes),
        }
        for node in cluster.nodes:
            path = f"/v1/stores/{STORE}/metadata/{urllib.parse.quote(word, safe='')}"
            response = http_get(node.address, path)
            assert response.status == 200, response.text
            assert response.json() == expected


def test_lags_report_active_and_standby_partitions_at_the_changelog_end(
    cluster: Cluster,
) -> None:
    for node in cluster.nodes:
        mine = cluster.assignment.tasks_of(node.member.id)
        held = sorted(
            t.partition for t in mine.active | mine.standby if t.subtopology == COUNTS_SUBTOPOLOGY
        )
        response = http_get(node.address, "/v1/lags")
        assert response.status == 200
        body = response.json()
        assert list(body) == [STORE]
        assert sorted(int(p) for p in body[STORE]) == held
        for partition in held:
            end = cluster.log.end_offset(cluster.changelog(partition))
            assert end > 0
            assert body[STORE][str(partition)] == {
                "current_offset_position": end,
                "end_offset_position": end,
                "offset_lag": 0,
            }
        # The same numbers as the instance's own API.
        direct = node.instance.all_local_store_partition_lags()
        assert {
            store: {
                str(p): [lag.current_offset_position, lag.end_offset_position, lag.offset_lag]
                for p, lag in lags.items()
            }
            for store, lags in direct.items()
        } == {
            store: {p: list(info.values()) for p, info in lags.items()}
            for store, lags in body.items()
        }


# -- health and metrics -----------------------------------------------------------------


def test_healthz_and_readyz_are_200_when_every_active_task_runs(cluster: Cluster) -> None:

    for node in cluster.nodes:
        health = http_get(node.address, "/healthz")
        assert health.status == 200
        assert health.json() == {"status": "ok", "state": "RUNNING"}
        ready = http_get(node.address, "/readyz")
        assert ready.status == 200
        assert ready.json() == {"ready": True, "state": "RUNNING"}


def test_metrics_are_prometheus_text_with_thread_and_store_metrics(cluster: Cluster) -> None:
    response = http_get(cluster.nodes[0].address, "/metrics")
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    lines = response.text.splitlines()
    # Kafka's cumulative -total metrics are counters (the name keeps its suffix in the 0.0.4
    # text format); the rest are gauges; each family says what it is.
    assert "# TYPE eddyline_stream_thread_metrics_commit_total counter" in lines
    assert "# TYPE eddyline_stream_thread_metrics_commit_rate gauge" in lines
    assert "# HELP eddyline_stream_thread_metrics_commit_total The total number of commits" in lines
    samples = {}
    for line in lines:
        if line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        samples[name] = float(value)  # every sample line is "name{labels} number"
    commits = [
        v
        for n, v in samples.items()
        if n.startswith("eddyline_stream_thread_metrics_commit_total{")
    ]
    assert commits and sum(commits) >= 1
    # RocksDB store metrics, tagged with the task and the store.
    store_samples = [
        n for n in samples if n.startswith("eddyline_stream_state_metrics_commit_rate{")
    ]
    assert any('rocksdb_state_id="counts"' in n and 'task_id="1_' in n for n in store_samples)
    restore_samples = [
        n for n in samples if n.startswith("eddyline_stream_state_metrics_restore_total{")
    ]
    assert any('store="counts"' in n for n in restore_samples)
    # Lag metrics: each input partition's locally known lag, each standby's offset lag.
    input_lags = {
        n: v
        for n, v in samples.items()
        if n.startswith("eddyline_consumer_fetch_manager_metrics_records_lag{")
    }
    assert input_lags and all(v == 0 for v in input_lags.values()), input_lags
    standby_lags = {
        n: v
        for n, v in samples.items()
        if n.startswith("eddyline_stream_state_metrics_standby_offset_lag{")
    }
    assert standby_lags and all(v == 0 for v in standby_lags.values()), standby_lags


def test_promtool_check_metrics_passes_on_a_live_instances_metrics(cluster: Cluster) -> None:
    """The real promtool lints a running instance's scrape: every family has HELP and a
    type, counters and only counters end in _total, no abbreviated or non-base units."""
    for node in cluster.nodes:
        response = http_get(node.address, "/metrics")
        assert response.status == 200
        types = {
            line.split()[2]: line.split()[3]
            for line in response.text.splitlines()
            if line.startswith("# TYPE ")
        }
        # Active tasks, standbys and restored stores: the families that carry the most kinds.
        assert types["eddyline_stream_state_metrics_restore_total"] == "counter"
        assert types["eddyline_stream_thread_metrics_commit_fenced_total"] == "counter"
        assert types["eddyline_stream_state_updater_metrics_active_restoring_tasks"] == "gauge"
        assert types["eddyline_stream_state_metrics_standby_offset_lag"] == "gauge"
        assert types["eddyline_stream_metrics_acceptable_recovery_lag"] == "gauge"
        checked = promtool("check", "metrics", stdin=response.text)
        assert checked.returncode == 0, checked.stderr + checked.stdout


# ---------------------------------------------------------------------------------------
# Isolation levels on a single instance whose processor holds a transaction open
# ---------------------------------------------------------------------------------------

RELEASE = threading.Event()
HOLDING = threading.Event()


class PutThenWait(Processor):
    """Puts each value under its key; on the value "hold" waits for RELEASE after the put."""

    def process(self, key: Any, value: Any) -> None:
        self.context.get_state_store("latest").put(key.encode(), value.encode())
        if value == "hold":
            HOLDING.set()
            RELEASE.wait(DEADLINE_SECONDS)


def holding_topology(*, persistent: bool = True) -> Topology:
    topology = Topology()
    topology.add_source("in", ["events"], key_serde="string", value_serde="string")
    topology.add_processor("put", PutThenWait, "in")
    store = StoreSpec("latest", persistent=persistent, key_serde="string", value_serde="string")
    topology.add_state_store(store, "put")
    return topology


@contextlib.contextmanager
def holding_app(
    tmp_path: Path, topology: Topology, config: StreamsConfig
) -> Iterator[tuple[str, SqliteLog]]:
    """``topology`` running and served: the server's address and the log (its one input
    partition: events-0); the held write is released on the way out."""
    RELEASE.clear()
    HOLDING.clear()
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("events", 1)
    instance = StreamsInstance(topology, config, log)
    server = QueryServer(instance, "127.0.0.1", 0)
    try:
        instance.start()
        address = str(server.start())
        wait_for(lambda: bool(instance.check() and instance.ready()), "the task runs")
        yield address, log
    finally:
        RELEASE.set()
        server.stop()
        instance.close(30)
        log.close()


@pytest.mark.parametrize(
    "cache_bytes",
    [
        0,  # no record cache: a put goes straight to the store's open transaction
        1024 * 1024,  # the put waits in the record cache, dirty, until the commit
    ],
)
def test_an_uncommitted_write_is_seen_only_under_read_uncommitted(
    tmp_path: Path, cache_bytes: int
) -> None:
    tp = TopicPartition("events", 0)
    config = streams_config(tmp_path / "state", **{"statestore.cache.max.bytes": cache_bytes})
    with holding_app(tmp_path, holding_topology(), config) as (address, log):

        def value(isolation: str | None) -> Any:
            query = {} if isolation is None else {"isolation": isolation}
            response = http_get(address, "/v1/stores/latest/keys/k", **query)
            assert response.status == 200, response.text
            return response.json()["value"]

        log.produce(tp, [Record(b"k", b"v1", 0)])
        # (wait_until_caught_up() right after a produce may not have seen it yet.)
        wait_for(lambda: value("READ_COMMITTED") == "v1", "v1 is committed")
        log.produce(tp, [Record(b"k", b"hold", 1)])
        assert HOLDING.wait(DEADLINE_SECONDS)
        # The processor wrote "hold" but its commit has not happened yet.
        assert value("READ_UNCOMMITTED") == "hold"
        assert value("READ_COMMITTED") == "v1"
        assert value(None) == "v1"  # the default under exactly_once_v2
        RELEASE.set()
        wait_for(lambda: value("READ_COMMITTED") == "hold", "the held write is committed")
        assert value("READ_UNCOMMITTED") == "hold"


def test_readyz_is_503_and_healthz_200_before_the_instance_starts(tmp_path: Path) -> None:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("lines", 1)
    instance = StreamsInstance(word_count(), streams_config(tmp_path / "state"), log)
    server = QueryServer(instance, "127.0.0.1", 0)
    try:
        address = str(server.start())
        ready = http_get(address, "/readyz")
        assert ready.status == 503
        assert ready.json() == {"ready": False, "state": "CREATED"}
        health = http_get(address, "/healthz")
        assert health.status == 200
        assert health.json() == {"status": "ok", "state": "CREATED"}
    finally:
        server.stop()
        instance.close(30)
        log.close()


def test_readyz_turns_200_once_the_tasks_run_without_anyone_polling_the_instance(
    tmp_path: Path,
) -> None:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("lines", 1)
    instance = StreamsInstance(word_count(), streams_config(tmp_path / "state"), log)
    server = QueryServer(instance, "127.0.0.1", 0)
    try:
        address = str(server.start())
        instance.start()

        def tasks_run() -> bool:
            running = [t for thread in instance.threads for t in thread.active.values()]
            return len(running) == 2 and all(task.running for task in running)

        wait_for(tasks_run, "both active tasks run")
        # Only the server looks at the instance, as a Kubernetes probe would.
        wait_for(lambda: http_get(address, "/readyz").status == 200, "readyz turns 200", 3)
    finally:
        server.stop()
        instance.close(30)
        log.close()


def test_a_key_query_before_the_instance_starts_is_503_with_retry_after(tmp_path: Path) -> None:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("lines", 1)
    instance = StreamsInstance(word_count(), streams_config(tmp_path / "state"), log)
    server = QueryServer(instance, "127.0.0.1", 0)
    try:
        address = str(server.start())
        for path in (key_path("apple"), f"/v1/stores/{STORE}/metadata/apple"):
            response = http_get(address, path)
            assert response.status == 503, (path, response.status, response.text)
            assert "Retry-After" in response.headers
    finally:
        server.stop()
        instance.close(30)
        log.close()


def test_a_key_no_assignment_covers_yet_is_503_with_retry_after(tmp_path: Path) -> None:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("lines", 1)
    instance = StreamsInstance(
        word_count(),
        streams_config(tmp_path / "state"),
        log,
        assignment=Assignment(active={"0": frozenset()}, standby={"0": frozenset()}),
    )
    server = QueryServer(instance, "127.0.0.1", 0)
    try:
        instance.start()
        address = str(server.start())
        response = http_get(address, key_path("apple"))
        assert response.status == 503, response.text
        assert "Retry-After" in response.headers
        assert "no assignment covers" in response.json()["error"]
        # No host, but the key's partition: a router looks for the copies members hold
        # while no assignment names them (an upgrade's reset membership).
        metadata = http_get(address, f"/v1/stores/{STORE}/metadata/apple").json()
        assert (metadata["active_host"], metadata["standby_hosts"]) == (None, [])
        assert metadata["partition"] == 0
    finally:
        server.stop()
        instance.close(30)
        log.close()


# The upgrade's reset membership: no task for anyone, and (since a pod on its way out was
# the only host a router knew in ``make bench-queries``) the members with their addresses.
RESET_MEMBERSHIPS = {
    "unlisted": Assignment(active={}, standby={}),
    "listed": Assignment(
        active={},
        standby={},
        members=(Member("0", address="127.0.0.1:1"), Member("1", address="10.0.0.9:7070")),
    ),
}


@pytest.mark.parametrize("reset", sorted(RESET_MEMBERSHIPS))
def test_an_instance_given_nothing_serves_the_copies_on_its_disk_as_standbys(
    tmp_path: Path, reset: str
) -> None:
    """A topology upgrade publishes an empty assignment while no pod may process: a member
    given nothing keeps its copies open as standbys and answers stale queries from them
    (docs/queries.md, "Through a full-cluster topology upgrade"), where before it held
    nothing and every key was 503. Listed in it or not, it serves them; listed, it names
    the other members to a router, which asks them for their copies."""
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("lines", 1)
    log.produce(TopicPartition("lines", 0), [Record(None, b"apple apple", 1)])
    first = StreamsInstance(word_count(), streams_config(tmp_path / "state"), log)
    first.start()
    try:
        first.wait_until_caught_up(DEADLINE_SECONDS)
    finally:
        first.close(30)
    nothing = RESET_MEMBERSHIPS[reset]
    instance = StreamsInstance(
        word_count(), streams_config(tmp_path / "state"), log, assignment=nothing
    )
    server = QueryServer(instance, "127.0.0.1", 0)
    try:
        instance.start()
        address = str(server.start())
        wait_for(
            lambda: bool(instance.local_store_partitions(STORE)),
            "the copy on disk open as a standby",
            DEADLINE_SECONDS,
        )
        stale = http_get(address, key_path("apple") + "?allow_stale=true").json()
        assert (stale["value"], stale["role"], stale["stale"]) == (2, "standby", True), stale
        bounded = http_get(address, key_path("apple") + "?max_staleness_ms=600000")
        assert bounded.status == 200 and bounded.json()["value"] == 2, bounded.text
        fresh = http_get(address, key_path("apple"))
        assert fresh.status == 503, fresh.text  # a standby is not the active copy
        assert http_get(address, "/readyz/serving").status == 200
        assert http_get(address, "/readyz").status == 503  # it processes nothing
        metadata = http_get(address, f"/v1/stores/{STORE}/metadata/apple").json()
        assert (metadata["active_host"], metadata["partition"]) == (None, 0), metadata
        if reset == "listed":
            assert "10.0.0.9:7070" in metadata["member_hosts"], metadata
    finally:
        server.stop()
        instance.close(30)
        log.close()


def test_a_closing_instance_refuses_store_reads_with_503_and_its_layout_names_no_task(
    tmp_path: Path,
) -> None:
    """A member's query server stops only after its final commits (runner.py), so it answers
    while the instance closes and after: store reads are 503 with Retry-After (its copies
    are committed and closed; a router asks another member), and ``/v1/layout`` names no
    task it runs, which a new owner's release watcher reads as released."""
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("lines", 1)
    log.produce(TopicPartition("lines", 0), [Record(None, b"apple apple", 1)])
    instance = StreamsInstance(word_count(), streams_config(tmp_path / "state"), log)
    server = QueryServer(instance, "127.0.0.1", 0)
    try:
        instance.start()
        address = str(server.start())
        instance.wait_until_caught_up(DEADLINE_SECONDS)
        assert http_get(address, key_path("apple")).json()["value"] == 2
        before = http_get(address, "/v1/layout").json()
        assert before["stores"][STORE], before
        instance.close(30)
        for path in (key_path("apple"), f"/v1/stores/{STORE}/all", f"/v1/stores/{STORE}/range"):
            response = http_get(address, path)
            assert response.status == 503, (path, response.status, response.text)
            assert "Retry-After" in response.headers
            assert "shutting down" in response.json()["error"]
        layout = http_get(address, "/v1/layout")
        assert layout.status == 200
        assert layout.json()["stores"] == {}
        assert http_get(address, "/readyz").status == 503
    finally:
        server.stop()
        instance.close(30)
        log.close()


def test_a_response_names_the_level_its_reader_read_at(tmp_path: Path) -> None:
    """An in-memory store is not transactional: under exactly_once_v2 its reader sees an
    open transaction's write, and the response says READ_UNCOMMITTED, not the instance's
    default level (READ_COMMITTED) it did not read at."""
    config = streams_config(tmp_path / "state")
    with holding_app(tmp_path, holding_topology(persistent=False), config) as (address, log):
        log.produce(TopicPartition("events", 0), [Record(b"k", b"hold", 0)])
        assert HOLDING.wait(DEADLINE_SECONDS)
        for path in ("/v1/stores/latest/keys/k", "/v1/stores/latest/all"):
            response = http_get(address, path)
            assert response.status == 200, response.text
            assert response.json()["isolation"] == "READ_UNCOMMITTED", response.text
        assert http_get(address, "/v1/stores/latest/keys/k").json()["value"] == "hold"
        asked = http_get(address, "/v1/stores/latest/keys/k", isolation="READ_COMMITTED")
        assert asked.json()["isolation"] == "READ_COMMITTED"
