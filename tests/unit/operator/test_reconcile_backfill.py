"""A topology upgrade with a backfill (spec.topology.backfill), cycle by cycle, without a
server: the Backfilling step between Stopping and Publishing, the Job it launches, its
verdict in status and the ``Backfilling`` condition, the rollback when the Job fails, and
the field's validation by the CRD and the model (docs/backfill.md, "The operator's side")."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from eddyline_operator.reconcile import backfill_job, names
from eddyline_operator.reconcile.plan import Observed, Plan, plan
from eddyline_operator.reconcile.status_record import dump_status
from eddyline_runtime.membership import MemberReport
from eddyline_runtime.spec import BackfillState, BackfillVerdict
from tests.support.k8s_objects import stateful_set
from tests.unit.operator.test_crd_refusals import crd_errors, document, model_error, schema
from tests.unit.operator.test_reconcile_upgrade import V2, Driver, condition, layout_report

Obj = dict[str, Any]
RESTORE = {"when": "WhenLagAbove", "lagAbove": 1_000_000, "master": "local[2]"}
BACKFILL = {"stores": ["word-totals"]}


class BackfillDriver(Driver):
    """The upgrade driver, with the backfill Jobs the cluster holds."""

    def __init__(self) -> None:
        super().__init__()
        self.jobs: list[Obj] = []
        self.job_pods: list[Obj] = []
        self.created: list[Obj] = []

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
                backfill_jobs=self.jobs,
                backfill_job_pods=self.job_pods,
            )
        )
        self.app["status"] = {**(self.app.get("status") or {}), **dump_status(result.status)}
        if result.membership is not None:
            self.membership = result.membership
        config = next(o for o in result.objects if o["metadata"]["name"] == "wc-config")
        self.manifest = config["data"][names.MANIFEST_KEY]
        template = stateful_set(result.objects)["spec"]["template"]
        self.template_hash = template["metadata"]["annotations"][names.ANNOTATION_CONFIG_HASH]
        self.created.extend(j for j in result.create_jobs if _component(j) == "backfill")
        return result

    def parked(self) -> dict[str, MemberReport]:
        """Every pod given nothing: its copies open as standbys (Stopping is over)."""
        return {
            p["metadata"]["name"]: layout_report(p["metadata"]["name"], self.revision, parked=True)
            for p in self.pods
        }

    def job_ends(self, verdict: BackfillVerdict | None, *, failed: bool = False) -> None:
        """The Job the operator created, finished, with ``verdict`` as its pod's message."""
        job = copy.deepcopy(self.created[-1])
        kind = "Failed" if failed else "Complete"
        job["status"] = {"conditions": [{"type": kind, "status": "True"}]}
        self.jobs = [job]
        labels = job["spec"]["template"]["metadata"]["labels"]
        terminated: Obj = {"exitCode": 1 if failed else 0}
        if verdict is not None:
            terminated["message"] = verdict.to_text()
        self.job_pods = [
            {
                "metadata": {"name": f"{job['metadata']['name']}-x", "labels": labels},
                "status": {"containerStatuses": [{"state": {"terminated": terminated}}]},
            }
        ]


def _component(job: Obj) -> str:
    return str(job["metadata"]["labels"].get("app.kubernetes.io/component"))


@pytest.fixture
def driver() -> BackfillDriver:
    running = BackfillDriver()
    running.app["spec"]["restore"] = dict(RESTORE)
    running.settle()
    return running


def to_backfilling(driver: BackfillDriver) -> Plan:
    driver.app["spec"]["topology"] = {**V2, "backfill": BACKFILL}
    stopping = driver.cycle()
    assert driver.step() == "Stopping" and stopping.write_ahead
    assert not driver.created, "no Job while a pod may still process"
    record = driver.app["status"]["upgrade"]["backfill"]
    assert record["state"] == "Pending" and record["stores"] == ["word-totals"]
    backfilling = driver.cycle(reports=driver.parked())
    assert driver.step() == "Backfilling" and backfilling.write_ahead
    return backfilling


def test_a_backfill_runs_its_job_between_stopping_and_publishing(driver: BackfillDriver) -> None:
    backfilling = to_backfilling(driver)
    (job,) = driver.created
    record = driver.app["status"]["upgrade"]["backfill"]
    assert job["metadata"]["name"] == record["job"]
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["backfill", "job"]
    assert args[args.index("--topology") + 1] == V2["ref"]  # the new revision's code
    assert args[args.index("--store") + 1] == "word-totals"
    assert args[args.index("--build-id") + 1] == record["buildId"]
    assert args[args.index("--master") + 1] == "local[2]"  # spec.restore's Spark settings
    assert "--result-file" in args
    assert job["spec"]["backoffLimit"] == 0
    assert "wordcount:topology\n" in str(driver.manifest)  # nothing of v2 is published yet
    assert not backfilling.delete_pods
    assert condition(backfilling, "Backfilling")["status"] == "True"
    assert "BackfillStarted" not in [e.reason for e in backfilling.events]
    assert "UpgradeBackfilling" in [e.reason for e in backfilling.events]

    # The Job runs: seen, not created again; the condition says so.
    driver.jobs = [copy.deepcopy(job)]
    running = driver.cycle(reports=driver.parked())
    assert len(driver.created) == 1 and driver.step() == "Backfilling"
    assert condition(running, "Backfilling")["reason"] == "BackfillRunning"

    ends = {"events:0": 120, "events:1": 95}
    driver.job_ends(
        BackfillVerdict(
            state=BackfillState.SUCCEEDED,
            message="built word-totals from 215 records",
            buildId=record["buildId"],
            records=215,
            endOffsets=ends,
        )
    )
    published = driver.cycle(reports=driver.parked())
    assert driver.step() == "Publishing" and published.write_ahead
    done = driver.app["status"]["upgrade"]["backfill"]
    assert done["state"] == "Succeeded" and done["records"] == 215 and done["endOffsets"] == ends
    made = condition(published, "Backfilling")
    assert made["status"] == "False" and made["reason"] == "BackfillSucceeded"
    assert "events:0@120" in made["message"]
    assert "BackfillSucceeded" in [e.reason for e in published.events]
    assert "wordcount:topology_v2" in str(driver.manifest)

    driver.pods = []
    driver.cycle()
    driver.start_pods("2")
    for _ in range(3):
        finished = driver.cycle()
    assert driver.step() is None
    last = driver.app["status"]["lastUpgrade"]
    assert last["outcome"] == "Succeeded" and last["backfill"]["state"] == "Succeeded"
    assert [s["step"] for s in last["steps"]] == [
        "Stopping",
        "Backfilling",
        "Publishing",
        "Starting",
    ]
    assert condition(finished, "Backfilling")["reason"] == "BackfillSucceeded"


def test_a_restarted_operator_names_the_same_job(driver: BackfillDriver) -> None:
    """The Job's name and build are in status from Stopping on: an operator that starts again
    at Backfilling (its create lost, or done) creates the same Job, never a second one."""
    to_backfilling(driver)
    first = driver.created[-1]["metadata"]["name"]
    driver.now = "2026-11-23T10:05:00Z"  # a later cycle, as after a restart
    driver.cycle(reports=driver.parked())
    assert [j["metadata"]["name"] for j in driver.created] == [first, first]
    assert driver.app["status"]["upgrade"]["backfill"]["job"] == first


@pytest.mark.parametrize("verdict", [True, False], ids=["failed verdict", "pod killed"])
def test_a_failed_backfill_rolls_back_without_replacing_a_pod(
    driver: BackfillDriver, verdict: bool
) -> None:
    to_backfilling(driver)
    names_before = [p["metadata"]["name"] for p in driver.pods]
    said = BackfillVerdict(
        state=BackfillState.FAILED, message="BackfillError: no store 'word-totals'"
    )
    driver.job_ends(said if verdict else None, failed=True)
    failing = driver.cycle(reports=driver.parked())
    upgrade = driver.app["status"]["upgrade"]
    assert failing.write_ahead and upgrade["step"] == "Starting"
    assert upgrade["rollback"]["reason"] == "BackfillFailed"
    assert upgrade["to"]["revision"] == "1"
    assert upgrade["backfill"]["state"] == "Failed"
    if verdict:
        assert "no store 'word-totals'" in upgrade["rollback"]["message"]
    else:
        assert "no verdict (pod killed?)" in upgrade["rollback"]["message"]
    made = condition(failing, "Backfilling")
    assert made["status"] == "False" and made["reason"] == "BackfillFailed"
    assert condition(failing, "Upgrading")["reason"] == "RollBackStarting"
    assert {"BackfillFailed", "UpgradeFailed"} <= {e.reason for e in failing.events}
    assert "wordcount:topology\n" in str(driver.manifest)  # v2 was never published

    # The old revision's pods get their tasks back where they were: none is replaced.
    for _ in range(3):
        result = driver.cycle()
        assert not result.delete_pods
    assert [p["metadata"]["name"] for p in driver.pods] == names_before
    status = driver.app["status"]
    assert driver.step() is None
    assert status["lastUpgrade"]["outcome"] == "RolledBack"
    assert status["failedTopology"]["revision"] == "2"
    assert status["topology"]["revision"] == "1"
    assert condition(result, "Degraded")["reason"] == "UpgradeRolledBack"


def test_a_backfill_of_a_store_that_runs_already_is_refused_before_anything_stops(
    driver: BackfillDriver,
) -> None:
    driver.app["spec"]["topology"] = {**V2, "backfill": {"stores": ["word-counts"]}}
    refused = driver.cycle()
    assert driver.step() is None and not refused.write_ahead and not driver.created
    degraded = condition(refused, "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "BackfillStoreRuns"
    assert "'word-counts'" in degraded["message"] and "another name" in degraded["message"]


def test_a_backfill_from_a_timestamp_passes_it_to_its_job(driver: BackfillDriver) -> None:
    backfill = {**BACKFILL, "from": "Timestamp", "fromTimestamp": "2026-11-01T00:00:00Z"}
    driver.app["spec"]["topology"] = {**V2, "backfill": backfill}
    driver.cycle()
    record = driver.app["status"]["upgrade"]["backfill"]
    assert record["from"] == "Timestamp"
    assert record["fromTimestamp"] == "2026-11-01T00:00:00Z"
    driver.cycle(reports=driver.parked())
    (job,) = driver.created
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--from-timestamp") + 1] == "2026-11-01T00:00:00+00:00"


def test_a_backfill_from_the_earliest_offset_passes_no_timestamp(driver: BackfillDriver) -> None:
    to_backfilling(driver)
    (job,) = driver.created
    assert "--from-timestamp" not in job["spec"]["template"]["spec"]["containers"][0]["args"]


def test_the_job_name_fits_a_label_with_the_longest_name_restores_allow() -> None:
    name = backfill_job.job_name("a" * 44, "m:f@2", ["s"], "2026-11-23T10:00:00Z")
    assert len(name) == 63
    assert backfill_job.build_id(name, "2026-11-23T10:00:00Z").startswith("20261123T100000Z-")


@pytest.mark.parametrize(
    ("backfill", "field", "words"),
    [
        ({"stores": ["a"], "from": "Yesterday"}, "spec.topology.backfill.from", "EarliestRetained"),
        ({"stores": []}, "spec.topology.backfill.stores", "at least 1"),
    ],
)
def test_an_invalid_backfill_is_refused_naming_the_field_and_the_accepted_values(
    backfill: Obj, field: str, words: str
) -> None:
    obj = document(topology={"ref": "m:f", "backfill": backfill}, restore={"when": "Always"})
    errors = crd_errors(obj)
    assert any(field.removeprefix("spec.") in e or words in e for e in errors), errors
    refused = model_error(obj)
    assert refused.field == field, refused
    assert words in str(refused), refused


@pytest.mark.parametrize(
    ("backfill", "words"),
    [
        ({"stores": ["a"], "from": "Timestamp"}, "from: Timestamp needs fromTimestamp"),
        (
            {"stores": ["a"], "fromTimestamp": "2026-11-01T00:00:00Z"},
            "fromTimestamp is read only with from: Timestamp",
        ),
    ],
)
def test_a_timestamp_and_its_from_go_together_in_both(backfill: Obj, words: str) -> None:
    obj = document(topology={"ref": "m:f", "backfill": backfill}, restore={"when": "Always"})
    assert any(words in e for e in crd_errors(obj)), crd_errors(obj)
    refused = model_error(obj)
    assert refused.field == "spec.topology.backfill" and words in str(refused), refused


def test_a_timestamp_without_a_zone_is_refused_by_the_model() -> None:
    backfill = {"stores": ["a"], "from": "Timestamp", "fromTimestamp": "2026-11-01T00:00:00"}
    obj = document(topology={"ref": "m:f", "backfill": backfill}, restore={"when": "Always"})
    refused = model_error(obj)
    assert refused.field == "spec.topology.backfill.fromTimestamp", refused
    assert "timezone" in str(refused), refused


def test_stores_named_twice_are_refused_by_both() -> None:
    obj = document(
        topology={"ref": "m:f", "backfill": {"stores": ["a", "a"]}}, restore={"when": "Always"}
    )
    refused = model_error(obj)
    assert refused.field == "spec.topology.backfill.stores" and "'a' more than once" in str(refused)
    # The API server refuses a duplicate in a set-typed list itself ("Duplicate value"); the
    # in-process admission does not model list types, so the schema is checked instead.
    topology = schema()["properties"]["spec"]["properties"]["topology"]
    stores = topology["properties"]["backfill"]["properties"]["stores"]
    assert stores["x-kubernetes-list-type"] == "set"


def test_a_backfill_without_the_restore_claim_is_refused_by_both() -> None:
    obj = document(topology={"ref": "m:f", "backfill": {"stores": ["a"]}})
    assert any("spec.restore.when Always or WhenLagAbove" in e for e in crd_errors(obj))
    assert "spec.restore.when Always or WhenLagAbove" in str(model_error(obj))
