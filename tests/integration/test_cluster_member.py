"""A pod as the operator writes it: ``eddyline run --membership-configmap`` in a real process.

The pod's command, env and rendered manifest come from the operator's own
reconcile functions (the pod contract, docs/operator.md). It starts with no
tasks, reports its layout on ``/v1/layout``, is not ready, follows the
membership it watches through the Kubernetes API (here a stand-in that
serves just the one ConfigMap, GET and watch, over HTTP), runs its share, and
stops running it when a new generation drops it. The assignment is computed
by the operator's reconcile code from the pod's own report.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from eddyline_operator.reconcile import names, objects
from eddyline_operator.reconcile.membership import TaskLayout, layout_from, next_membership
from eddyline_operator.reconcile.plan import parse_app
from eddyline_runtime.assignor import Member
from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.membership import MEMBERSHIP_FILE, MemberReport, Membership
from eddyline_runtime.partitions import TopicPartition
from tests.support.control_plane.pods import resource_field_value
from tests.support.http_client import http_get
from tests.support.ports import free_port
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "wordcount"
NAMESPACE = "apps"


class ConfigMapApi:
    """Serves one ConfigMap the way the API server does for a pod: GET, and a watch
    by field selector that streams one JSON event per line."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.object: dict[str, Any] | None = None
        self.version = 0
        self.requests: list[str] = []
        self._watchers: list[asyncio.Queue[dict[str, Any] | None]] = []
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self.port = free_port()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self._thread.start()
        ready.wait(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/{self.name}", self._get)
        app.router.add_get(f"/api/v1/namespaces/{NAMESPACE}/configmaps", self._watch)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        self._loop.run_until_complete(site.start())
        ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    async def _get(self, request: web.Request) -> web.Response:
        self.requests.append(f"GET {request.path_qs}")
        if self.object is None:
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        return web.json_response(self.object)

    async def _watch(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(f"WATCH {request.path_qs}")
        assert request.query["watch"] == "true"
        assert request.query["fieldSelector"] == f"metadata.name={self.name}"
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._watchers.append(queue)
        try:
            while (event := await queue.get()) is not None:
                await response.write((json.dumps(event) + "\n").encode())
        finally:
            self._watchers.remove(queue)
        return response

    def publish(self, membership: Membership) -> None:
        def update() -> None:
            self.version += 1
            kind = "ADDED" if self.object is None else "MODIFIED"
            self.object = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": self.name,
                    "namespace": NAMESPACE,
                    "resourceVersion": str(self.version),
                },
                "data": {MEMBERSHIP_FILE: json.dumps(membership.to_json())},
            }
            for queue in self._watchers:
                queue.put_nowait({"type": kind, "object": self.object})

        self._loop.call_soon_threadsafe(update)

    def close(self) -> None:
        for queue in list(self._watchers):  # end the watches: the server then shuts down
            self._loop.call_soon_threadsafe(queue.put_nowait, None)
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def api() -> Iterator[ConfigMapApi]:
    server = ConfigMapApi(names.membership_map("wordcount"))
    yield server
    server.close()


def pod_command(
    tmp_path: Path, api: ConfigMapApi, address: str
) -> tuple[list[str], dict[str, str]]:
    """The operator's pod template for examples/wordcount/streamapp.cluster.yaml, with each
    mount path mapped to a directory under ``tmp_path`` (what a kubelet's volumes do)."""
    import yaml

    document = yaml.safe_load((EXAMPLE / "streamapp.cluster.yaml").read_text())
    document["metadata"]["namespace"] = NAMESPACE
    app = parse_app(document)
    owner = objects.owner_reference(name="wordcount", uid="uid")
    config_map = objects.config_map(app, NAMESPACE, owner)
    mounts = {
        names.CONFIG_MOUNT: tmp_path / "config",
        names.STATE_MOUNT: tmp_path / "state",
        names.LOG_MOUNT: tmp_path / "log",
    }
    for directory in mounts.values():
        directory.mkdir()
    for key, text in config_map["data"].items():
        (mounts[names.CONFIG_MOUNT] / key).write_text(text)

    def mapped(value: str) -> str:
        for mount, directory in mounts.items():
            value = value.replace(mount, str(directory))
        return value

    container = objects.pod_template(app, default_image="x", log_node="node-0")["spec"][
        "containers"
    ][0]
    env = {**os.environ, "PYTHONPATH": str(EXAMPLE), "EDDYLINE_KUBERNETES_API": api.url}
    values = {"POD_NAME": "wordcount-0", "POD_NAMESPACE": NAMESPACE, "POD_IP": "127.0.0.1"}
    for variable in container["env"]:
        field_ref = variable.get("valueFrom", {}).get("resourceFieldRef")
        if field_ref is not None:  # the downward API, as a kubelet resolves it (4 GiB node)
            value = resource_field_value(container, field_ref, {"memory": "4Gi"})
        else:
            value = values.get(variable["name"], variable.get("value", ""))
        for name, known in values.items():
            value = value.replace(f"$({name})", known)
        values[variable["name"]] = mapped(value)
    values["EDDYLINE_APPLICATION_SERVER"] = address  # a free port instead of 7070
    env.update(values)
    args = [mapped(a.replace("$(POD_NAME)", "wordcount-0")) for a in container["args"]]
    assert container["command"] == ["eddyline"]
    return [sys.executable, "-m", "eddyline_runtime.cli", *args], env


def test_a_pod_reports_its_layout_then_runs_the_share_the_operator_publishes(
    tmp_path: Path, api: ConfigMapApi
) -> None:
    address = f"127.0.0.1:{free_port()}"
    command, env = pod_command(tmp_path, api, address)
    log = SqliteLog(tmp_path / "log" / "log.db")
    log.create_topic("text-lines", 2)
    log.produce(TopicPartition("text-lines", 0), [Record(None, b"the quick the", 1)])
    pod = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: http_get(address, "/v1/layout").status == 200, "the layout")
        report = MemberReport.from_json(http_get(address, "/v1/layout").json())
        assert report.member == "wordcount-0"
        assert len(report.tasks) == 4  # 2 sub-topologies x 2 partitions
        assert report.stateful and report.stateful < report.tasks
        assert len(report.topology_hash) == 16
        assert http_get(address, "/readyz").status == 503  # no assignment yet
        assert http_get(address, "/healthz").status == 200

        layout = layout_from({"wordcount-0": report})
        assert isinstance(layout, TaskLayout)
        member = Member("wordcount-0", zone="zone-a", address=address)
        first = next_membership(None, [member], layout, 1)
        assert first is not None
        api.publish(first)
        wait_for(lambda: http_get(address, "/readyz").status == 200, "ready")
        wait_for(
            lambda: http_get(address, "/v1/stores/word-counts/keys/the").json().get("value") == 2,
            "the count of 'the'",
        )

        # A generation without this pod: it stops running its tasks within moments.
        other = Member("wordcount-1", zone="zone-b", address="127.0.0.2:7070")
        second = next_membership(first, [other], layout, 1)
        assert second is not None and second.generation == 2
        published = time.monotonic()
        api.publish(second)
        wait_for(lambda: http_get(address, "/readyz").status == 503, "not ready")
        assert time.monotonic() - published < 2.0
        assert any(r.startswith("WATCH") for r in api.requests)
    finally:
        pod.send_signal(signal.SIGTERM)
        output = pod.communicate(timeout=30)[0].decode()
        log.close()
    assert pod.returncode == 0, output
