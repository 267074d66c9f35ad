"""A topology upgrade with a backfill, end to end on the real control plane (issue 35).

An app counts events per key on two pods (``tests/support/topologies/backfill_upgrade.py``,
the embedded SQLite log in a claim, ``spec.restore`` on for the build claim). Its revision 2
adds a second count per key, ``totals``, which ``spec.topology.backfill`` asks to build from
the input's history. First a revision whose backfill names a store the topology lacks: the
backfill Job fails, and the upgrade rolls back without replacing a pod. Then the real one:
the operator stops processing, runs the backfill Job (``eddyline backfill job``, PySpark
``local[2]`` in the Job's pod: the real Job controller makes it, the kubelet stand-in runs
it), is SIGKILLed and started again while the Job runs, publishes revision 2, and the new
pods ingest the built store before they process. Input keeps arriving during the backfill.
At the end every key's ``totals`` equals its count of every record ever produced: a record
before the offsets the history ends at is in the built store once, and one after them was
counted by the stream once.
"""

from __future__ import annotations

import collections
import random
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from eddyline_runtime.log import open_log
from eddyline_runtime.log.port import Record
from eddyline_runtime.partitions import TopicPartition, partition_for_key
from eddyline_runtime.query.client import QueryFailedError, QueryRouter
from tests.e2e.test_operator_upgrade import OperatorFreezer, kill_and_restart_operator
from tests.support.control_plane import restore_app
from tests.support.control_plane.operator import Operator
from tests.support.control_plane.operator_fixture import operator_fixture
from tests.support.topologies.backfill_upgrade import COUNTS, INPUT, TOTALS
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

NAMESPACE = "backfill-real"
APP = "bfapp"
PARTITIONS = 4
KEYS = [f"user-{index:03d}" for index in range(60)]
MODULE = "backfill_upgrade"
# Bounds for a broken run on a loaded 2-core machine (a Spark session alone has taken 70 s
# there), not expectations.
TIMEOUT = 420

harness = operator_fixture(
    NAMESPACE, directory="backfill", watching=False, before=restore_app.require_java
)


class History:
    """The input, keyed as the app's partitioner places keys, and what it should count."""

    def __init__(self, log_url: str) -> None:
        self.log_url = log_url
        self.expected: collections.Counter[str] = collections.Counter()
        self._seed = 0
        self._lock = threading.Lock()

    def produce(self, records: int) -> None:
        with self._lock:
            self._seed += 1
            rng = random.Random(self._seed)
            batches: dict[int, list[Record]] = collections.defaultdict(list)
            for index in range(records):
                key = rng.choice(KEYS)
                partition = partition_for_key(key.encode(), PARTITIONS)
                batches[partition].append(Record(key.encode(), b"e", self._seed * 10_000 + index))
                self.expected[key] += 1
            log = open_log(self.log_url)
            try:
                for partition, batch in batches.items():
                    log.produce(TopicPartition(INPUT, partition), batch)
            finally:
                log.close()

    def exact(self, router: QueryRouter, store: str) -> bool:
        with self._lock:
            expected = dict(self.expected)
        for key, count in sorted(expected.items()):
            try:
                result = router.get(store, key)
            except QueryFailedError:
                return False
            if not result.found or int(result.value) != count:
                return False
        return True


def apply(harness: Operator, tmp_path: Path, topology: dict[str, Any]) -> None:
    document: dict[str, Any] = {
        "apiVersion": "eddyline.dev/v1alpha1",
        "kind": "StreamApp",
        "metadata": {"name": APP},
        "spec": {
            "topology": {"upgradeDeadlineSeconds": TIMEOUT, **topology},
            "replicas": 2,
            "log": {"url": f"sqlite:///{APP}/log.db"},
            "config": {"processing.guarantee": "exactly_once_v2", "num.standby.replicas": 1},
            "storage": {"size": "1Gi", "logSize": "1Gi"},
            # The backfill's build goes to the restore claim; no store waits for a restore
            # build below this many changelog records (none here).
            "restore": {
                "when": "WhenLagAbove",
                "lagAbove": 1_000_000,
                "master": "local[2]",
                "waitSeconds": TIMEOUT,
            },
        },
    }
    path = tmp_path / f"streamapp-{topology['revision']}.yaml"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    harness.kubectl("apply", "-f", str(path))


def settled(harness: Operator, revision: str) -> bool:
    status = harness.app(APP).get("status", {})
    ready = harness.condition(APP, "Ready")
    return bool(
        status.get("upgrade") is None
        and (status.get("topology") or {}).get("revision") == revision
        and ready is not None
        and ready["status"] == "True"
    )


def last_upgrade_to(harness: Operator, revision: str) -> dict[str, Any] | None:
    status = harness.app(APP).get("status", {})
    last = status.get("lastUpgrade") or {}
    if status.get("upgrade") is None and (last.get("from") or {}).get("revision") == revision:
        return dict(last)  # a rollback's record is turned round: "from" is what failed
    if status.get("upgrade") is None and (last.get("to") or {}).get("revision") == revision:
        return dict(last)
    return None


def pod_uids(harness: Operator) -> dict[str, str]:
    return {name: p["metadata"]["uid"] for name, p in harness.pods(APP).items()}


def a_failed_backfill_rolls_back(
    harness: Operator, tmp_path: Path, history: History, router: QueryRouter
) -> None:
    """A backfill whose Job fails (its store is not in the topology): rolled back, and not
    one pod replaced, as nothing of revision 2 was published."""
    before = pod_uids(harness)
    apply(
        harness,
        tmp_path,
        {
            "ref": f"{MODULE}:topology_v2",
            "revision": "2",
            "backfill": {"stores": ["no-such-store"]},
        },
    )
    failed = wait_for(lambda: last_upgrade_to(harness, "2"), "revision 2 rolled back", TIMEOUT)
    assert failed["outcome"] == "RolledBack", failed
    assert failed["rollback"]["reason"] == "BackfillFailed", failed
    assert "no-such-store" in failed["rollback"]["message"], failed
    assert [s["step"] for s in failed["steps"]] == [
        "Stopping",
        "Backfilling",
        "RollBackStarting",
    ]
    status = harness.app(APP)["status"]
    assert status["failedTopology"]["revision"] == "2"
    backfilling = harness.condition(APP, "Backfilling")
    assert backfilling is not None and backfilling["reason"] == "BackfillFailed", backfilling
    wait_for(lambda: settled(harness, "1"), "revision 1 running again", TIMEOUT)
    assert pod_uids(harness) == before
    history.produce(1_000)
    wait_for(lambda: history.exact(router, COUNTS), "counts exact after it", TIMEOUT)


def test_an_upgrade_backfills_a_new_store_from_history_and_rolls_back_a_failed_backfill(
    harness: Operator, tmp_path: Path
) -> None:
    log_claim = restore_app.claim_dir(harness, f"{APP}-log")
    log_claim.mkdir(parents=True)
    history = History(f"sqlite:///{log_claim}/log.db")
    log = open_log(history.log_url)
    log.create_topic(INPUT, PARTITIONS)
    log.close()
    history.produce(3_000)
    harness.wait_watching()
    apply(harness, tmp_path, {"ref": f"{MODULE}:topology", "revision": "1"})
    try:
        wait_for(lambda: settled(harness, "1"), "revision 1 running", TIMEOUT)
        service = harness.get("", "services", f"{APP}-query")
        assert service is not None
        router = QueryRouter([f"{service['spec']['clusterIP']}:7070"], timeout=2)
        wait_for(lambda: history.exact(router, COUNTS), "revision 1 counts exact", TIMEOUT)

        a_failed_backfill_rolls_back(harness, tmp_path, history, router)

        # The backfill that works, with the operator killed while its Job runs and input
        # arriving after the positions the history ends at were fixed.
        with OperatorFreezer(harness, "Backfilling", "3") as freezer:
            apply(
                harness,
                tmp_path,
                {
                    "ref": f"{MODULE}:topology_v2",
                    "revision": "3",
                    "backfill": {"stores": [TOTALS]},
                },
            )
            wait_for(freezer.frozen.is_set, "the operator at Backfilling", TIMEOUT)
        history.produce(500)
        kill_and_restart_operator(harness)
        done = wait_for(lambda: last_upgrade_to(harness, "3"), "revision 3 upgraded", TIMEOUT)
        assert done["outcome"] == "Succeeded", done
        assert [s["step"] for s in done["steps"]] == [
            "Stopping",
            "Backfilling",
            "Publishing",
            "Starting",
        ]
        backfill = done["backfill"]
        assert backfill["state"] == "Succeeded" and backfill["stores"] == [TOTALS], backfill
        # The history is every record before the end offsets, and nothing else: the log
        # starts at 0 here, so its size is their sum.
        assert backfill["records"] == sum(backfill["endOffsets"].values()) >= 4_000, backfill
        assert sorted(backfill["endOffsets"]) == [f"{INPUT}:{p}" for p in range(PARTITIONS)]
        # The Job logged how far the history had got as it ran, the records read of all.
        kubelets = harness.cluster.kubelets
        assert kubelets is not None
        job_log = kubelets.pod_log(harness.namespace, f"{backfill['job']}-*")
        total = backfill["records"]
        assert (
            f"running the history: {total:,} of {total:,} records read (100%), "
            f"{PARTITIONS} of {PARTITIONS} task partitions done" in job_log
        ), job_log[-3000:]
        backfilling = harness.condition(APP, "Backfilling")
        assert backfilling is not None and backfilling["reason"] == "BackfillSucceeded"
        build = restore_app.claim_dir(harness, f"{APP}-restore") / APP / TOTALS
        assert sorted(p.name for p in (build / backfill["buildId"]).glob("*.manifest.json")) == [
            f"partition-{p}.manifest.json" for p in range(PARTITIONS)
        ]
        history.produce(500)
        wait_for(lambda: history.exact(router, COUNTS), "counts exact on revision 3", TIMEOUT)
        wait_for(lambda: history.exact(router, TOTALS), "backfilled totals exact", TIMEOUT)
    except (AssertionError, TimeoutError):
        restore_app.print_failure(harness)
        raise
