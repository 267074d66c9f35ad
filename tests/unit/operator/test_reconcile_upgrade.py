"""The topology upgrade's state machine, cycle by cycle, without a server.

Each test drives :func:`plan` the way the handlers do: the status a cycle writes is the
status the next cycle reads, and the observed objects are what the previous cycles' actions
would have produced (pods deleted, the ConfigMap applied, pods of the new revision).
"""

from __future__ import annotations

import copy
import dataclasses
import re
from typing import Any

import pytest

from eddyline_operator.reconcile import names
from eddyline_operator.reconcile.plan import Observed, Plan, plan
from eddyline_operator.reconcile.status_record import dump_status
from eddyline_operator.reconcile.upgrade import translate_placement
from eddyline_runtime.membership import MemberReport, Membership, StoreCopy
from eddyline_runtime.partitions import TaskId
from eddyline_runtime.processing import StreamsBuilder
from eddyline_runtime.resource_names import GeneratedName
from tests.support.k8s_objects import body, pod, stateful_set, three_zones

Obj = dict[str, Any]
PARTITIONS = range(4)
V1 = {"ref": "wordcount:topology", "revision": "1"}
V2 = {"ref": "wordcount:topology_v2", "revision": "2"}


def layout_report(
    member: str, revision: str, *, restoring: bool = False, parked: bool = False
) -> MemberReport:
    """Word count's layout: v1 counts in sub-topology 1, v2 (a new first one) in 2.
    ``parked``: given nothing, the pod holds its copy as a standby (it serves, not
    processes)."""
    owner = 1 if revision == "1" else 2
    tasks = frozenset(TaskId(s, p) for s in range(owner + 1) for p in PARTITIONS)
    role = "restoring" if restoring else "standby" if parked else "active"
    return MemberReport(
        member=member,
        topology_hash=f"hash-v{revision}",
        tasks=tasks,
        stateful=frozenset(TaskId(owner, p) for p in PARTITIONS),
        stores={"word-counts": {0: StoreCopy(role, 0)}},
        ready=not restoring,
        store_owners={"word-counts": owner},
    )


class Driver:
    """The cluster as the plans leave it: status written back, objects applied."""

    def __init__(self) -> None:
        self.app = body()
        self.nodes = three_zones()
        self.pods: list[Obj] = []
        self.membership: Membership | None = None
        self.manifest: str | None = None
        self.revision = "1"
        self.now = "2026-11-23T10:00:00Z"
        self.template_hash: str | None = None

    def cycle(self, *, reports: dict[str, MemberReport] | None = None) -> Plan:
        result = plan(
            Observed(
                body=copy.deepcopy(self.app),
                pods=self.pods,
                nodes=self.nodes,
                membership=self.membership,
                reports=reports if reports is not None else self.reports(),
                applied_manifest=self.manifest,
                now=self.now,
            )
        )
        self.app["status"] = {**(self.app.get("status") or {}), **dump_status(result.status)}
        if result.membership is not None:
            self.membership = result.membership
        if not result.objects:  # an invalid spec applies nothing
            return result
        config = next(o for o in result.objects if o["metadata"]["name"] == "wc-config")
        self.manifest = config["data"][names.MANIFEST_KEY]
        template = stateful_set(result.objects)["spec"]["template"]
        self.template_hash = template["metadata"]["annotations"][names.ANNOTATION_CONFIG_HASH]
        return result

    def reports(self) -> dict[str, MemberReport]:
        return {
            p["metadata"]["name"]: layout_report(p["metadata"]["name"], self.revision)
            for p in self.pods
            if "deletionTimestamp" not in p["metadata"]
        }

    def start_pods(self, revision: str, count: int = 3) -> None:
        self.revision = revision
        self.pods = [
            pod(i, revision=revision, config_hash=self.template_hash) for i in range(count)
        ]

    def settle(self) -> None:
        self.cycle()
        self.start_pods("1")
        for _ in range(3):
            self.cycle()
        assert self.app["status"]["topology"]["hash"] == "hash-v1"

    def step(self) -> str | None:
        upgrade = self.app["status"].get("upgrade")
        return None if upgrade is None else str(upgrade["step"])


def conditions(result: Plan) -> list[Obj]:
    """The conditions as the API server would store them."""
    return [c.model_dump(mode="json", by_alias=True) for c in result.status.conditions]


def query_service(result: Plan) -> Obj:
    return next(o for o in result.objects if o["metadata"]["name"] == names.query_service("wc"))


def condition(result: Plan, type_: str) -> Obj:
    return next(c for c in conditions(result) if c["type"] == type_)


@pytest.fixture
def driver() -> Driver:
    running = Driver()
    running.settle()
    return running


def run_to_starting(driver: Driver) -> None:
    driver.app["spec"]["topology"] = dict(V2)
    driver.cycle()  # Stopping
    driver.pods = []
    driver.cycle()  # Publishing
    driver.cycle()  # Starting
    assert driver.step() == "Starting"


def replace_pods_one_at_a_time(driver: Driver, reports: dict[str, MemberReport]) -> Plan:
    """Publishing's roll: one pod at a time, highest ordinal first, each only while every
    other pod is there and serves; ``reports`` follow the pods. The last cycle's plan."""
    for index in (2, 1, 0):
        name = f"wc-{index}"
        rolling = driver.cycle(reports=reports)
        assert rolling.delete_pods == [name] and driver.step() == "Publishing"
        driver.pods = [
            pod(i, deleting=True) if i == index else p for i, p in enumerate(driver.pods)
        ]
        del reports[name]
        assert driver.cycle(reports=reports).delete_pods == []  # on its way out
        driver.pods[index] = pod(index, revision="2", config_hash=driver.template_hash)
        latest = driver.cycle(reports=reports)
        assert latest.delete_pods == []  # not serving yet
        reports[name] = layout_report(name, "2", parked=True)
    return latest


def test_an_upgrade_runs_its_steps_in_order_each_written_ahead(driver: Driver) -> None:
    before = driver.membership
    assert before is not None
    active_before = {
        member: {t.partition for t in tasks if t.subtopology == 1}
        for member, tasks in before.assignment.active.items()
    }
    driver.app["spec"]["topology"] = dict(V2)

    # Stopping: processing stops, the pods stay (they serve their copies as standbys).
    stopping = driver.cycle()
    assert stopping.write_ahead and driver.step() == "Stopping"
    assert stateful_set(stopping.objects)["spec"]["replicas"] == 3
    assert "revision: '1'" in driver.manifest or 'revision: "1"' in str(driver.manifest)
    assert stopping.delete_pods == []
    assert driver.membership is not None and not driver.membership.assignment.tasks
    # No pod will be Ready (processing) until Starting ends, yet each serves: the query
    # Service takes every pod while the upgrade runs, the Ready ones again after it.
    assert query_service(stopping)["spec"]["publishNotReadyAddresses"] is True
    assert [e.reason for e in stopping.events] == ["UpgradeStarted"]
    assert condition(stopping, "Upgrading")["reason"] == "Stopping"
    assert condition(stopping, "Progressing")["reason"] == "TopologyUpgrade"
    placement = driver.app["status"]["upgrade"]["placement"]["word-counts"]
    assert {p: holders[0] for p, holders in placement.items()} == {
        str(p): m for m, ps in active_before.items() for p in ps
    }

    # A pod that still reports an active copy has not closed its tasks yet.
    waiting = driver.cycle()
    assert not waiting.write_ahead and driver.step() == "Stopping"

    old = {f"wc-{i}": layout_report(f"wc-{i}", "1", parked=True) for i in range(3)}
    publishing = driver.cycle(reports=old)
    assert publishing.write_ahead and driver.step() == "Publishing"
    assert "wordcount:topology_v2" in str(driver.manifest)
    assert stateful_set(publishing.objects)["spec"]["replicas"] == 3
    assert driver.membership is not None and not driver.membership.assignment.tasks

    reports = dict(old)
    latest = replace_pods_one_at_a_time(driver, reports)
    # The last pod of the old revision replaced: Starting (which waits for every report).
    assert latest.write_ahead and driver.step() == "Starting"
    assert stateful_set(latest.objects)["spec"]["replicas"] == 3

    driver.revision = "2"
    first = driver.cycle(reports=reports)
    assert first.membership is not None
    for member, partitions in active_before.items():
        assert {
            t.partition for t in first.membership.assignment.active[member] if t.subtopology == 2
        } == partitions  # state stays where it was

    done = driver.cycle()
    assert done.write_ahead and driver.step() is None
    status = driver.app["status"]
    assert status["topology"] == {**V2, "hash": "hash-v2"}
    assert status["lastUpgrade"]["outcome"] == "Succeeded"
    assert [s["step"] for s in status["lastUpgrade"]["steps"]] == [
        "Stopping",
        "Publishing",
        "Starting",
    ]
    assert condition(done, "Upgrading")["status"] == "False"
    assert [e.reason for e in done.events] == ["UpgradeSucceeded"]
    assert query_service(done)["spec"]["publishNotReadyAddresses"] is False


def test_the_reset_membership_names_the_pods_there_now_for_query_routing(driver: Driver) -> None:
    """No task for anyone while nothing processes, but every member pod with its query
    address, published again when a pod is replaced (its address changes): a pod names the
    members it knows to a router, which asks them for their copies. With only itself named,
    a router that reached a pod on its way out found no other copy (make bench-queries)."""

    def listed() -> dict[str, str | None]:
        assert driver.membership is not None and not driver.membership.assignment.tasks
        return {m.id: m.address for m in driver.membership.assignment.members}

    driver.app["spec"]["topology"] = dict(V2)
    driver.cycle()  # Stopping
    before = {f"wc-{i}": f"127.0.0.{i + 10}:7070" for i in range(3)}
    assert listed() == before
    parked = {f"wc-{i}": layout_report(f"wc-{i}", "1", parked=True) for i in range(3)}
    driver.cycle(reports=parked)
    assert driver.step() == "Publishing"
    generation = driver.membership.generation if driver.membership else -1
    assert driver.cycle(reports=parked).delete_pods == ["wc-2"]
    assert driver.membership is not None and driver.membership.generation == generation

    driver.pods[2] = pod(2, revision="2", config_hash=driver.template_hash)
    driver.pods[2]["status"]["podIP"] = "127.0.0.42"
    driver.cycle(reports=parked)
    assert listed() == {**before, "wc-2": "127.0.0.42:7070"}
    assert driver.membership.generation == generation + 1


def test_a_recreate_upgrade_stops_every_pod_at_once_and_starts_the_new_ones_together(
    driver: Driver,
) -> None:
    """upgradeStrategy Recreate: the StatefulSet at 0 replicas and every pod deleted at
    Stopping, the target published with no pod running, every pod of it started at once."""
    driver.app["spec"]["topology"] = {**V2, "upgradeStrategy": "Recreate"}

    stopping = driver.cycle()
    assert stopping.write_ahead and driver.step() == "Stopping"
    assert driver.app["status"]["upgrade"]["strategy"] == "Recreate"
    assert stateful_set(stopping.objects)["spec"]["replicas"] == 0
    assert stopping.delete_pods == ["wc-0", "wc-1", "wc-2"]
    assert "Recreate" in stopping.events[0].message
    # Pods that closed their tasks are not enough: Recreate waits until none is left.
    parked = {f"wc-{i}": layout_report(f"wc-{i}", "1", parked=True) for i in range(3)}
    assert driver.cycle(reports=parked).delete_pods == ["wc-0", "wc-1", "wc-2"]
    assert driver.step() == "Stopping"

    driver.pods = []
    publishing = driver.cycle()
    assert publishing.write_ahead and driver.step() == "Publishing"
    assert "wordcount:topology_v2" in str(driver.manifest)
    assert stateful_set(publishing.objects)["spec"]["replicas"] == 0
    assert publishing.delete_pods == []

    starting = driver.cycle()
    assert starting.write_ahead and driver.step() == "Starting"
    assert stateful_set(starting.objects)["spec"]["replicas"] == 3
    driver.start_pods("2")
    driver.cycle()
    done = driver.cycle()
    assert done.write_ahead and driver.step() is None
    last = driver.app["status"]["lastUpgrade"]
    assert last["outcome"] == "Succeeded" and last["strategy"] == "Recreate"
    assert [s["step"] for s in last["steps"]] == ["Stopping", "Publishing", "Starting"]


def test_the_strategy_is_read_once_when_the_upgrade_begins(driver: Driver) -> None:
    """A Rolling upgrade under way stays Rolling when the spec says Recreate (and back): the
    steps it took were those of its strategy, and its rollback takes them again."""
    driver.app["spec"]["topology"] = dict(V2)
    driver.cycle()
    driver.app["spec"]["topology"] = {**V2, "upgradeStrategy": "Recreate"}
    waiting = driver.cycle()
    assert driver.app["status"]["upgrade"]["strategy"] == "Rolling"
    assert stateful_set(waiting.objects)["spec"]["replicas"] == 3
    assert waiting.delete_pods == []


def test_a_recreate_rollback_stops_the_new_pods_at_once(driver: Driver) -> None:
    driver.app["spec"]["topology"] = {**V2, "upgradeStrategy": "Recreate"}
    driver.cycle()
    driver.pods = []
    driver.cycle()
    driver.cycle()
    assert driver.step() == "Starting"
    driver.start_pods("2")
    driver.pods[1]["status"]["containerStatuses"][0]["lastState"] = {
        "terminated": {"exitCode": 1, "reason": "Error", "message": "refused"}
    }
    failing = driver.cycle()
    assert driver.step() == "Stopping" and driver.app["status"]["upgrade"]["rollback"]
    assert stateful_set(failing.objects)["spec"]["replicas"] == 0
    assert failing.delete_pods == ["wc-0", "wc-1", "wc-2"]


def test_without_pods_the_upgrade_goes_through_its_steps_as_well(driver: Driver) -> None:
    """Pods that went away (deleted from outside, a node lost) neither process nor need
    replacing: nothing waits for them."""
    driver.app["spec"]["topology"] = dict(V2)
    driver.cycle()
    driver.pods = []
    driver.cycle()
    assert driver.step() == "Publishing"
    driver.cycle()
    assert driver.step() == "Starting"


def test_a_pod_made_before_publishing_is_replaced_whatever_its_revision_label(
    driver: Driver,
) -> None:
    """A rollback's pods of the revision it returns to that were never replaced still have
    the template of before (the settings changed with the topology, say): only a pod made
    since this Publishing began has the template Publishing applied."""
    driver.app["spec"]["topology"] = dict(V2)
    driver.cycle()  # Stopping
    parked = {f"wc-{i}": layout_report(f"wc-{i}", "2", parked=True) for i in range(3)}
    driver.pods = [pod(i, revision="2") for i in range(3)]
    for made in driver.pods:
        made["metadata"]["creationTimestamp"] = "2026-11-23T09:00:00Z"
    driver.cycle(reports=parked)
    assert driver.step() == "Publishing"
    assert driver.cycle(reports=parked).delete_pods == ["wc-2"]
    for made in driver.pods:
        made["metadata"]["creationTimestamp"] = driver.now
    assert driver.cycle(reports=parked).delete_pods == []
    assert driver.step() == "Starting"


def test_the_same_status_decides_the_same_step_after_an_operator_restart(driver: Driver) -> None:
    driver.app["spec"]["topology"] = dict(V2)
    driver.cycle()
    driver.pods = []
    driver.cycle()
    assert driver.step() == "Publishing"
    started_at = driver.app["status"]["upgrade"]["steps"][0]["startedAt"]
    # Nothing in memory survives a restart: the next cycle sees only status and objects.
    again = driver.cycle()
    assert driver.step() == "Starting"
    assert driver.app["status"]["upgrade"]["steps"][0]["startedAt"] == started_at
    assert "UpgradeStarted" not in [e.reason for e in again.events]


def test_a_new_revision_waits_for_the_upgrade_under_way(driver: Driver) -> None:
    driver.app["spec"]["topology"] = dict(V2)
    driver.cycle()
    driver.app["spec"]["topology"] = {"ref": "wordcount:topology_v2", "revision": "3"}
    result = driver.cycle()
    assert driver.step() == "Stopping"
    assert driver.app["status"]["upgrade"]["to"]["revision"] == "2"
    assert not result.write_ahead


def test_a_pod_refusing_to_start_rolls_back_to_the_revision_that_ran(driver: Driver) -> None:
    run_to_starting(driver)
    driver.start_pods("2")
    refused = "state stores are misplaced: 1_0/word-counts ...; set automatic.state.relocation"
    driver.pods[1]["status"]["containerStatuses"][0]["lastState"] = {
        "terminated": {"exitCode": 1, "reason": "Error", "message": refused}
    }
    failing = driver.cycle()
    upgrade = driver.app["status"]["upgrade"]
    assert failing.write_ahead and upgrade["step"] == "Stopping"
    assert upgrade["to"]["revision"] == "1" and upgrade["from"]["revision"] == "2"
    assert upgrade["rollback"] == {"reason": "PodFailed", "pod": "wc-1", "message": refused}
    degraded = condition(failing, "Degraded")
    assert degraded["status"] == "True" and "wc-1" in degraded["message"]
    assert refused in degraded["message"]
    # Issue 23, item 11: the revision that failed is 2, the one rolled back to is 1 (in the
    # condition, which the swapped record once turned round, and in the event).
    (failed_event,) = [e for e in failing.events if e.reason == "UpgradeFailed"]
    for text in (degraded["message"], failed_event.message):
        assert re.search(r"topology \S+@2 failed .* rolling back to \S+@1$", text), text
    assert condition(failing, "Upgrading")["reason"] == "RollBackStopping"
    assert "UpgradeFailed" in [e.reason for e in failing.events]

    driver.pods = []
    driver.cycle()
    assert "wordcount:topology\n" in str(driver.manifest) or "ref: wordcount:topology" in str(
        driver.manifest
    )
    driver.cycle()
    driver.start_pods("1")
    driver.cycle()
    done = driver.cycle()
    status = driver.app["status"]
    assert driver.step() is None
    assert status["topology"]["revision"] == "1"
    assert status["lastUpgrade"]["outcome"] == "RolledBack"
    assert status["failedTopology"]["revision"] == "2"
    assert condition(done, "Degraded")["reason"] == "UpgradeRolledBack"
    # spec still names revision 2: it is not tried again until spec.topology changes.
    assert driver.cycle().write_ahead is False and driver.step() is None
    driver.app["spec"]["topology"] = {"ref": "wordcount:topology_v2", "revision": "3"}
    driver.cycle()
    assert driver.step() == "Stopping"
    assert driver.app["status"]["failedTopology"] is None


def test_pods_not_ready_by_the_deadline_roll_the_upgrade_back(driver: Driver) -> None:
    driver.app["spec"]["topology"] = {**V2, "upgradeDeadlineSeconds": 30}
    driver.cycle()
    driver.pods = []
    driver.cycle()
    driver.cycle()
    driver.start_pods("2")
    for p in driver.pods:
        p["status"]["conditions"][0]["status"] = "False"
    driver.now = "2026-11-23T10:00:20Z"
    driver.cycle()
    assert driver.app["status"]["upgrade"]["rollback"] is None
    driver.now = "2026-11-23T10:00:31Z"
    driver.cycle()
    rollback = driver.app["status"]["upgrade"]["rollback"]
    assert rollback["reason"] == "DeadlineExceeded" and rollback["pod"] == "wc-0"


def test_a_pod_killed_from_outside_does_not_roll_back(driver: Driver) -> None:
    run_to_starting(driver)
    driver.start_pods("2")
    driver.pods[0]["status"]["containerStatuses"][0]["lastState"] = {
        "terminated": {"exitCode": 137, "reason": "Killed"}
    }
    driver.cycle()
    assert driver.app["status"]["upgrade"]["rollback"] is None


def test_another_describe_hash_for_the_same_revision_is_an_upgrade(driver: Driver) -> None:
    reports = driver.reports()
    reports["wc-2"] = layout_report("wc-2", "2")  # new code in the image, same revision
    result = driver.cycle(reports=reports)
    assert driver.step() == "Stopping"
    assert "TopologyChanged" in result.events[0].message


def test_a_change_of_replicas_is_a_scale_not_an_upgrade(driver: Driver) -> None:
    driver.app["spec"]["replicas"] = 5
    result = driver.cycle()
    assert driver.step() is None
    assert stateful_set(result.objects)["spec"]["replicas"] == 5
    assert condition(result, "Upgrading")["status"] == "False"


def test_the_placement_translates_by_store_name_to_the_new_ordinals() -> None:
    placement = {"counts": {"0": ["a", "b"], "1": ["b", "a"], "2": ["gone", "c"]}}
    translated = translate_placement(placement, {"counts": 2}, {"a", "b", "c"})
    assert translated is not None
    assert translated.active == {
        "a": frozenset({TaskId(2, 0)}),
        "b": frozenset({TaskId(2, 1)}),
        "c": frozenset({TaskId(2, 2)}),
    }
    assert translated.standby["b"] == frozenset({TaskId(2, 0)})
    assert translate_placement(placement, {"other": 1}, {"a"}) is None


def test_a_report_carries_its_store_owners_through_json_and_older_reports_have_none() -> None:
    report = layout_report("wc-0", "2")
    again = MemberReport.from_json(report.to_json())
    assert again == report and again.store_owners == {"word-counts": 2}
    older = report.to_json()
    del older["store_owners"]
    assert MemberReport.from_json(older).store_owners == {}


def test_an_invalid_spec_mid_upgrade_pauses_it_and_publishes_no_membership(
    driver: Driver,
) -> None:
    run_to_starting(driver)
    driver.start_pods("2")
    driver.app["spec"]["replicas"] = -1  # the schema would refuse it; an old CRD did not
    result = driver.cycle()
    assert result.membership is None and result.objects == []
    assert driver.step() == "Starting"
    assert condition(result, "Degraded")["reason"] == "InvalidSpec"


def _generated_names(*, filtered: bool, named: bool) -> tuple[GeneratedName, ...]:
    """Word count's generated names, from the real DSL: a filter before the group_by
    renumbers an unnamed repartition topic."""
    builder = StreamsBuilder()
    words = builder.stream("words", key_serde="string", value_serde="string")
    if filtered:
        words = words.filter(lambda key, value: bool(value))
    topic = "by-word" if named else None
    grouped = words.group_by(lambda key, value: value, repartition_name=topic)
    grouped.count("word-counts")
    return tuple(builder.build().generated_names())


class NamingDriver(Driver):
    """Revision 2 inserts a filter before the counting; ``named``: its topic has a name."""

    def __init__(self, *, named: bool) -> None:
        super().__init__()
        self.named = named

    def reports(self) -> dict[str, MemberReport]:
        names_of = _generated_names(filtered=self.revision == "2", named=self.named)
        return {
            member: dataclasses.replace(report, generated_names=names_of)
            for member, report in super().reports().items()
        }


def test_an_upgrade_whose_generated_names_moved_is_refused_before_any_task_is_assigned() -> None:
    driver = NamingDriver(named=False)
    driver.settle()
    driver.app["spec"]["topology"] = dict(V2)
    driver.cycle()  # Stopping: the running revision's generated names are recorded
    recorded = driver.app["status"]["upgrade"]["generatedNames"]
    assert [n["name"] for n in recorded] == ["KSTREAM-AGGREGATE-STATE-STORE-0000000002-repartition"]
    assert recorded[0]["kind"] == "repartition topic"
    assert recorded[0]["inputs"] == ["words"]
    driver.pods = []
    driver.cycle()  # Publishing
    driver.cycle()  # Starting
    driver.start_pods("2", count=1)  # the first pod of revision 2 reports

    refused = driver.cycle()
    upgrade = driver.app["status"]["upgrade"]
    assert refused.write_ahead and upgrade["step"] == "Stopping"
    assert upgrade["from"]["revision"] == "2" and upgrade["to"]["revision"] == "1"
    assert upgrade["rollback"]["reason"] == "GeneratedNamesMoved"
    # No task of revision 2 was ever assigned: its state was never touched by processing.
    assert driver.membership is not None and not driver.membership.assignment.tasks
    degraded = condition(refused, "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "UpgradeRollingBack"
    for text in (
        "KSTREAM-AGGREGATE-STATE-STORE-0000000002-repartition",
        "KSTREAM-AGGREGATE-STATE-STORE-0000000003-repartition",
        'repartition_name="<name>"',
        "Name them explicitly",
    ):
        assert text in degraded["message"], text

    driver.pods = []
    driver.cycle()
    driver.cycle()
    driver.start_pods("1")
    driver.cycle()
    done = driver.cycle()
    assert driver.step() is None
    assert driver.app["status"]["failedTopology"]["revision"] == "2"
    rolled_back = condition(done, "Degraded")
    assert rolled_back["reason"] == "UpgradeRolledBack"
    assert "GeneratedNamesMoved" in rolled_back["message"]
    assert "KSTREAM-AGGREGATE-STATE-STORE-0000000002-repartition" in rolled_back["message"]


def test_the_same_edit_with_named_resources_upgrades_as_before() -> None:
    driver = NamingDriver(named=True)
    driver.settle()
    run_to_starting(driver)
    assert driver.app["status"]["upgrade"]["generatedNames"] == []
    driver.start_pods("2")
    first = driver.cycle()
    assert first.membership is not None and first.membership.assignment.tasks
    driver.cycle()
    assert driver.step() is None
    assert driver.app["status"]["lastUpgrade"]["outcome"] == "Succeeded"


def test_a_rollback_replaces_the_failing_pod_first_though_it_serves_nothing(
    driver: Driver,
) -> None:
    """The first pod Publishing replaced cannot run the new revision: it never reports a
    copy. The rollback's Publishing must replace it at once (it serves nothing, so deleting
    it takes no answer away); waiting for every pod to serve first would wait on the very
    pod that fails (a `kubectl eddyline upgrade` to a missing function waited 88 s)."""
    driver.app["spec"]["topology"] = dict(V2)
    driver.cycle()  # Stopping
    reports = {f"wc-{i}": layout_report(f"wc-{i}", "1", parked=True) for i in range(3)}
    driver.cycle(reports=reports)
    assert driver.step() == "Publishing"
    assert driver.cycle(reports=reports).delete_pods == ["wc-2"]
    driver.pods[2] = pod(2, revision="2", config_hash=driver.template_hash)
    del reports["wc-2"]
    driver.pods[2]["status"]["containerStatuses"][0]["lastState"] = {
        "terminated": {"exitCode": 1, "reason": "Error", "message": "no such topology"}
    }
    driver.cycle(reports=reports)
    assert driver.app["status"]["upgrade"]["rollback"]["pod"] == "wc-2"
    for _ in range(3):
        plan = driver.cycle(reports=reports)
        if driver.step() == "Publishing" and plan.delete_pods:
            break
    assert driver.app["status"]["upgrade"]["step"] == "Publishing"
    assert plan.delete_pods == ["wc-2"]


def ring_report(member: str, revision: str, partitions: int, standbys: int) -> MemberReport:
    """Pod i holds word-counts partition i as its active copy (parked: served, not
    processed) and the next ``standbys`` partitions' standbys."""
    index = int(member.rsplit("-", 1)[1])
    held = {(index + k) % partitions: StoreCopy("standby", 0) for k in range(standbys + 1)}
    return dataclasses.replace(
        layout_report(member, revision, parked=True), stores={"word-counts": held}
    )


def eight_pods_publishing(standbys: int) -> tuple[Driver, dict[str, MemberReport]]:
    driver = Driver()
    driver.app["spec"]["replicas"] = 8
    driver.cycle()
    driver.start_pods("1", count=8)
    for _ in range(3):
        driver.cycle()
    driver.app["spec"]["topology"] = dict(V2)
    driver.cycle()  # Stopping
    reports = {f"wc-{i}": ring_report(f"wc-{i}", "1", 8, standbys) for i in range(8)}
    driver.cycle(reports=reports)
    assert driver.step() == "Publishing"
    return driver, reports


def test_pods_whose_copies_lie_elsewhere_roll_together_up_to_a_quarter_of_the_replicas() -> None:
    """8 pods, one standby each on the next pod: wc-7 and wc-6 share partition 7's copies,
    so wc-7 goes with wc-5 (every partition keeps a serving copy on the 6 that stay), and
    no more than 2 (a quarter) at once. Once both serve again, the next pair."""
    driver, reports = eight_pods_publishing(standbys=1)
    assert driver.cycle(reports=reports).delete_pods == ["wc-7", "wc-5"]
    for index in (7, 5):
        driver.pods[index] = pod(index, revision="2", config_hash=driver.template_hash)
        del reports[f"wc-{index}"]
    assert driver.cycle(reports=reports).delete_pods == []  # the new pods serve nothing yet
    for index in (7, 5):
        reports[f"wc-{index}"] = ring_report(f"wc-{index}", "2", 8, 1)
    assert driver.cycle(reports=reports).delete_pods == ["wc-6", "wc-4"]


def test_without_standbys_the_pods_roll_one_at_a_time() -> None:
    """No pod's copies are held anywhere else: the first goes alone (its partitions are
    unanswered while it restarts, as with any restart without standbys), never two."""
    driver, reports = eight_pods_publishing(standbys=0)
    assert driver.cycle(reports=reports).delete_pods == ["wc-7"]
