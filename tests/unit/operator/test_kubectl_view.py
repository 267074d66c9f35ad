"""``kubectl eddyline status``'s pure part: the view joined from status, membership and the
pods' reports, and its text for a terminal and for a log."""

from __future__ import annotations

import datetime
import io
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from eddyline_operator.client import ApiError, kubeconfig_client
from eddyline_operator.kubectl.cli import parser
from eddyline_operator.kubectl.render import Style, render_status, size_text
from eddyline_operator.kubectl.status_view import app_view
from eddyline_operator.reconcile.autoscale import PodSample
from eddyline_runtime.assignor import Assignment, Member
from eddyline_runtime.membership import MemberReport, Membership, StoreCopy, StoreRole
from eddyline_runtime.partitions import TaskId

NOW = datetime.datetime(2026, 11, 27, 12, 0, 0, tzinfo=datetime.UTC)
STORE = "word-counts"


def _app() -> dict[str, Any]:
    return {
        "metadata": {
            "name": "wc",
            "namespace": "team",
            "generation": 3,
            "annotations": {"eddyline.dev/pause-reconciliation": "true"},
        },
        "spec": {"topology": {"ref": "wordcount:topology", "revision": "2"}},
        "status": {
            "observedGeneration": 3,
            "phase": "Running",
            "replicas": 2,
            "readyReplicas": 2,
            "revision": "2",
            "topology": {"ref": "wordcount:topology", "revision": "2", "hash": "abc123"},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "AllPodsReady",
                    "message": "2 of 2 pods ready",
                    "lastTransitionTime": "2026-11-27T11:58:00Z",
                }
            ],
            "lastUpgrade": {
                "from": {"ref": "wordcount:topology", "revision": "1"},
                "to": {"ref": "wordcount:topology", "revision": "2", "hash": "abc123"},
                "outcome": "Succeeded",
                "steps": [
                    {"step": "Stopping", "startedAt": "2026-11-27T11:50:00Z"},
                    {"step": "Publishing", "startedAt": "2026-11-27T11:50:04Z"},
                    {"step": "Starting", "startedAt": "2026-11-27T11:50:05Z"},
                ],
                "finishedAt": "2026-11-27T11:50:20Z",
            },
            "restoreJobs": [
                {
                    "name": "wc-restore-1",
                    "store": STORE,
                    "partitions": [0],
                    "state": "Succeeded",
                    "startedAt": "2026-11-27T11:40:00Z",
                    "finishedAt": "2026-11-27T11:41:00Z",
                }
            ],
            "autoscaling": {
                "currentReplicas": 2,
                "desiredReplicas": 2,
                "lastDecision": {
                    "time": "2026-11-27T11:30:00Z",
                    "fromReplicas": 1,
                    "toReplicas": 2,
                    "reason": "input lag 5000 records above 1000",
                },
            },
        },
    }


def _pod(name: str, node: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"nodeName": node},
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def _view_inputs() -> tuple[list[dict[str, Any]], Membership, dict[str, MemberReport]]:
    t0, t1 = TaskId(1, 0), TaskId(1, 1)
    assignment = Assignment(
        active={"wc-0": frozenset({t0}), "wc-1": frozenset({t1})},
        standby={"wc-0": frozenset({t1}), "wc-1": frozenset({t0})},
        members=(
            Member("wc-0", zone="zone-a", address="10.0.0.1:7070"),
            Member("wc-1", zone="zone-b", address="10.0.0.2:7070"),
        ),
    )
    report = MemberReport(
        member="wc-0",
        topology_hash="abc123",
        tasks=frozenset({t0}),
        stateful=frozenset({t0}),
        stores={STORE: {0: StoreCopy(StoreRole.RESTORING, 40), 1: StoreCopy(StoreRole.STANDBY, 7)}},
        ready=True,
        store_owners={STORE: 1},
    )
    pods = [_pod("wc-1", "node-b"), _pod("wc-0", "node-a")]
    return pods, Membership(5, assignment), {"wc-0": report}


def test_each_task_shows_its_active_and_standby_copies_with_zone_role_and_lag() -> None:
    pods, membership, reports = _view_inputs()
    view = app_view(_app(), pods, membership, reports, {"wc-1": "no layout (503)"})
    tasks = {row.task: row for row in view.tasks}
    assert tasks["1_0"].active is not None
    # What the pod says it does with the copy (restoring) beats what it was assigned.
    assert (tasks["1_0"].active.pod, tasks["1_0"].active.zone) == ("wc-0", "zone-a")
    assert (tasks["1_0"].active.role, tasks["1_0"].active.lag) == ("restoring", 40)
    (standby,) = tasks["1_1"].standbys
    assert (standby.pod, standby.zone, standby.role, standby.lag) == (
        "wc-0",
        "zone-a",
        "standby",
        7,
    )
    # wc-1 did not answer: its copies have no lag, and its pod row says why.
    assert tasks["1_1"].active is not None and tasks["1_1"].active.lag is None
    assert [p.name for p in view.pods] == ["wc-0", "wc-1"]
    assert view.pods[1].layout_error == "no layout (503)"
    assert view.paused and view.membership_generation == 5


def test_a_pods_metrics_give_its_busy_share_rate_and_input_lag() -> None:
    pods, membership, reports = _view_inputs()
    sample = PodSample(0.0, 0.25, 120.0, {"text-lines/0": 30.0, "text-lines/1": 12.0})
    view = app_view(_app(), pods, membership, reports, {}, samples={"wc-0": sample})
    assert (view.pods[0].busy, view.pods[0].rate, view.pods[0].input_lag) == (0.25, 120.0, 42)
    assert view.pods[1].input_lag is None
    text = render_status(view, Style(colour=False, width=None), NOW)
    assert "25%   120    42" in text, text


def test_the_json_form_holds_the_status_as_the_api_does_and_every_task() -> None:
    pods, membership, reports = _view_inputs()
    document = json.loads(json.dumps(app_view(_app(), pods, membership, reports, {}).to_json()))
    assert document["status"]["lastUpgrade"]["outcome"] == "Succeeded"
    assert [t["task"] for t in document["tasks"]] == ["1_0", "1_1"]
    assert document["tasks"][0]["standbys"][0]["pod"] == "wc-1"
    assert document["pods"][0]["layoutError"] is None and "layout_error" not in document["pods"][0]


def test_a_kubeconfig_gives_the_contexts_namespace_and_a_missing_context_is_named(
    tmp_path: Path,
) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "dev", "context": {"cluster": "c", "user": "u"}},
                    {"name": "prod", "context": {"cluster": "c", "user": "u", "namespace": "team"}},
                ],
                "current-context": "dev",
            }
        ),
        encoding="utf-8",
    )
    assert kubeconfig_client(str(config))[1] == "default"
    assert kubeconfig_client(str(config), "prod")[1] == "team"
    with pytest.raises(
        ApiError, match='no context "stage" in the kubeconfig \\(it has: dev, prod\\)'
    ):
        kubeconfig_client(str(config), "stage")


def test_status_text_for_a_log_is_plain_whole_lines_with_every_section() -> None:
    pods, membership, reports = _view_inputs()
    view = app_view(_app(), pods, membership, reports, {})
    text = render_status(view, Style(colour=False, width=None), NOW)
    assert "\033[" not in text
    for expected in (
        "wc in team: Running  PAUSED",
        "topology wordcount:topology@2 (describe hash abc123)",
        "AllPodsReady",
        "wc-0 zone-a restoring lag 40",
        "Last upgrade: wordcount:topology@1 -> wordcount:topology@2, Succeeded 9m ago",
        "Stopping             4 s",
        "wc-restore-1",
        "last decision 30m ago: 1 -> 2: input lag 5000 records above 1000",
    ):
        assert expected in text, (expected, text)


def test_status_text_on_a_terminal_is_coloured_and_cut_to_its_width() -> None:
    pods, membership, reports = _view_inputs()
    view = app_view(_app(), pods, membership, reports, {})
    text = render_status(view, Style(colour=True, width=50), NOW)
    assert "\033[32mRunning\033[0m" in text
    plain = [line.replace("\033[0m", "") for line in text.splitlines()]
    for line in plain:
        visible = line
        for code in ("\033[32m", "\033[31m", "\033[33m", "\033[1m"):
            visible = visible.replace(code, "")
        assert len(visible) <= 50, visible


def test_colour_follows_the_stream_and_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert Style.for_stream(Terminal()).colour
    assert not Style.for_stream(io.StringIO()).colour
    assert Style.for_stream(io.StringIO()).width is None
    monkeypatch.setenv("NO_COLOR", "1")
    assert not Style.for_stream(Terminal()).colour


def test_the_plugin_takes_kubectls_namespace_context_and_kubeconfig_flags() -> None:
    args = parser().parse_args(
        [
            "where",
            "wc",
            "w01",
            "-n",
            "team",
            "--context",
            "prod",
            "--kubeconfig",
            "/k",
            "-o",
            "json",
        ]
    )
    assert (args.namespace, args.context, args.kubeconfig, args.output) == (
        "team",
        "prod",
        "/k",
        "json",
    )


def test_each_copy_shows_its_stores_bytes_on_disk_and_each_pod_its_total() -> None:
    pods, membership, reports = _view_inputs()
    sized = MemberReport(
        **{
            **reports["wc-0"].__dict__,
            "stores": {
                STORE: {
                    0: StoreCopy(StoreRole.ACTIVE, 0, 3 * 1024 * 1024),
                    1: StoreCopy(StoreRole.STANDBY, 7, 2048),
                },
                # A second store of the same sub-topology: a copy's size is its stores' sum.
                "word-totals": {0: StoreCopy(StoreRole.ACTIVE, 0, 1024 * 1024)},
            },
            "store_owners": {STORE: 1, "word-totals": 1},
        }
    )
    view = app_view(_app(), pods, membership, {"wc-0": sized}, {"wc-1": "no layout (503)"})
    tasks = {row.task: row for row in view.tasks}
    assert tasks["1_0"].active is not None and tasks["1_0"].active.disk_bytes == 4 * 1024 * 1024
    assert tasks["1_1"].standbys[0].disk_bytes == 2048
    # wc-1 did not answer: no size for its copies or its pod, not a zero.
    assert tasks["1_1"].active is not None and tasks["1_1"].active.disk_bytes is None
    assert [p.store_bytes for p in view.pods] == [4 * 1024 * 1024 + 2048, None]

    text = render_status(view, Style(colour=False, width=None), NOW)
    assert "Tasks (copies: pod, zone, lag in records, size on disk)" in text
    assert "wc-0 zone-a lag 0 4.0 MiB" in text and "wc-0 zone-a lag 7 2.0 KiB" in text, text
    (pods_header,) = [line for line in text.splitlines() if line.startswith("  POD ")]
    wc0 = next(line for line in text.splitlines() if line.startswith("  wc-0 "))
    assert wc0[pods_header.index("ON DISK") :].startswith("4.0 MiB"), (pods_header, wc0)

    document = json.loads(json.dumps(view.to_json()))
    assert document["tasks"][0]["active"]["diskBytes"] == 4 * 1024 * 1024
    assert document["pods"][0]["storeBytes"] == 4 * 1024 * 1024 + 2048
    assert document["pods"][1]["storeBytes"] is None


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (None, "-"),
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (int(12.3 * 1024 * 1024), "12.3 MiB"),
        (5 * 1024**3, "5.0 GiB"),
        (3 * 1024**4, "3.0 TiB"),
    ],
)
def test_sizes_read_in_powers_of_1024_as_volumes_are_sized(size: int | None, text: str) -> None:
    assert size_text(size) == text


def test_status_shows_the_running_describe_hash_and_how_to_draw_it() -> None:
    pods, membership, reports = _view_inputs()
    view = app_view(_app(), pods, membership, reports, {})
    text = render_status(view, Style(colour=False, width=None), NOW)
    lines = text.splitlines()
    assert lines[1] == "  revision 2, topology wordcount:topology@2 (describe hash abc123)"
    assert lines[2] == (
        "  draw it: eddyline describe MANIFEST --format svg > wc.svg (MANIFEST: wc's "
        "StreamApp YAML; --hash on it prints abc123 if it is this topology)"
    )
    document = json.loads(json.dumps(view.to_json()))
    assert document["topologyHash"] == "abc123"
    assert document["drawCommand"] == "eddyline describe MANIFEST --format svg > wc.svg"


def test_the_running_hash_is_the_pods_when_they_agree_and_the_operators_record_otherwise() -> None:
    pods, membership, reports = _view_inputs()
    app = _app()
    # The pods run a topology the operator has not recorded yet (an upgrade finishing).
    app["status"]["topology"]["hash"] = "recorded"
    assert app_view(app, pods, membership, reports, {}).topology_hash == "abc123"
    # Pods of two revisions mid-upgrade: what the operator recorded.
    other = replace(reports["wc-0"], member="wc-1", topology_hash="def456")
    both = {**reports, "wc-1": other}
    assert app_view(app, pods, membership, both, {}).topology_hash == "recorded"
    # Nobody knows yet: the hint says so instead of a hash.
    del app["status"]["topology"]
    view = app_view(app, pods, membership, {}, {})
    assert view.topology_hash is None
    text = render_status(view, Style(colour=False, width=None), NOW)
    assert "draw it: eddyline describe MANIFEST --format svg > wc.svg (no pod has reported" in text
    assert json.loads(json.dumps(view.to_json()))["topologyHash"] is None
