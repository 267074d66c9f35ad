"""Issue 23, item 9: a crash loop's condition says why, from the container's termination
message (the runtime writes its error there; FallbackToLogsOnError adds the log's end)."""

from __future__ import annotations

from typing import Any

from eddyline_operator.reconcile.objects import pod_template
from eddyline_operator.reconcile.plan import Observed, parse_app, plan
from eddyline_operator.reconcile.status import CRASH_MESSAGE_CHARS, crash_message
from tests.support.k8s_objects import body, pod, three_zones

Obj = dict[str, Any]
# What the runtime writes to its termination message file when an input topic is missing.
MISSING_TOPIC = (
    "input topic(s) text-lines do not exist in the log sqlite:////var/lib/eddyline/log/log.db; "
    "create them first: eddyline log --log sqlite:////var/lib/eddyline/log/log.db "
    "create-topic NAME --partitions N"
)


def crashing(ordinal: int, message: str | None, exit_code: int = 1) -> Obj:
    found = pod(ordinal, waiting="CrashLoopBackOff")
    terminated: Obj = {"exitCode": exit_code, "reason": "Error"}
    if message is not None:
        terminated["message"] = message
    found["status"]["containerStatuses"][0]["lastState"] = {"terminated": terminated}
    return found


def degraded(pods: list[Obj]) -> Obj:
    result = plan(Observed(body=body(), pods=pods, nodes=three_zones(), now="2026-11-23T10:00:00Z"))
    conditions = [c.model_dump(mode="json", by_alias=True) for c in result.status.conditions]
    found: Obj = next(c for c in conditions if c["type"] == "Degraded")
    found["events"] = [(e.type, e.reason, e.message) for e in result.events]
    return found


def test_the_termination_message_is_the_reason_in_the_condition_and_the_event() -> None:
    condition = degraded([crashing(0, MISSING_TOPIC), crashing(1, MISSING_TOPIC), pod(2)])
    assert condition["status"] == "True"
    assert condition["reason"] == "CrashLoopBackOff"
    assert condition["message"] == (
        f"containers keep crashing in wc-0, wc-1; wc-0, wc-1: exit code 1: {MISSING_TOPIC}"
    )
    assert ("Warning", "CrashLoopBackOff", condition["message"]) in condition["events"]


def test_pods_crashing_for_different_reasons_are_told_apart_and_long_logs_cut() -> None:
    log_tail = "line\n" * 500 + "ValueError: bad config"
    condition = degraded([crashing(0, MISSING_TOPIC), crashing(1, log_tail, exit_code=2)])
    message = condition["message"]
    assert f"wc-0: exit code 1: {MISSING_TOPIC}" in message
    assert "wc-1: exit code 2: ..." in message
    assert message.endswith("ValueError: bad config")
    assert len(message) < 2 * CRASH_MESSAGE_CHARS + 200


def test_without_a_termination_message_the_condition_points_at_the_logs() -> None:
    condition = degraded([crashing(0, None)])
    assert condition["message"] == ("containers keep crashing in wc-0; wc-0: exit code 1")
    looping = pod(1, waiting="CrashLoopBackOff")
    assert crash_message(looping) is None
    assert degraded([looping])["message"] == "containers keep crashing in wc-1; see their logs"


def test_the_pods_fall_back_to_their_logs_when_the_runtime_wrote_no_message() -> None:
    app = parse_app(body())
    container = pod_template(app, default_image="x", log_node=None)["spec"]["containers"][0]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


def oom_killed(ordinal: int, *, finished_at: str, restarts: int, waiting: str | None = None) -> Obj:
    """A pod whose container the kernel killed at its memory limit, as the kubelet says it."""
    found = pod(ordinal, waiting=waiting)
    found["spec"]["containers"] = [
        {"name": "eddyline", "resources": {"limits": {"memory": "64Mi"}}}
    ]
    status = found["status"]["containerStatuses"][0]
    status["restartCount"] = restarts
    status["lastState"] = {
        "terminated": {"exitCode": 137, "reason": "OOMKilled", "finishedAt": finished_at}
    }
    return found


def test_an_oom_kill_is_said_in_status_and_a_warning_event_once_per_kill() -> None:
    """A pod killed at its memory limit usually restarts and runs on: status.message and a
    Warning event OOMKilled say so (the real kubelet's report, tests/e2e/test_realnode_kafka.py),
    once per kill: the same kill in the previous status posts no second event."""
    app = body()
    pods = [oom_killed(0, finished_at="2026-11-23T09:59:00Z", restarts=1), pod(1), pod(2)]
    result = plan(Observed(body=app, pods=pods, nodes=three_zones(), now="2026-11-23T10:00:00Z"))
    note = (
        "pod wc-0: OOMKilled at 2026-11-23T09:59:00Z, the kernel killed it at limits.memory "
        "64Mi (1 restarts); raise resources.limits.memory (RocksDB takes "
        "rocksdb.memory.limit.share of it, the process the rest)"
    )
    assert result.status.message is not None and note in result.status.message
    assert [(e.type, e.message) for e in result.events if e.reason == "OOMKilled"] == [
        ("Warning", note)
    ]
    app["status"] = {"message": result.status.message}
    again = plan(Observed(body=app, pods=pods, nodes=three_zones(), now="2026-11-23T10:00:05Z"))
    assert not [e for e in again.events if e.reason == "OOMKilled"]
    pods[0] = oom_killed(0, finished_at="2026-11-23T10:01:00Z", restarts=2)
    later = plan(Observed(body=app, pods=pods, nodes=three_zones(), now="2026-11-23T10:01:05Z"))
    assert [e.message for e in later.events if e.reason == "OOMKilled"] == [
        note.replace("09:59:00Z", "10:01:00Z").replace("1 restarts", "2 restarts")
    ]


def test_a_crash_loop_of_oom_kills_names_oomkilled_in_degraded() -> None:
    looping = oom_killed(
        0, finished_at="2026-11-23T09:59:00Z", restarts=3, waiting="CrashLoopBackOff"
    )
    condition = degraded([looping, pod(1), pod(2)])
    assert condition["reason"] == "CrashLoopBackOff"
    assert (
        condition["message"] == "containers keep crashing in wc-0; wc-0: exit code 137 (OOMKilled)"
    )
    assert crash_message(crashing(1, None, exit_code=137)) == "exit code 137"


def test_a_record_that_failed_under_log_and_fail_is_named_in_degraded_and_its_event() -> None:
    """Issue 33: the default handler (log-and-fail) stops the pod; the condition and the
    Warning event name the record (topic, partition, offset, exception), as the runtime's
    one error line (its termination message) does, even with a long exception message."""
    from eddyline_runtime.config import ExceptionHandlerKind
    from eddyline_runtime.engine.instance import StreamsFailedError
    from eddyline_runtime.engine.record_failures import TaskProcessingError

    failure = TaskProcessingError(
        "1_3",
        "orders",
        3,
        4711,
        ValueError("invalid literal for int() with base 10: " + "'x' " * 200),
        kind=ExceptionHandlerKind.PROCESSING,
        node="KSTREAM-MAPVALUES-0000000001",
    )
    message = str(StreamsFailedError(f"wc-0-StreamThread-1 failed: {failure}"))
    condition = degraded([crashing(0, message), pod(1), pod(2)])
    assert condition["reason"] == "RecordFailed"
    assert "failed processing orders-3 at offset 4711" in condition["message"]
    assert "ValueError: invalid literal" in condition["message"]
    assert ("Warning", "RecordFailed", condition["message"]) in condition["events"]


def test_a_record_failure_gives_degraded_its_own_reason_beside_other_crashes() -> None:
    """Issue 33: RecordFailed, not only the crash loop, when a crashing pod's termination
    message is the runtime's line for a failed record (the fix is the record or the
    handler); the other pods' reasons stay in the message. A crash that is not a record's
    keeps CrashLoopBackOff, even when its text mentions offsets."""
    from eddyline_runtime.engine.record_failures import TaskProcessingError

    failure = str(TaskProcessingError("0_1", "orders", 1, 7, KeyError("price")))
    condition = degraded([crashing(0, MISSING_TOPIC), crashing(1, f"error: {failure}")])
    assert condition["reason"] == "RecordFailed"
    assert f"wc-0: exit code 1: {MISSING_TOPIC}" in condition["message"]
    assert (
        "wc-1: exit code 1: error: task 0_1 failed processing orders-1 at offset 7"
        in (condition["message"])
    )
    assert [e[1] for e in condition["events"] if e[0] == "Warning"] == ["RecordFailed"]
    offsets = "task 0_1 failed: committed offset 7 of orders-1 is ahead of the log"
    assert degraded([crashing(0, offsets)])["reason"] == "CrashLoopBackOff"
