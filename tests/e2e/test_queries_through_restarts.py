"""Interactive queries through restarts and a topology upgrade on the real control plane
(issue 36).

The word count runs on three pods (one standby per stateful task) behind the operator, the
real StatefulSet controller and the kubelet stand-in. Input is produced and fully counted
first; then, while a settings change rolls the pods one at a time (while a pod is
SIGKILLed and restarted by its kubelet, and while a full-cluster topology upgrade replaces
every pod), a client keeps querying
every word through the query Service with the ``QueryRouter`` and a staleness bound wide
enough to take a standby's answer. No input arrives during the roll, so every copy that
answers (active, standby, or one restoring its tail) holds the final count: any answer that
differs is wrong, and any query that raises is failed. The test counts both and asserts 0.
"""

from __future__ import annotations

import collections
import datetime
import json
import shutil
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
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
from tests.support.control_plane.operator_fixture import operator_fixture

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
APP = "wordcount"
NAMESPACE = "queries-through-restarts"
MANIFEST = REPO / "examples" / "wordcount" / "streamapp.cluster.yaml"
STORE = "word-counts"
LENGTHS = "word-lengths"  # the store revision 4 (wordcount:topology_v3) adds
WORDS = [f"w{index:02d}" for index in range(40)]
PARTITIONS = 4
# Bounds for a broken run on a loaded 2-core machine, not expectations.
READY_TIMEOUT = 300
# Below pytest's per-test timeout, so a stuck upgrade fails with its own message.
UPGRADE_TIMEOUT = 200
# Wide enough that a caught-up standby, or a copy reopened from a clean close, answers:
# the test is about answers never failing, not about freshness.
MAX_STALENESS_MS = 600_000

operator = operator_fixture(NAMESPACE, directory="operator-queries", watching=False)


@dataclass
class QueryLoad:
    """Queries every word in turn on a thread of its own until stopped; counts each."""

    router: QueryRouter
    expected: collections.Counter[str]
    store: str = STORE
    keys: list[str] = field(default_factory=lambda: list(WORDS))
    queries: int = 0
    failed: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    roles: collections.Counter[str] = field(default_factory=collections.Counter)
    # How long the slowest query took (s), printed only: tests assert behaviour, not speed.
    slowest: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> QueryLoad:
        self._thread = threading.Thread(target=self._run, name="query-load", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    def _run(self) -> None:
        while not self._stop.is_set():
            for word in self.keys:
                if self._stop.is_set():
                    return
                self.queries += 1
                started = time.monotonic()
                try:
                    result = self.router.get(self.store, word, max_staleness_ms=MAX_STALENESS_MS)
                except Exception as error:  # every kind counts: the promise is "never fails"
                    self.failed.append(f"{word}: {type(error).__name__}: {error}")
                    continue
                finally:
                    self.slowest = max(self.slowest, time.monotonic() - started)
                self.roles[result.role] += 1
                count = self.expected.get(word, 0)
                value = int(result.value) if result.found else 0
                if value != count:
                    self.wrong.append(f"{word}: {value} from {result.host} (expected {count})")


def produce(log_url: str, expected: collections.Counter[str], lines: int) -> None:
    batch = [
        " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(1 + i % 5)) for i in range(lines)
    ]
    for line in batch:
        expected.update(line.split())
    log = open_log(log_url)
    try:
        now = int(time.time() * 1000)
        for partition in range(PARTITIONS):
            records = [Record(None, line.encode(), now) for line in batch[partition::PARTITIONS]]
            log.produce(TopicPartition("text-lines", partition), records)
    finally:
        log.close()


def _settled(operator: Operator, generation: int) -> bool:
    app = operator.app(APP)
    status = app.get("status", {})
    ready = operator.condition(APP, "Ready")
    progressing = operator.condition(APP, "Progressing")
    return bool(
        status.get("readyReplicas") == 3
        and status.get("observedGeneration", 0) >= generation
        and ready is not None
        and ready["status"] == "True"
        and progressing is not None
        and progressing["status"] == "False"
    )


def _apply(
    operator: Operator,
    topology: dict[str, str] | None = None,
    config: dict[str, Any] | None = None,
) -> int:
    """The manifest with ``config`` over its settings and ``topology`` for its own."""
    document: dict[str, Any] = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    document["spec"]["config"].update(config or {})
    if topology is not None:
        document["spec"]["topology"] = topology
    operator.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(document))
    return int(operator.app(APP)["metadata"]["generation"])


def _upgraded(operator: Operator, attempted: str, outcome: str = "Succeeded") -> bool:
    """The upgrade to revision ``attempted`` ended with ``outcome`` (a rollback's record
    goes from it back to the revision before); one that ended otherwise fails the test."""
    status = operator.app(APP).get("status", {})
    if status.get("upgrade") is not None:
        return False
    last = status.get("lastUpgrade") or {}
    ends = {(last.get(end) or {}).get("revision") for end in ("from", "to")}
    if attempted not in ends:
        return False  # the previous upgrade's record: this one has not begun or not ended
    if last.get("outcome") != outcome:
        raise RuntimeError(f"the upgrade ended {last.get('outcome')}, not {outcome}: {last}")
    running = (status.get("topology") or {}).get("revision")
    return (running == attempted) == (outcome == "Succeeded")


def _standby_open(router: QueryRouter, store: str = STORE) -> bool:
    """Every word's metadata (as the router gets it) names a standby host that answers and
    holds the word's partition caught up: what a pod's loss leaves answered."""
    try:
        for word in WORDS:
            metadata = router.metadata(store, word)
            partition = str(metadata["partition"])
            if not any(
                _layout_holds(host, store, partition) for host in metadata.get("standby_hosts", [])
            ):
                return False
    except (QueryFailedError, OSError, ValueError):
        return False
    return True


def _layout_holds(host: str, store: str, partition: str) -> bool:
    """Whether ``host``'s ``/v1/layout`` lists a standby copy of ``partition`` at lag 0."""
    with urllib.request.urlopen(f"http://{host}/v1/layout", timeout=2) as answer:
        layout = json.loads(answer.read())
    copy = (layout.get("stores") or {}).get(store, {}).get(partition) or {}
    return bool(copy.get("role") == "standby" and int(copy.get("lag", 0)) == 0)


def _counts_exact(
    router: QueryRouter, expected: collections.Counter[str], store: str = STORE
) -> bool:
    try:
        return all(router.get(store, key).value == count for key, count in expected.items())
    except Exception:
        return False


@dataclass
class App:
    operator: Operator
    router: QueryRouter
    expected: collections.Counter[str]


@pytest.fixture(scope="module")
def app(operator: Operator, control_plane: Cluster) -> App:
    """The word count, settled, with every word counted; no input arrives after this."""
    assert control_plane.provisioner is not None
    claim = control_plane.provisioner.directory(NAMESPACE, f"{APP}-log")
    claim.mkdir(parents=True)
    log_url = f"sqlite:///{claim}/log.db"
    log = open_log(log_url)
    log.create_topic("text-lines", PARTITIONS)
    log.create_topic("watched-words", PARTITIONS)  # topology_v2's second input
    log.close()
    operator.wait_watching()
    operator.kubectl("apply", "-f", str(MANIFEST))
    try:
        wait_until(lambda: _settled(operator, 1), "3 ready pods, settled", READY_TIMEOUT)
        service = operator.get("", "services", f"{APP}-query")
        assert service is not None
        router = QueryRouter([f"{service['spec']['clusterIP']}:7070"], timeout=2)
        expected: collections.Counter[str] = collections.Counter()
        produce(log_url, expected, 2_000)
        wait_until(lambda: _counts_exact(router, expected), "exact counts", READY_TIMEOUT)
    except (AssertionError, TimeoutError):
        print(operator.describe_failure(APP))
        raise
    return App(operator, router, expected)


def _under_load(app: App, what: str, operation: Callable[[], None], *also: QueryLoad) -> QueryLoad:
    """Runs ``operation`` (which returns once it is over) while the query load runs (and
    ``also`` loads, started and stopped with it)."""
    load = QueryLoad(app.router, app.expected)
    started = time.monotonic()
    for each in (load, *also):
        each.start()
    try:
        operation()
        time.sleep(2)  # a few more rounds of queries against the settled pods
    except (AssertionError, TimeoutError):
        print(app.operator.describe_failure(APP))
        raise
    finally:
        for each in (load, *also):
            each.stop()
    for each in (load, *also):
        print(
            f"{what}, {each.store}: {each.queries} queries in "
            f"{time.monotonic() - started:.1f} s, {len(each.failed)} failed, "
            f"{len(each.wrong)} wrong, answered by {dict(each.roles)}, "
            f"slowest {each.slowest * 1000:.0f} ms"
        )
        for failure in each.failed[:5]:  # whole: an assertion's repr cuts the middle out
            print(f"  failed: {failure}")
    return load


def test_a_rolling_restart_fails_no_query_and_answers_every_word_right(app: App) -> None:
    operator = app.operator
    uids = {name: pod["metadata"]["uid"] for name, pod in operator.pods(APP).items()}

    def roll() -> None:
        generation = _apply(operator, config={"commit.interval.ms": 200})

        def rolled() -> bool:
            pods = operator.pods(APP)
            replaced = all(
                name in pods and pods[name]["metadata"]["uid"] != uid for name, uid in uids.items()
            )
            return replaced and _settled(operator, generation)

        wait_until(rolled, "every pod replaced and the app settled", READY_TIMEOUT)

    load = _under_load(app, "rolling restart", roll)
    assert load.queries > len(WORDS)
    assert load.failed == [], load.failed[:10]
    assert load.wrong == [], load.wrong[:10]


def test_a_sigkilled_pod_fails_no_query_and_answers_every_word_right(
    app: App, control_plane: Cluster
) -> None:
    operator = app.operator
    assert control_plane.kubelets is not None
    kubelets = control_plane.kubelets
    victim = f"{APP}-1"
    # What the promise rests on: each task's standby open, caught up and named where the
    # router looks. Right after the rolling restart before this test the pods are new (new
    # addresses), and Ready and settled say nothing of standbys; a kill then once left
    # partition 0 on no member the router reached (1 query of 529 failed, "none of the
    # members that answered holds partition 0"), which no routing can answer.
    waited = time.monotonic()
    wait_until(lambda: _standby_open(app.router), "a standby for every word", READY_TIMEOUT)
    print(f"a standby for every word after {time.monotonic() - waited:.1f} s")

    def kill() -> None:
        # Second precision, as the API's times: the Ready transition must come after this.
        killed_at = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
        kubelets.kill_container(NAMESPACE, victim)

        def restarted() -> bool:
            status = operator.pods(APP)[victim]["status"]
            statuses = status.get("containerStatuses", [])
            ready = next((c for c in status.get("conditions", []) if c["type"] == "Ready"), {})
            # Ready again after the kill: the restarted process restored and runs its tasks.
            back = ready.get("status") == "True" and (
                datetime.datetime.fromisoformat(ready["lastTransitionTime"]) >= killed_at
            )
            return bool(statuses and statuses[0]["restartCount"] > 0 and back) and _settled(
                operator, 1
            )

        wait_until(restarted, f"{victim} restarted by its kubelet and settled", READY_TIMEOUT)

    load = _under_load(app, "pod SIGKILL", kill)
    assert load.failed == [], load.failed[:10]
    assert load.wrong == [], load.wrong[:10]


def test_a_wiped_store_restoring_fails_no_query_and_answers_every_word_right(
    app: App, control_plane: Cluster
) -> None:
    """A pod's state volume lost: its container is killed and its claim wiped while it is
    down, so it restores every copy from the changelogs. Its copies know no staleness until
    they catch up (docs/queries.md), so the other pods' copies answer; the query Service
    sends requests to the restoring pod too (``publishNotReadyAddresses``), and the router
    moves on from it."""
    operator = app.operator
    assert control_plane.kubelets is not None and control_plane.provisioner is not None
    kubelets = control_plane.kubelets
    victim = f"{APP}-2"
    state = control_plane.provisioner.directory(NAMESPACE, f"state-{victim}")
    assert any(state.glob(f"*_*/{STORE}")), f"no store copy in {state}"

    def container() -> dict[str, Any]:
        statuses = operator.pods(APP)[victim]["status"].get("containerStatuses", [])
        return dict(statuses[0]) if statuses else {}

    def wipe() -> None:
        # A kubelet restarts a first crash at once: the second waits out a back-off, and
        # the claim is wiped while the container is down.
        before = int(container().get("restartCount", 0))
        kubelets.kill_container(NAMESPACE, victim)
        wait_until(
            lambda: (
                int(container().get("restartCount", 0)) > before
                and "running" in container().get("state", {})
            ),
            f"{victim} running again",
            READY_TIMEOUT,
        )
        killed_at = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
        kubelets.kill_container(NAMESPACE, victim)
        wait_until(
            lambda: "running" not in container().get("state", {}),
            f"{victim} down",
            READY_TIMEOUT,
        )
        for entry in state.iterdir():
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()

        def restored() -> bool:
            status = operator.pods(APP)[victim]["status"]
            ready: dict[str, Any] = next(
                (c for c in status.get("conditions", []) if c["type"] == "Ready"), {}
            )
            back = ready.get("status") == "True" and (
                datetime.datetime.fromisoformat(ready["lastTransitionTime"]) >= killed_at
            )
            return back and _settled(operator, 1)

        wait_until(restored, f"{victim} restored and Ready again", READY_TIMEOUT)

    load = _under_load(app, "wiped-store restore", wipe)
    assert any(state.glob(f"*_*/{STORE}")), f"{victim} restored no copy"
    assert load.failed == [], (len(load.failed), load.failed[:5])
    assert load.wrong == [], load.wrong[:10]


def test_a_topology_upgrade_fails_no_query_and_answers_every_word_right(app: App) -> None:
    """Stopping leaves every pod serving its copies as standbys, Publishing replaces them one
    at a time while the others serve, Starting assigns the new revision's tasks
    (docs/queries.md, "Through a full-cluster topology upgrade")."""
    operator = app.operator
    uids = {name: pod["metadata"]["uid"] for name, pod in operator.pods(APP).items()}

    def upgrade() -> None:
        _apply(operator, {"ref": "wordcount:topology_v2", "revision": "2"})
        wait_until(lambda: _upgraded(operator, "2"), "the upgrade to revision 2", UPGRADE_TIMEOUT)

    load = _under_load(app, "topology upgrade", upgrade)
    pods = operator.pods(APP)
    assert all(pods[name]["metadata"]["uid"] != uid for name, uid in uids.items())
    assert load.failed == [], (len(load.failed), load.failed[:5])
    assert load.wrong == [], load.wrong[:10]
    # The copies answered while no pod processed: the old pods' and the new ones' before
    # the first assignment of the new revision (a standby's, by the report's word).
    assert load.roles["standby"] > 0, dict(load.roles)


def test_a_rolled_back_upgrade_fails_no_query_and_answers_every_word_right(app: App) -> None:
    """Revision 3 runs the first topology again with relocation off: its first pod refuses
    the stores it finds under revision 2's sub-topologies, and the operator rolls back to
    revision 2 (test_operator_upgrade's case) while the query load runs."""
    operator = app.operator

    def rolled_back() -> None:
        _apply(
            operator,
            {"ref": "wordcount:topology", "revision": "3"},
            {"automatic.state.relocation": False},
        )
        wait_until(
            lambda: _upgraded(operator, "3", outcome="RolledBack"),
            "the upgrade to revision 3 rolled back",
            UPGRADE_TIMEOUT,
        )
        wait_until(lambda: _settled(operator, 1), "revision 2 settled again", READY_TIMEOUT)

    load = _under_load(app, "rolled-back upgrade", rolled_back)
    assert load.failed == [], (len(load.failed), load.failed[:5])
    assert load.wrong == [], load.wrong[:10]
    revisions = {
        p["metadata"]["labels"]["eddyline.dev/revision"] for p in operator.pods(APP).values()
    }
    assert revisions == {"2"}


def _upgrade_changing_a_store(
    app: App, what: str, ref: str, revision: str, changed: QueryLoad
) -> None:
    """Upgrades to ``ref`` as ``revision`` under the load of every word of the store both
    revisions have, and ``changed``'s of the store only one has: the first fails no query;
    the second fails only saying that no copy or no such store answers, never wrong."""

    def upgrade() -> None:
        _apply(app.operator, {"ref": ref, "revision": revision})
        wait_until(
            lambda: _upgraded(app.operator, revision),
            f"the upgrade to revision {revision}",
            UPGRADE_TIMEOUT,
        )

    load = _under_load(app, what, upgrade, changed)
    assert load.failed == [], (len(load.failed), load.failed[:5])
    assert load.wrong == [], load.wrong[:10]
    assert changed.wrong == [], changed.wrong[:10]
    unexplained = [f for f in changed.failed if "QueryFailedError" not in f]
    assert unexplained == [], unexplained[:5]


def test_a_store_the_new_revision_adds_is_refused_clearly_until_it_runs_then_counts(
    app: App, control_plane: Cluster
) -> None:
    """Revision 4 adds ``word-lengths`` beside ``word-counts`` (docs/queries.md, "Stores
    that differ between the revisions"): the old store answers every query throughout; the
    new one has no copy before its first assignment, so a query for it fails saying so
    (never a wrong value), then it answers, empty, and counts what arrives after."""
    lengths = QueryLoad(app.router, collections.Counter(), store=LENGTHS, keys=["2", "3", "4"])

    _upgrade_changing_a_store(app, "upgrade adding a store", "wordcount:topology_v3", "4", lengths)
    assert lengths.roles["active"] > 0, "the new store never answered before the end"

    assert control_plane.provisioner is not None
    claim = control_plane.provisioner.directory(NAMESPACE, f"{APP}-log")
    arrived: collections.Counter[str] = collections.Counter()
    produce(f"sqlite:///{claim}/log.db", arrived, 200)
    app.expected.update(arrived)
    # Only what arrived after revision 4 started: the new store is not built from history.
    by_length = collections.Counter(str(len(word)) for word in arrived.elements())
    wait_until(
        lambda: (
            _counts_exact(app.router, app.expected)
            and _counts_exact(app.router, by_length, LENGTHS)
        ),
        "exact counts in both stores",
        READY_TIMEOUT,
    )


def test_a_store_the_new_revision_drops_answers_until_its_pods_go_then_is_refused(
    app: App,
) -> None:
    """Revision 5 is ``topology_v2`` again, without ``word-lengths`` (docs/queries.md,
    "Stores that differ between the revisions"): the kept store answers every query; the
    dropped one answers right (from the old pods' copies) or fails saying so, never with a
    wrong value, and once the upgrade is done every pod refuses it as unknown (404)."""
    # What revision 4 counted (the test before this one): the copies keep it until they go.
    counted = {key: app.router.get(LENGTHS, key).value for key in ("2", "3", "4")}
    lengths = QueryLoad(
        app.router,
        collections.Counter({key: count for key, count in counted.items() if count}),
        store=LENGTHS,
        keys=sorted(counted),
    )

    _upgrade_changing_a_store(
        app, "upgrade dropping a store", "wordcount:topology_v2", "5", lengths
    )
    with pytest.raises(QueryFailedError, match=f'no store named "{LENGTHS}"'):
        app.router.get(LENGTHS, "3")
