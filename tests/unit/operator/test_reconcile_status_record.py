"""The status read once into the model and dumped in one place."""

from __future__ import annotations

from eddyline_operator.reconcile.plan import Observed, plan
from eddyline_operator.reconcile.status_record import dump_status, read_status, status_differs
from eddyline_runtime.spec import Phase, StreamAppStatus
from tests.support.k8s_objects import body, three_zones


def test_a_stored_status_reads_into_the_model_and_dumps_back_the_same() -> None:
    stored = dump_status(plan(Observed(body=body(), nodes=three_zones())).status)
    status, unreadable = read_status(stored)
    assert unreadable == []
    assert status.phase is Phase.PROGRESSING
    assert dump_status(status) == stored


def test_an_unreadable_field_is_dropped_and_named_the_others_kept() -> None:
    status, unreadable = read_status(
        {"phase": "Running", "replicas": "three", "logNode": "node-0", "kopf": {"x": 1}}
    )
    assert unreadable == ["kopf", "replicas"]
    assert (status.phase, status.replicas, status.log_node) == (Phase.RUNNING, None, "node-0")


def test_no_status_yet_is_an_empty_one() -> None:
    assert read_status(None) == (StreamAppStatus(), [])


def test_the_dump_holds_every_field_so_a_merge_patch_clears_what_is_gone() -> None:
    dumped = dump_status(StreamAppStatus(phase=Phase.RUNNING))
    assert dumped["phase"] == "Running"
    assert "upgrade" in dumped and dumped["upgrade"] is None
    assert set(dumped) == {f.alias or n for n, f in StreamAppStatus.model_fields.items()}


def test_nulls_the_api_server_dropped_are_no_difference() -> None:
    planned = plan(Observed(body=body(), nodes=three_zones())).status
    stored = {k: v for k, v in dump_status(planned).items() if v is not None}
    assert not status_differs(stored, planned)
    assert status_differs({**stored, "phase": "Running"}, planned)


def test_a_cycle_says_which_stored_fields_it_could_not_read() -> None:
    app = body()
    app["status"] = {"upgrade": {"step": "Bogus"}, "logNode": "node-0"}
    result = plan(Observed(body=app, nodes=three_zones()))
    assert result.status.message is not None
    assert "status fields upgrade were unreadable; recomputed" in result.status.message
    assert result.status.upgrade is None


def test_the_empty_autoscaling_status_the_crd_defaults_is_no_difference() -> None:
    """The CRD defaults status.autoscaling to {}: an app without an autoscaler must not
    write its status again at every cycle because the null it wrote came back as {}."""
    planned, _ = read_status({"phase": "Suspended"})
    assert not status_differs({"phase": "Suspended", "autoscaling": {}}, planned)
    assert status_differs({"phase": "Suspended", "autoscaling": {"currentReplicas": 3}}, planned)
