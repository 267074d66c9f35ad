"""The real kubectl against the emulator: what a user does and reads, with default flags."""

from __future__ import annotations

import re

import pytest

from tests.support.k8s.apiserver import ApiServer
from tests.support.k8s.client import request
from tests.support.k8s.fixtures import CRD
from tests.support.k8s.kubectl import Kubectl

MANIFEST = """\
apiVersion: eddyline.dev/v1alpha1
kind: StreamApp
metadata:
  name: word-count
spec:
  topology: {ref: "wordcount:topology", revision: "7"}
  replicas: 3
  log: {url: "sqlite:////var/lib/eddyline-log/log.db"}
  config:
    num.standby.replicas: 1
"""


@pytest.fixture
def crd_kubectl(kubectl: Kubectl) -> Kubectl:
    assert "created" in kubectl("apply", "-f", str(CRD))
    kubectl("wait", "--for=condition=Established", "crd/streamapps.eddyline.dev")
    return kubectl


def test_kubectl_registers_the_crd_and_discovers_its_short_name(crd_kubectl: Kubectl) -> None:
    resources = crd_kubectl("api-resources", "--api-group=eddyline.dev")
    assert re.search(r"streamapps\s+sapp\s+eddyline.dev/v1alpha1\s+true\s+StreamApp", resources)
    result = crd_kubectl.run("get", "sapp")
    assert result.returncode == 0
    assert "warning" not in result.stderr.lower()  # no ambiguous short names on subresources
    assert "No resources found in default namespace." in result.stderr


def test_kubectl_apply_get_describe_and_delete_a_streamapp(
    crd_kubectl: Kubectl, apiserver: ApiServer
) -> None:
    kubectl = crd_kubectl
    assert kubectl("apply", "-f", "-", stdin=MANIFEST).strip() == (
        "streamapp.eddyline.dev/word-count created"
    )
    assert "unchanged" in kubectl("apply", "-f", "-", stdin=MANIFEST)
    base = f"{apiserver.url}/apis/eddyline.dev/v1alpha1/namespaces/default/streamapps/word-count"
    status = {
        "observedGeneration": 1,
        "phase": "Running",
        "replicas": 3,
        "readyReplicas": 3,
        "revision": "7",
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "AllReplicasReady",
                "message": "3 of 3 pods ready",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
    }
    patched = request(
        f"{base}/status", "PATCH", {"status": status}, content_type="application/merge-patch+json"
    )
    assert patched.status == 200, patched
    uid = patched.body["metadata"]["uid"]
    event = {
        "metadata": {"generateName": "word-count."},
        "involvedObject": {
            "apiVersion": "eddyline.dev/v1alpha1",
            "kind": "StreamApp",
            "name": "word-count",
            "namespace": "default",
            "uid": uid,
        },
        "reason": "Scaled",
        "message": "StatefulSet word-count scaled to 3",
        "type": "Normal",
        "source": {"component": "eddyline-operator"},
        "firstTimestamp": "2026-01-01T00:00:00Z",
        "lastTimestamp": "2026-01-01T00:00:00Z",
    }
    posted = request(f"{apiserver.url}/api/v1/namespaces/default/events", "POST", event)
    assert posted.status == 201, posted

    table = kubectl("get", "sapp").splitlines()
    assert table[0].split() == ["NAME", "REPLICAS", "READY", "PHASE", "REVISION", "AGE"]
    assert table[1].split()[:5] == ["word-count", "3", "3", "Running", "7"]

    described = kubectl("describe", "sapp", "word-count")
    assert re.search(r"Type:\s+Ready", described)
    assert re.search(r"Reason:\s+AllReplicasReady", described)
    assert re.search(
        r"Normal\s+Scaled\s+\S+\s+eddyline-operator\s+StatefulSet word-count", described
    )

    assert 'streamapp.eddyline.dev "word-count" deleted' in kubectl("delete", "sapp", "word-count")
    assert request(base).status == 404


def test_kubectl_apply_rejects_an_unknown_field_like_a_real_server(crd_kubectl: Kubectl) -> None:
    error = crd_kubectl.fails("apply", "-f", "-", stdin=MANIFEST + "  replica: 3\n")
    assert 'strict decoding error: unknown field "spec.replica"' in error


def test_kubectl_apply_rejects_schema_and_cel_violations_naming_the_field(
    crd_kubectl: Kubectl,
) -> None:
    error = crd_kubectl.fails(
        "apply",
        "-f",
        "-",
        stdin=MANIFEST.replace(
            "standby.replicas: 1", "standby.replicas: 1\n    max.task.idle.ms: -5"
        ),
    )
    assert (
        'The StreamApp "word-count" is invalid: spec.config.max.task.idle.ms: Invalid value: -5: '
        "spec.config.max.task.idle.ms in body should be greater than or equal to -1"
    ) in error
    error = crd_kubectl.fails(
        "apply",
        "-f",
        "-",
        stdin=MANIFEST.replace('log.db"}', 'log.db", secretName: "kafka-client"}'),
    )
    assert 'spec.log: Invalid value: "object": secretName holds Kafka client settings' in error


def test_kubectl_patch_without_a_type_is_refused_for_custom_resources(crd_kubectl: Kubectl) -> None:
    crd_kubectl("apply", "-f", "-", stdin=MANIFEST)
    error = crd_kubectl.fails("patch", "sapp", "word-count", "-p", '{"spec":{"replicas":2}}')
    assert "UnsupportedMediaType" in error or "unknown format" in error
    crd_kubectl("patch", "sapp", "word-count", "--type=merge", "-p", '{"spec":{"replicas":2}}')
    assert crd_kubectl("get", "sapp", "word-count").splitlines()[1].split()[1] == "2"


def test_kubectl_scale_goes_through_the_scale_subresource_and_is_validated(
    crd_kubectl: Kubectl, apiserver: ApiServer
) -> None:
    crd_kubectl("apply", "-f", "-", stdin=MANIFEST)
    assert "scaled" in crd_kubectl("scale", "sapp", "word-count", "--replicas=5")
    assert crd_kubectl("get", "sapp", "word-count").splitlines()[1].split()[1] == "5"
    assert any(r["path"].endswith("/word-count/scale") for r in apiserver.requests)
    # 0 is a suspension (an HPA or KEDA may scale to zero); above 1000 is refused.
    assert "scaled" in crd_kubectl("scale", "sapp", "word-count", "--replicas=0")
    assert crd_kubectl("get", "sapp", "word-count").splitlines()[1].split()[1] == "0"
    error = crd_kubectl.fails("scale", "sapp", "word-count", "--replicas=1001")
    assert "spec.replicas in body should be less than or equal to 1000" in error


def test_kubectl_server_side_apply_creates_and_updates(crd_kubectl: Kubectl) -> None:
    assert "serverside-applied" in crd_kubectl("apply", "--server-side", "-f", "-", stdin=MANIFEST)
    crd_kubectl(
        "apply", "--server-side", "-f", "-", stdin=MANIFEST.replace("replicas: 3", "replicas: 4")
    )
    assert crd_kubectl("get", "sapp", "word-count").splitlines()[1].split()[1] == "4"


def test_deleting_the_crd_deletes_its_instances(crd_kubectl: Kubectl, apiserver: ApiServer) -> None:
    crd_kubectl("apply", "-f", "-", stdin=MANIFEST)
    crd_kubectl("delete", "-f", str(CRD))
    assert not [key for key in apiserver.objects if key[0] == "eddyline.dev/streamapps"]
    # kubectl's cached discovery still knows the resource; the server no longer serves it.
    assert "the server could not find the requested resource" in crd_kubectl.fails("get", "sapp")
