"""The client wrapper's apply: server-side apply of the whole object under the operator's
field manager, never the immutable parts of a spec. The kubernetes package's transport is
replaced by a recorder; the JSON bodies are what would be sent. That a field left out is
removed by the real API server is tests/e2e/test_operator_apply.py's business."""

from __future__ import annotations

import json
from typing import Any

from kubernetes.config import kube_config

from eddyline_operator.client import APPLY_PATCH, FIELD_MANAGER, Kube

Obj = dict[str, Any]


class _Response:
    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self.data = json.dumps(body).encode() if body is not None else b""

    def read(self) -> None:
        pass


class RecordingTransport:
    """Stands in for kubernetes.client.ApiClient: answers GETs from ``stored``, and a PATCH
    with ``patched`` (default: the body sent, as a server that changed the object)."""

    def __init__(self, stored: Obj | None, patched: Obj | None = None) -> None:
        self.stored = stored
        self.patched = patched
        self.sent: list[tuple[str, str, Any, str]] = []
        self.queries: list[dict[str, str]] = []

    def param_serialize(
        self, method: str, path: str, **params: Any
    ) -> tuple[str, str, dict[str, str], Any, None]:
        self.queries.append(dict(params.get("query_params") or []))
        return method, path, params["header_params"], params["body"], None

    def call_api(
        self, method: str, url: str, headers: dict[str, str], body: Any, post: Any, **_: Any
    ) -> _Response:
        self.sent.append((method, url, body, headers["Content-Type"]))
        if method == "GET":
            return _Response(404, None) if self.stored is None else _Response(200, self.stored)
        if method == "PATCH" and self.patched is not None:
            return _Response(200, self.patched)
        return _Response(200, body)


def service(**spec: Any) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "wc-query", "namespace": "apps", "labels": {"a": "b"}},
        "spec": {"selector": {"app": "wc"}, "ports": [{"name": "query", "port": 7070}], **spec},
    }


def test_a_missing_object_is_created_by_server_side_apply() -> None:
    transport = RecordingTransport(None)
    assert Kube(transport).apply(service()) == "created"
    assert [(m, u, t) for m, u, _, t in transport.sent] == [
        ("GET", "/api/v1/namespaces/apps/services/wc-query", "application/json"),
        ("PATCH", "/api/v1/namespaces/apps/services/wc-query", APPLY_PATCH),
    ]
    assert transport.sent[-1][2] == service()
    assert transport.queries[-1] == {"fieldManager": FIELD_MANAGER, "force": "true"}


def test_an_apply_the_server_found_nothing_to_change_in_is_unchanged() -> None:
    stored = service(clusterIP="10.0.0.7", type="ClusterIP")
    stored["spec"]["ports"][0].update(protocol="TCP", targetPort=7070)
    stored["metadata"].update(uid="u", resourceVersion="9")
    transport = RecordingTransport(stored, patched=stored)
    assert Kube(transport).apply(service()) == "unchanged"
    again = json.loads(json.dumps(stored))
    again["metadata"].update(resourceVersion="10", managedFields=[{"manager": FIELD_MANAGER}])
    assert Kube(RecordingTransport(stored, patched=again)).apply(service()) == "unchanged"


def test_the_whole_object_is_applied_so_what_it_no_longer_holds_goes() -> None:
    """A merge patch of the differences could never remove a field; an apply of the whole
    object tells the server what the operator wants now, owner references included."""
    stored = service()
    stored["metadata"]["ownerReferences"] = [{"kind": "StreamApp", "name": "wc", "uid": "u"}]
    transport = RecordingTransport(stored)
    wanted = service()
    wanted["spec"]["ports"][0]["port"] = 7071
    assert Kube(transport).apply(wanted) == "updated"
    method, url, body, content_type = transport.sent[-1]
    assert (method, url, content_type) == (
        "PATCH",
        "/api/v1/namespaces/apps/services/wc-query",
        APPLY_PATCH,
    )
    assert body == wanted
    assert "ownerReferences" not in body["metadata"]


def test_the_immutable_parts_of_a_stateful_set_are_sent_as_they_are() -> None:
    stored: Obj = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "wc", "namespace": "apps"},
        "spec": {"replicas": 3, "serviceName": "wc-headless", "volumeClaimTemplates": [{}]},
    }
    wanted = json.loads(json.dumps(stored))
    wanted["spec"].update(replicas=5, serviceName="renamed", volumeClaimTemplates=[{"x": 1}])
    wanted["spec"]["podManagementPolicy"] = "Parallel"  # not on the stored object: left out
    transport = RecordingTransport(stored)
    assert Kube(transport).apply(wanted) == "updated"
    assert transport.sent[-1][2]["spec"] == {
        "replicas": 5,
        "serviceName": "wc-headless",
        "volumeClaimTemplates": [{}],
    }


def test_status_goes_to_the_status_subresource() -> None:
    transport = RecordingTransport(None)
    Kube(transport).patch_streamapp_status("apps", "wc", {"phase": "Running"})
    assert transport.sent[-1][:3] == (
        "PATCH",
        "/apis/eddyline.dev/v1alpha1/namespaces/apps/streamapps/wc/status",
        {"status": {"phase": "Running"}},
    )


def test_a_child_that_holds_what_would_be_applied_is_not_sent_again_on_a_re_apply() -> None:
    """The periodic re-apply (unless_same) only GETs a child the server holds as wanted
    (with its defaults added); a drifted one is applied as ever."""
    stored = service(clusterIP="10.0.0.7", type="ClusterIP")
    stored["spec"]["ports"][0].update(protocol="TCP", targetPort=7070)
    transport = RecordingTransport(stored)
    assert Kube(transport).apply(service(), unless_same=True) == "unchanged"
    assert [m for m, _, _, _ in transport.sent] == ["GET"]
    drifted = service()
    drifted["metadata"]["labels"] = {"a": "edited by hand"}
    transport = RecordingTransport(drifted)
    assert Kube(transport).apply(service(), unless_same=True) == "updated"
    assert [m for m, _, _, _ in transport.sent] == ["GET", "PATCH"]


def test_a_false_the_server_leaves_out_is_no_drift() -> None:
    """The query Service wants ``publishNotReadyAddresses: false`` outside an upgrade; the
    server stores a false plain bool as nothing. The drift check sends it only when the
    server holds true."""
    stored = service(clusterIP="10.0.0.7", type="ClusterIP")
    stored["spec"]["ports"][0].update(protocol="TCP", targetPort=7070)
    transport = RecordingTransport(stored)
    assert Kube(transport).apply(service(publishNotReadyAddresses=False), unless_same=True) == (
        "unchanged"
    )
    assert [m for m, _, _, _ in transport.sent] == ["GET"]
    stored["spec"]["publishNotReadyAddresses"] = True
    transport = RecordingTransport(stored)
    assert Kube(transport).apply(service(publishNotReadyAddresses=False), unless_same=True) == (
        "updated"
    )
    assert transport.sent[-1][2]["spec"]["publishNotReadyAddresses"] is False


def test_a_status_write_returns_the_version_it_left() -> None:
    transport = RecordingTransport(None, patched={"metadata": {"resourceVersion": "42"}})
    assert Kube(transport).patch_streamapp_status("apps", "wc", {"phase": "Running"}) == "42"


def test_the_connection_pool_is_as_large_as_asked(tmp_path: Any, monkeypatch: Any) -> None:
    """One pooled connection per thread that sends requests: the kubernetes client's default
    (5 per CPU) is fewer than the operator's threads on a 2-CPU node."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:1"}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        }),
        encoding="utf-8",
    )  # fmt: skip
    # The kubernetes package reads KUBECONFIG once, when it is imported.
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    monkeypatch.delenv("EDDYLINE_SERVICE_ACCOUNT_DIR", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    kube = Kube(pool_size=17)
    assert kube._api.rest_client.pool_manager.connection_pool_kw["maxsize"] == 17
