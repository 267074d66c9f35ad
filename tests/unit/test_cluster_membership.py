"""How a pod finds and authenticates to the Kubernetes API (cluster_membership.ApiServer)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from eddyline_runtime.assignor import Assignment
from eddyline_runtime.cluster_membership import (
    MEMBERSHIP_KEY,
    ApiServer,
    ClusterMembershipError,
    ConfigMapMembership,
)
from eddyline_runtime.membership import Membership
from tests.support.waiting import wait_for


def test_the_override_wins_and_sends_no_token_without_a_token_file() -> None:
    api = ApiServer.from_environment(
        {"EDDYLINE_KUBERNETES_API": "http://127.0.0.1:8001/", "KUBERNETES_SERVICE_HOST": "x"}
    )
    assert api.url == "http://127.0.0.1:8001"


def test_in_a_pod_the_service_address_is_used_over_tls() -> None:
    api = ApiServer.from_environment(
        {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    )
    assert api.url == "https://10.0.0.1:443"
    assert api.token_file is not None and api.token_file.name == "token"
    ipv6 = ApiServer.from_environment(
        {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    )
    assert ipv6.url == "https://[fd00::1]:443"


def test_the_service_account_directory_can_be_moved(tmp_path: Path) -> None:
    """A kubelet without mount namespaces (the tests' stand-in) names each pod's directory."""
    (tmp_path / "token").write_text("t", encoding="utf-8")
    api = ApiServer.from_environment(
        {
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": "6443",
            "EDDYLINE_SERVICE_ACCOUNT_DIR": str(tmp_path),
        }
    )
    assert api.token_file == tmp_path / "token"


def test_outside_a_pod_without_an_override_the_error_says_what_to_set() -> None:
    with pytest.raises(ClusterMembershipError, match="EDDYLINE_KUBERNETES_API"):
        ApiServer.from_environment({})


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[str | None] = []  # noqa: RUF012 - shared with the test on purpose

    def do_GET(self) -> None:
        _Recorder.seen.append(self.headers.get("Authorization"))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Recorder.seen = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_the_token_is_read_again_for_every_request(recorder: str, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    api = ApiServer(recorder, token_file=token)
    with api.open("/api", timeout=5):
        pass
    token.write_text("rotated")  # projected tokens rotate under a running pod
    with api.open("/api", timeout=5):
        pass
    assert _Recorder.seen == ["Bearer first", "Bearer rotated"]


class _DeletedMembership(http.server.BaseHTTPRequestHandler):
    """A ConfigMap that holds a membership, then is deleted (the app is being deleted)."""

    deleted = False

    def do_GET(self) -> None:
        if "watch=true" in self.path:
            _DeletedMembership.deleted = True
            body = json.dumps({"type": "DELETED", "object": {"metadata": {"name": "m"}}})
            self._answer(200, body.encode() + b"\n")
        elif _DeletedMembership.deleted:
            self._answer(404, b"{}")
        else:
            membership = Membership(3, Assignment(active={"pod-0": frozenset()}, standby={}))
            configmap = {
                "metadata": {"resourceVersion": "7"},
                "data": {MEMBERSHIP_KEY: json.dumps(membership.to_json())},
            }
            self._answer(200, json.dumps(configmap).encode())

    def _answer(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_deleted_membership_configmap_tells_a_leaving_pod_nobody_will_take_over() -> None:
    _DeletedMembership.deleted = False
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _DeletedMembership)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    source = ConfigMapMembership(
        ApiServer(f"http://127.0.0.1:{server.server_address[1]}"), namespace="apps", name="m"
    )
    try:
        assert not source.gone
        source.start("pod-0")
        wait_for(lambda: source.gone, "the deletion to be noticed", 10)
        current = source.current()
        assert current is not None and current.generation == 3
    finally:
        source.stop()
        server.shutdown()
        server.server_close()
        thread.join(5)
