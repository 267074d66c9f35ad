"""The API semantics kopf and controllers rely on, checked over plain HTTP."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import yaml

from tests.support.k8s.apiserver import ApiServer
from tests.support.k8s.client import request, watch_events
from tests.support.k8s.fixtures import CRD

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


@pytest.fixture
def api(apiserver: ApiServer) -> ApiServer:
    crd = yaml.safe_load(CRD.read_text(encoding="utf-8"))
    created = request(
        f"{apiserver.url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions", "POST", crd
    )
    assert created.status == 201, created
    return apiserver


def apps(api: ApiServer) -> str:
    return f"{api.url}/apis/eddyline.dev/v1alpha1/namespaces/default/streamapps"


def configmaps(api: ApiServer, namespace: str = "default") -> str:
    return f"{api.url}/api/v1/namespaces/{namespace}/configmaps"


def app(name: str = "wc", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "eddyline.dev/v1alpha1",
        "kind": "StreamApp",
        "metadata": {"name": name},
        "spec": {"topology": {"ref": "m:f"}, **spec},
    }


def test_lists_carry_their_kind_and_the_current_resource_version(api: ApiServer) -> None:
    listed = request(configmaps(api))
    assert listed.body["kind"] == "ConfigMapList"
    assert listed.body["apiVersion"] == "v1"
    assert int(listed.body["metadata"]["resourceVersion"]) == api.revision
    namespaces = request(f"{api.url}/api/v1/namespaces").body
    assert {n["metadata"]["name"] for n in namespaces["items"]} >= {"default", "kube-system"}


def test_created_objects_get_identity_defaults_and_201(api: ApiServer) -> None:
    created = request(apps(api), "POST", app())
    assert created.status == 201
    meta = created.body["metadata"]
    assert meta["generation"] == 1 and meta["uid"] and meta["resourceVersion"]
    assert created.body["spec"]["topology"]["revision"] == "1"  # schema default
    assert "status" not in created.body
    assert request(apps(api), "POST", app()).status == 409
    named = request(configmaps(api), "POST", {"metadata": {"generateName": "wc-"}})
    assert named.body["metadata"]["name"].startswith("wc-")
    assert request(configmaps(api, "nowhere"), "POST", {"metadata": {"name": "x"}}).status == 404


def test_generation_follows_spec_changes_only(api: ApiServer) -> None:
    request(apps(api), "POST", app())
    url = f"{apps(api)}/wc"
    labelled = request(url, "PATCH", {"metadata": {"labels": {"a": "b"}}}, content_type=MERGE)
    assert labelled.body["metadata"]["generation"] == 1
    status = request(f"{url}/status", "PATCH", {"status": {"phase": "Running"}}, content_type=MERGE)
    assert status.body["metadata"]["generation"] == 1
    assert status.body["status"]["phase"] == "Running"
    changed = request(url, "PATCH", {"spec": {"replicas": 2}}, content_type=MERGE)
    assert changed.body["metadata"]["generation"] == 2
    rv = changed.body["metadata"]["resourceVersion"]
    unchanged = request(url, "PATCH", {"spec": {"replicas": 2}}, content_type=MERGE)
    assert unchanged.body["metadata"]["resourceVersion"] == rv  # a no-op writes nothing


def test_status_subresource_and_main_resource_ignore_each_others_fields(api: ApiServer) -> None:
    request(apps(api), "POST", app())
    url = f"{apps(api)}/wc"
    request(url, "PATCH", {"status": {"phase": "Running"}}, content_type=MERGE)
    assert "status" not in request(url).body
    request(
        f"{url}/status",
        "PATCH",
        {"spec": {"replicas": 9}, "status": {"phase": "Running"}},
        content_type=MERGE,
    )
    body = request(url).body
    assert body["spec"]["replicas"] == 1 and body["status"]["phase"] == "Running"


def test_a_stale_update_conflicts_and_a_failed_json_patch_test_is_422(api: ApiServer) -> None:
    created = request(apps(api), "POST", app()).body
    url = f"{apps(api)}/wc"
    request(url, "PATCH", {"spec": {"replicas": 2}}, content_type=MERGE)
    stale = request(url, "PUT", {**created, "spec": {**created["spec"], "replicas": 3}})
    assert stale.status == 409 and stale.body["reason"] == "Conflict"
    stale_patch = {
        "metadata": {"resourceVersion": created["metadata"]["resourceVersion"]},
        "spec": {"replicas": 3},
    }
    assert request(url, "PATCH", stale_patch, content_type=MERGE).status == 409
    kopf_style = [
        {
            "op": "test",
            "path": "/metadata/resourceVersion",
            "value": created["metadata"]["resourceVersion"],
        },
        {
            "op": "add",
            "path": "/metadata/finalizers",
            "value": ["kopf.zalando.org/KopfFinalizerMarker"],
        },
    ]
    assert request(url, "PATCH", kopf_style, content_type=JSON_PATCH).status == 422
    kopf_style[0]["value"] = request(url).body["metadata"]["resourceVersion"]
    assert request(url, "PATCH", kopf_style, content_type=JSON_PATCH).status == 200


def test_label_and_field_selectors(api: ApiServer) -> None:
    for name, labels in (("a", {"app": "x", "tier": "1"}), ("b", {"app": "y"}), ("c", {})):
        request(configmaps(api), "POST", {"metadata": {"name": name, "labels": labels}})

    def names(query: str) -> list[str]:
        return [o["metadata"]["name"] for o in request(f"{configmaps(api)}?{query}").body["items"]]

    assert names("labelSelector=app%3Dx") == ["a"]
    assert names("labelSelector=app%20in%20(x,y)") == ["a", "b"]
    assert names("labelSelector=app,app!%3Dy") == ["a"]
    assert names("labelSelector=!app") == ["c"]
    assert names("fieldSelector=metadata.name%3Db") == ["b"]
    assert names("fieldSelector=metadata.name!%3Db") == ["a", "c"]


@pytest.mark.slow
def test_watch_resumes_from_a_resource_version_with_bookmarks_and_timeout(
    api: ApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tests.support.k8s.apiserver.BOOKMARK_INTERVAL", 0.5)
    request(configmaps(api), "POST", {"metadata": {"name": "before"}})
    rv = request(configmaps(api)).body["metadata"]["resourceVersion"]

    def later() -> None:
        time.sleep(0.3)
        request(configmaps(api), "POST", {"metadata": {"name": "after", "labels": {"k": "v"}}})
        request(f"{configmaps(api)}/after", "DELETE")

    threading.Thread(target=later).start()
    events = watch_events(
        f"{configmaps(api)}?watch=true&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=2"
    )
    kinds = [(e["type"], e["object"]["metadata"].get("name")) for e in events]
    assert kinds[:2] == [("ADDED", "after"), ("DELETED", "after")]
    assert ("BOOKMARK", None) in kinds
    replay = watch_events(
        f"{configmaps(api)}?watch=1&resourceVersion={rv}&timeoutSeconds=1&labelSelector=k%3Dv"
    )
    assert [e["type"] for e in replay] == ["ADDED", "DELETED"]
    initial = watch_events(f"{configmaps(api)}?watch=1&timeoutSeconds=1")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in initial] == [("ADDED", "before")]


def test_a_watch_from_an_expired_resource_version_gets_410(
    api: ApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    api.history.clear()
    for index in range(3):
        request(configmaps(api), "POST", {"metadata": {"name": f"c{index}"}})
    events = watch_events(f"{configmaps(api)}?watch=1&resourceVersion=2&timeoutSeconds=1")
    assert events[0]["type"] == "ERROR" and events[0]["object"]["code"] == 410


def test_deleting_an_owner_collects_its_dependents_and_finalizers_hold_deletion(
    api: ApiServer,
) -> None:
    owner = request(apps(api), "POST", app()).body
    reference = {
        "apiVersion": "eddyline.dev/v1alpha1",
        "kind": "StreamApp",
        "name": "wc",
        "uid": owner["metadata"]["uid"],
        "controller": True,
    }
    request(
        configmaps(api), "POST", {"metadata": {"name": "owned", "ownerReferences": [reference]}}
    )
    request(configmaps(api), "POST", {"metadata": {"name": "free"}})
    url = f"{apps(api)}/wc"
    request(url, "PATCH", {"metadata": {"finalizers": ["x/y"]}}, content_type=MERGE)
    held = request(url, "DELETE")
    assert held.status == 200 and held.body["metadata"]["deletionTimestamp"]
    assert request(f"{configmaps(api)}/owned").status == 200
    request(url, "PATCH", {"metadata": {"finalizers": None}}, content_type=MERGE)
    assert request(url).status == 404
    assert request(f"{configmaps(api)}/owned").status == 404
    assert request(f"{configmaps(api)}/free").status == 200


def test_deleting_a_namespace_deletes_its_contents(api: ApiServer) -> None:
    request(f"{api.url}/api/v1/namespaces", "POST", {"metadata": {"name": "team"}})
    request(configmaps(api, "team"), "POST", {"metadata": {"name": "c"}})
    assert request(f"{api.url}/api/v1/namespaces/team", "DELETE").status == 200
    assert request(f"{configmaps(api, 'team')}/c").status == 404


def test_schema_errors_come_back_as_invalid_with_causes_naming_each_field(api: ApiServer) -> None:
    bad = app(replicas=-1, imagePullPolicy="Sometimes")
    rejected = request(apps(api), "POST", bad)
    assert rejected.status == 422 and rejected.body["reason"] == "Invalid"
    causes = {c["field"]: c for c in rejected.body["details"]["causes"]}
    assert causes["spec.replicas"]["reason"] == "FieldValueInvalid"
    assert causes["spec.imagePullPolicy"]["message"] == (
        'Unsupported value: "Sometimes": supported values: "Always", "IfNotPresent", "Never"'
    )


def test_unknown_fields_are_pruned_unless_validation_is_strict(api: ApiServer) -> None:
    body = app(unknown=1)
    strict = request(f"{apps(api)}?fieldValidation=Strict", "POST", body)
    assert strict.status == 400
    assert strict.body["message"].endswith('strict decoding error: unknown field "spec.unknown"')
    pruned = request(apps(api), "POST", body)
    assert pruned.status == 201 and "unknown" not in pruned.body["spec"]


def test_transition_rules_see_the_old_object(api: ApiServer) -> None:
    request(apps(api), "POST", app(storage={"size": "1Gi"}))
    resized = request(
        f"{apps(api)}/wc", "PATCH", {"spec": {"storage": {"size": "2Gi"}}}, content_type=MERGE
    )
    assert resized.status == 422
    assert 'spec.storage: Invalid value: "object": size is immutable' in resized.body["message"]


def test_injected_failures_answer_the_next_matching_requests(api: ApiServer) -> None:
    api.inject("GET", "/api/v1/namespaces/default/configmaps", 500, times=1)
    assert request(configmaps(api)).status == 500
    assert request(configmaps(api)).status == 200


def test_service_account_tokens_get_what_their_roles_allow_and_403_otherwise(
    api: ApiServer,
) -> None:
    rbac = f"{api.url}/apis/rbac.authorization.k8s.io/v1/namespaces/default"
    request(f"{rbac}/roles", "POST", {
        "metadata": {"name": "membership-reader"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "watch"],
                   "resourceNames": ["wc-membership"]}],
    })  # fmt: skip
    request(f"{rbac}/rolebindings", "POST", {
        "metadata": {"name": "membership-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": "membership-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "wc", "namespace": "default"}],
    })  # fmt: skip
    request(configmaps(api), "POST", {"metadata": {"name": "wc-membership"}})
    request(configmaps(api), "POST", {"metadata": {"name": "other"}})
    token = {"Authorization": f"Bearer {api.issue_token('default', 'wc')}"}
    assert request(f"{configmaps(api)}/wc-membership", headers=token).status == 200
    watch = (
        f"{configmaps(api)}?watch=1&timeoutSeconds=1&fieldSelector=metadata.name%3Dwc-membership"
    )
    assert request(watch, headers=token).status == 200
    denied = request(f"{configmaps(api)}/other", headers=token)
    assert denied.status == 403 and denied.body["reason"] == "Forbidden"
    assert denied.body["message"] == (
        'configmaps "other" is forbidden: User "system:serviceaccount:default:wc" cannot get '
        'resource "configmaps" in API group "" in the namespace "default"'
    )
    assert request(configmaps(api), headers=token).status == 403  # list is not granted
    assert request(f"{apps(api)}", headers=token).status == 403
    assert request(f"{api.url}/apis", headers=token).status == 200  # discovery is for everyone
