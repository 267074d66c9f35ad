"""The client wrapper's apply: create when missing, patch only what differs from what we
set (servers add defaults), never the immutable parts of a spec. The kubernetes package's
transport is replaced by a recorder; the JSON bodies are what would be sent."""

from __future__ import annotations

import json
from typing import Any

from eddyline_operator.client import Kube

Obj = dict[str, Any]


class _Response:
    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self.data = json.dumps(body).encode() if body is not None else b""

    def read(self) -> None:
        pass


class RecordingTransport:
    """Stands in for kubernetes.client.ApiClient: answers GETs from ``stored``."""

    def __init__(self, stored: Obj | None) -> None:
        self.stored = stored
        self.sent: list[tuple[str, str, Any, str]] = []

    def param_serialize(
        self, method: str, path: str, **params: Any
    ) -> tuple[str, str, dict[str, str], Any, None]:
        return method, path, params["header_params"], params["body"], None

    def call_api(
        self, method: str, url: str, headers: dict[str, str], body: Any, post: Any, **_: Any
    ) -> _Response:
        self.sent.append((method, url, body, headers["Content-Type"]))
        if method == "GET":
            return _Response(404, None) if self.stored is None else _Response(200, self.stored)
        return _Response(200, body)


def service(**spec: Any) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "wc-query", "namespace": "apps", "labels": {"a": "b"}},
        "spec": {"selector": {"app": "wc"}, "ports": [{"name": "query", "port": 7070}], **spec},
    }


def test_a_missing_object_is_created() -> None:
    transport = RecordingTransport(None)
    assert Kube(transport).apply(service()) == "created"
    assert [(m, u) for m, u, _, _ in transport.sent] == [
        ("GET", "/api/v1/namespaces/apps/services/wc-query"),
        ("POST", "/api/v1/namespaces/apps/services"),
    ]


def test_server_defaults_do_not_count_as_a_difference() -> None:
    stored = service(clusterIP="10.0.0.7", type="ClusterIP")
    stored["spec"]["ports"][0].update(protocol="TCP", targetPort=7070)
    stored["metadata"].update(uid="u", resourceVersion="9")
    transport = RecordingTransport(stored)
    assert Kube(transport).apply(service()) == "unchanged"
    assert [m for m, _, _, _ in transport.sent] == ["GET"]


def test_a_difference_is_merge_patched_with_only_what_differs() -> None:
    transport = RecordingTransport(service())
    wanted = service()
    wanted["spec"]["ports"][0]["port"] = 7071
    assert Kube(transport).apply(wanted) == "updated"
    method, url, body, content_type = transport.sent[-1]
    assert (method, url, content_type) == (
        "PATCH",
        "/api/v1/namespaces/apps/services/wc-query",
        "application/merge-patch+json",
    )
    assert body == {"spec": wanted["spec"]}


def test_only_the_mutable_parts_of_a_stateful_set_are_patched() -> None:
    stored: Obj = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "wc", "namespace": "apps"},
        "spec": {"replicas": 3, "serviceName": "wc-headless", "volumeClaimTemplates": [{}]},
    }
    wanted = json.loads(json.dumps(stored))
    wanted["spec"].update(replicas=5, serviceName="renamed", volumeClaimTemplates=[{"x": 1}])
    transport = RecordingTransport(stored)
    assert Kube(transport).apply(wanted) == "updated"
    assert transport.sent[-1][2] == {"spec": {"replicas": 5}}


def test_status_goes_to_the_status_subresource() -> None:
    transport = RecordingTransport(None)
    Kube(transport).patch_streamapp_status("apps", "wc", {"phase": "Running"})
    assert transport.sent[-1][:3] == (
        "PATCH",
        "/apis/eddyline.dev/v1alpha1/namespaces/apps/streamapps/wc/status",
        {"status": {"phase": "Running"}},
    )
