"""A windowed aggregation through the operator, on the real control plane, and a full-cluster
upgrade that inserts a step before it.

The ``page_views`` example (views per region per 1-minute tumbling window, final results)
runs on two pods with a standby each. Its windowed counts are read through the query
Service's window endpoint (``/v1/stores/{store}/windows/{key}``) and must be exact. Then the
topology goes to ``topology_v2``, which puts a bot filter, behind a repartition topic of its
own, before the windowed aggregation: the aggregation's sub-topology goes from 1 to 2. The
window store (and its final-results buffer) keeps its given name, so every copy of it,
standbys included, is the same directory moved to its new ordinal, no pod restores a record
from a changelog, and the windows still open go on counting from where they were; the bot
views that follow show revision 2 runs.

The chart release, operator and namespace are this module's own; the control plane is the
session's.
"""

from __future__ import annotations

import collections
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from eddyline_runtime.log import Record, open_log
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.query.client import QueryFailedError, QueryRouter
from tests.support.control_plane.client import wait_until
from tests.support.control_plane.cluster import Cluster
from tests.support.control_plane.operator import Operator
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
APP = "page-views"
NAMESPACE = "page-views-windows"
MANIFEST = REPO / "examples" / "page_views" / "streamapp.cluster.yaml"
STORE = "page-views-per-region-minute"
BUFFER = f"{STORE}-final-buffer"
PARTITIONS = 2
REPLICAS = 2
REGIONS = ["eu", "us", "apac", "latam", "mea"]
MINUTE = 60_000
# Event time of the first window: minute-aligned, as the tumbling windows are.
T0 = 1_790_000_000_000 - 1_790_000_000_000 % MINUTE
# Bounds for a broken run on a loaded 2-core machine, not expectations.
TIMEOUT = 180

Window = tuple[str, int]  # (region, window start)


class PageViews:
    """The example seen from outside the cluster: views written into its log with event
    times of our choosing, windowed counts read through the query Service."""

    def __init__(self, harness: Operator, log_url: str) -> None:
        self.harness = harness
        self.log_url = log_url
        self.service = ""
        self.expected: collections.Counter[Window] = collections.Counter()
        self.last_answer = ""
        # The windows the store still keeps: retention is size + grace (70 s, as Kafka's
        # default), so once views of minute m arrived, windows before m - 1 have expired.
        self.retained_from = T0

    def produce(self, views: list[tuple[str, str, int, bool]]) -> None:
        """(user, region, event time, bot) views, each user's on one partition; bot views
        are expected to count under revision 1 only (``counted_bots``)."""
        log = open_log(self.log_url)
        try:
            by_partition: dict[int, list[Record]] = collections.defaultdict(list)
            for user, region, timestamp, bot in views:
                value: dict[str, Any] = {"region": region, "page": "/home"}
                if bot:
                    value["bot"] = True
                record = Record(user.encode(), json.dumps(value).encode(), timestamp)
                by_partition[int(user[1:]) % PARTITIONS].append(record)
            for partition, records in by_partition.items():
                log.produce(TopicPartition("page-views", partition), records)
        finally:
            log.close()

    def wave(self, made: list[tuple[str, str, int, bool]], bots_count: bool, what: str) -> None:
        """Produces ``made`` and waits until the windowed counts take it in exactly."""
        self.produce(made)
        self.expected.update(
            (region, timestamp - timestamp % MINUTE)
            for _, region, timestamp, bot in made
            if bots_count or not bot
        )
        newest = max(timestamp - timestamp % MINUTE for _, _, timestamp, _ in made)
        self.retained_from = max(T0, newest - MINUTE)
        self.wait_exact(what)

    def final_results(self) -> list[tuple[str, dict[str, Any]]]:
        """Every (key, value) on the output topic, partition by partition."""
        log = open_log(self.log_url)
        found: list[tuple[str, dict[str, Any]]] = []
        try:
            spec = log.topics().get("page-views-per-minute")
            for partition in range(spec.partitions if spec is not None else 0):
                tp, offset = TopicPartition("page-views-per-minute", partition), 0
                while fetched := log.fetch(tp, offset).records:
                    for record in fetched:
                        assert record.key is not None and record.value is not None
                        found.append((record.key.decode(), json.loads(record.value)))
                    offset = fetched[-1].offset + 1
        finally:
            log.close()
        return found

    def windows_exact(self) -> bool:
        router = QueryRouter([self.service], timeout=2)
        by_region: dict[str, dict[int, int]] = collections.defaultdict(dict)
        for (region, start), views in self.expected.items():
            if start >= self.retained_from:
                by_region[region][start] = views
        for region, expected in by_region.items():
            try:
                result = router.fetch_windows(STORE, region, self.retained_from, T0 + 10 * MINUTE)
            except QueryFailedError as error:
                self.last_answer = str(error)
                return False
            found = {e.start: int(e.value) for e in result.entries}
            ends = {e.end for e in result.entries}
            if found != expected or ends != {start + MINUTE for start in found}:
                self.last_answer = f"{region}: {found} (expected {expected})"
                return False
        return True

    def wait_exact(self, what: str) -> None:
        try:
            wait_until(self.windows_exact, what, TIMEOUT)
        except TimeoutError as error:
            print(self.harness.describe_failure(APP))
            raise AssertionError(f"{error}; last answer {self.last_answer}") from None

    def restored_records(self) -> int:
        """Records the running pods restored from changelogs since they started, over every
        store partition (the window store's and its buffer's, actives and standbys)."""
        total, found = 0.0, 0
        for pod in self.harness.pods(APP).values():
            ip = pod.get("status", {}).get("podIP")
            with urllib.request.urlopen(f"http://{ip}:7070/metrics", timeout=5) as response:
                for line in response.read().decode().splitlines():
                    if line.startswith("eddyline_stream_state_metrics_restore_total"):
                        total += float(line.rsplit(" ", 1)[1])
                        found += 1
        # Both stores of every active partition report (a missing metric is no 0).
        assert found >= 2 * PARTITIONS, f"only {found} restore metrics on the pods"
        return int(total)

    def apply(self, tmp: Path, ref: str, revision: str) -> None:
        document: dict[str, Any] = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
        document["spec"]["topology"] = {"ref": ref, "revision": revision}
        path = tmp / f"streamapp-{revision}.yaml"
        path.write_text(yaml.safe_dump(document), encoding="utf-8")
        self.harness.kubectl("apply", "-f", str(path))


def minute_of_views(
    seed: int, minute: int, per_region: int, bots: int = 0
) -> list[tuple[str, str, int, bool]]:
    """``per_region`` views and ``bots`` bot views per region, all in one minute (one
    window per region): whatever order the two source tasks write them into the
    repartition topic, none is later than the window's grace. Users u<seed*1000+n>."""
    made = []
    for region_index, region in enumerate(REGIONS):
        for n in range(per_region + bots):
            user = f"u{seed * 1000 + region_index * 100 + n}"
            made.append((user, region, T0 + minute * MINUTE + 1_000 * n, n >= per_region))
    return made


@pytest.fixture(scope="module")
def harness(control_plane: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    running = Operator(control_plane, tmp_path_factory.mktemp("operator-windows"), NAMESPACE)
    running.install()
    running.start()
    try:
        yield running
    finally:
        # The app goes while its operator still runs (kopf's finalizer), its pods with it.
        running.kubectl.run("delete", "sapp", "--all", "--timeout=60s")
        try:
            wait_until(lambda: not running.objects("", "pods"), "the module's pods gone", 90)
        finally:
            running.stop()


def claim_dir(harness: Operator, claim: str) -> Path:
    """Where the local provisioner puts (or will put) a claim's volume."""
    assert harness.cluster.provisioner is not None
    return harness.cluster.provisioner.directory(harness.namespace, claim)


def settled(harness: Operator, revision: str) -> bool:
    app = harness.app(APP)
    status = app.get("status", {})
    ready = harness.condition(APP, "Ready")
    return bool(
        status.get("upgrade") is None
        and (status.get("topology") or {}).get("revision") == revision
        and status.get("readyReplicas") == REPLICAS
        and ready is not None
        and ready["status"] == "True"
    )


def store_directories(harness: Operator) -> dict[str, set[tuple[str, int, int]]]:
    """Per pod, the (store, partition, inode) of every copy of the two stores on its state
    claim: a store relocated by rename keeps its inode."""
    found: dict[str, set[tuple[str, int, int]]] = {}
    for ordinal in range(REPLICAS):
        claim = claim_dir(harness, f"state-{APP}-{ordinal}")
        found[f"{APP}-{ordinal}"] = {
            (path.name, int(path.parent.name.split("_")[1]), path.stat().st_ino)
            for store in (STORE, BUFFER)
            for path in claim.glob(f"*_*/{store}")
        }
    return found


def owners(harness: Operator) -> set[str]:
    """The sub-topologies whose task directories hold a copy of either store."""
    return {
        path.parent.name.split("_")[0]
        for ordinal in range(REPLICAS)
        for store in (STORE, BUFFER)
        for path in claim_dir(harness, f"state-{APP}-{ordinal}").glob(f"*_*/{store}")
    }


def test_page_views_windows_are_exact_and_survive_an_upgrade_inserting_a_filter(
    harness: Operator, tmp_path: Path
) -> None:
    claim = claim_dir(harness, f"{APP}-log")
    claim.mkdir(parents=True)
    app = PageViews(harness, f"sqlite:///{claim}/log.db")
    log = open_log(app.log_url)  # the input topic exists before the app, as on a cluster
    log.create_topic("page-views", PARTITIONS)
    log.close()
    harness.wait_watching()
    app.apply(tmp_path, "page_views:topology", "1")
    service = wait_for(
        lambda: harness.get("", "services", f"{APP}-query"), "the query Service", TIMEOUT
    )
    app.service = f"{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"

    # Revision 1: minutes 0 and 1, a wave each; it counts bot views like any other.
    app.wave(minute_of_views(1, 0, 3, bots=2), True, "revision 1's counts of minute 0")
    app.wave(minute_of_views(2, 1, 3), True, "revision 1's counts of minute 1")
    wait_for(lambda: settled(harness, "1"), "revision 1 settled", TIMEOUT)
    assert app.final_results() == []  # no window has closed yet (minute 0 at 1:10)
    on_disk = store_directories(harness)
    held = {(store, partition) for copies in on_disk.values() for store, partition, _ in copies}
    assert held == {(s, p) for s in (STORE, BUFFER) for p in range(PARTITIONS)}, on_disk
    assert owners(harness) == {"1"}

    # Revision 2: a bot filter before the windowed aggregation, in a sub-topology of its
    # own; the aggregation goes from sub-topology 1 to 2.
    app.apply(tmp_path, "page_views:topology_v2", "2")
    wait_for(lambda: settled(harness, "2"), "revision 2 settled", TIMEOUT)
    last = harness.app(APP)["status"]["lastUpgrade"]
    assert last["outcome"] == "Succeeded" and last["to"]["revision"] == "2", last
    assert [s["step"] for s in last["steps"]] == ["Stopping", "Publishing", "Starting"]
    # Every copy, standbys included, is the same directory under the new ordinal.
    assert store_directories(harness) == on_disk
    assert owners(harness) == {"2"}
    app.wait_exact("the same windowed counts after the upgrade")
    assert app.restored_records() == 0

    # The open minute 1 goes on from its count, and bot views are dropped now; minute 2
    # closes minute 0, whose final count (bots of revision 1 included) leaves the relocated
    # buffer once per region, and ends its retention in the relocated window store.
    app.wave(minute_of_views(3, 1, 2, bots=3), False, "minute 1 counted on by revision 2")
    app.wave(minute_of_views(4, 2, 2, bots=1), False, "revision 2's counts of minute 2")
    expected_final = sorted(
        (
            f"{region}@{T0}",
            {"region": region, "start": T0, "end": T0 + MINUTE, "views": views},
        )
        for (region, start), views in app.expected.items()
        if start == T0
    )
    wait_for(lambda: len(app.final_results()) >= len(REGIONS), "minute 0's final results", TIMEOUT)
    assert sorted(app.final_results(), key=lambda r: r[0]) == expected_final
    router = QueryRouter([app.service], timeout=2)
    assert all(not router.fetch_windows(STORE, r, T0, T0).entries for r in REGIONS)
    assert app.restored_records() == 0
    assert {
        p["metadata"]["labels"]["eddyline.dev/revision"] for p in harness.pods(APP).values()
    } == {"2"}
