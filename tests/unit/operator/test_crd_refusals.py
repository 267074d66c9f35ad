"""What a real API server refuses in a child is refused in the StreamApp itself (issue 23,
items 8 and 11): by the generated CRD (patterns as CEL rules with the accepted form in words,
checked here by the schema admission of ``tests/support/crd_schema.py``, in-process, and
against the real API server in ``tests/e2e/test_operator_real_cluster.py``) and by the
model the operator parses with, each naming the field and the accepted form."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from eddyline_operator.crd import generate_crd
from eddyline_operator.reconcile.plan import parse_app
from eddyline_runtime.spec import ManifestError, parse_manifest
from tests.support.crd_schema import admit

Obj = dict[str, Any]

GOOD: Obj = {
    "apiVersion": "eddyline.dev/v1alpha1",
    "kind": "StreamApp",
    "metadata": {"name": "wc", "namespace": "apps"},
    "spec": {"topology": {"ref": "wordcount:topology"}, "log": {"url": "kafka://k:9092"}},
}


def schema() -> Obj:
    version = generate_crd()["spec"]["versions"][0]
    result: Obj = version["schema"]["openAPIV3Schema"]
    return result


def document(name: str = "wc", **spec: Any) -> Obj:
    found = copy.deepcopy(GOOD)
    found["metadata"]["name"] = name
    found["spec"].update(spec)
    return found


def crd_errors(obj: Obj) -> list[str]:
    return [error.message() for error in admit(obj, schema()).errors]


def model_error(obj: Obj) -> ManifestError:
    with pytest.raises(ManifestError) as refused:
        parse_app(obj)
    return refused.value


def test_the_good_document_passes_both() -> None:
    assert crd_errors(document()) == []
    parse_app(document())


@pytest.mark.parametrize(
    ("obj", "field", "words"),
    [
        (document("1wordcount"), "metadata.name", "DNS-1035"),
        (document(storage={"size": "0"}), "spec.storage.size", "a quantity above zero such as"),
        (document(storage={"logSize": "0Gi"}), "spec.storage.logSize", "a quantity above zero"),
        (document(image="my image:1"), "spec.image", "without spaces"),
        (
            document(restore={"when": "Always", "image": "a b"}),
            "spec.restore.image",
            "without spaces",
        ),
        (
            document(resources={"requests": {"gpu": "1"}}),
            "spec.resources.requests",
            "domain-qualified name such as nvidia.com/gpu",
        ),
        (
            document(standbyPlacement={"topologyKey": "a" * 254 + "/zone"}),
            "spec.standbyPlacement.topologyKey",
            "253",
        ),
        (document(storage={"size": "ten"}), "spec.storage.size", "such as 10Gi"),
    ],
)
def test_the_crd_and_the_model_refuse_naming_the_field_and_the_form(
    obj: Obj, field: str, words: str
) -> None:
    errors = crd_errors(obj)
    assert any(words in error for error in errors), errors
    assert not any("^" in error for error in errors), f"a regex in {errors}"
    refused = model_error(obj)
    assert refused.field.startswith(field), refused
    assert words in str(refused), refused
    assert "^" not in str(refused), refused


def test_long_names_are_refused_only_with_restores_on() -> None:
    name = "a" * 45
    restoring = document(name, restore={"when": "Always"})
    assert any("at most 44 characters with spec.restore" in e for e in crd_errors(restoring))
    assert "at most 44" in str(model_error(restoring))
    assert crd_errors(document(name)) == []
    parse_app(document(name))
    parse_app(document("a" * 44, restore={"when": "Always"}))


def test_requests_above_limits_are_refused() -> None:
    above = document(resources={"requests": {"cpu": "2"}, "limits": {"cpu": "1500m"}})
    refused = model_error(above)
    assert "requests.cpu 2 is above limits.cpu 1500m" in str(refused)
    parse_app(document(resources={"requests": {"memory": "1Gi"}, "limits": {"memory": "1Gi"}}))
    parse_app(document(resources={"requests": {"cpu": "500m"}, "limits": {"memory": "1Gi"}}))
    # The CRD holds the same rule (the Kubernetes quantity() library, which this admission's
    # CEL lacks: it is checked on a real API server).
    rules = schema()["properties"]["spec"]["properties"]["resources"]["x-kubernetes-validations"]
    assert any("quantity(self.requests[k])" in rule["rule"] for rule in rules)


def test_a_config_typo_is_kept_by_the_crd_and_refused_by_the_model_by_name() -> None:
    """spec.config keeps unknown keys (x-kubernetes-preserve-unknown-fields), so a client
    that sends no strict field validation cannot have a typo pruned silently: the object
    keeps it and the operator's model refuses it, naming the field, the known settings and
    the closest one. (A map keeping every key with a CEL rule is what the real API server
    cannot type: see docs/operator.md.)"""
    typo = document(config={"num.stream.thread": 2})
    admission = admit(typo, schema())
    assert admission.unknown_fields == []
    assert admission.errors == []
    assert admission.obj["spec"]["config"]["num.stream.thread"] == 2  # kept, beside defaults
    refused = model_error(typo)
    assert refused.field == 'spec.config."num.stream.thread"'
    assert 'did you mean "num.stream.threads"?' in refused.problem
    for known in schema()["properties"]["spec"]["properties"]["config"]["properties"]:
        assert repr(known) in refused.problem


def test_a_setting_only_local_runs_read_is_not_a_cluster_setting() -> None:
    """On a cluster the known keys are the CRD's properties: a StreamsConfig name the CRD
    does not list (the operator sets it, e.g. memory.limit.bytes from the pod's limit) is
    refused there too, while a local run's manifest keeps reading it."""
    local = document(config={"memory.limit.bytes": 1})
    assert parse_manifest(local).spec.config == {"memory.limit.bytes": 1}
    refused = model_error(local)
    assert refused.field == 'spec.config."memory.limit.bytes"'
    assert "the known settings" in refused.problem


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"processing.guarantee": "exactly_once"}, "spec.config.processing.guarantee"),
        ({"max.task.idle.ms": -5}, "spec.config.max.task.idle.ms"),
        ({"num.stream.threads": "2"}, "spec.config.num.stream.threads"),
        ({"automatic.state.relocation": "yes"}, "spec.config.automatic.state.relocation"),
    ],
)
def test_each_setting_is_checked_by_its_typed_property(config: Obj, field: str) -> None:
    errors = crd_errors(document(config=config))
    assert any(field in error for error in errors), errors


def test_known_settings_pass() -> None:
    config = {"processing.guarantee": "exactly_once_v2", "num.standby.replicas": 1}
    assert crd_errors(document(config=config)) == []


@pytest.mark.parametrize(
    ("autoscaling", "words"),
    [
        ({"minReplicas": 4, "maxReplicas": 2, "maxLagRecords": 10}, "at most maxReplicas"),
        ({"maxReplicas": 2}, "at least one target: targetProcessRatio (0 to 1]"),
    ],
)
def test_autoscaling_bounds_and_targets_are_refused_by_both(autoscaling: Obj, words: str) -> None:
    obj = document(autoscaling=autoscaling)
    errors = crd_errors(obj)
    assert any(words in error for error in errors), errors
    refused = model_error(obj)
    assert refused.field.startswith("spec.autoscaling"), refused
    assert words in str(refused), refused


def test_a_complete_autoscaling_policy_passes_both() -> None:
    policy = {"minReplicas": 1, "maxReplicas": 6, "targetProcessRatio": 0.7, "maxLagSeconds": 30}
    assert crd_errors(document(autoscaling=policy)) == []
    parse_app(document(autoscaling=policy))
    too_busy = document(autoscaling={**policy, "targetProcessRatio": 1.5})
    assert crd_errors(too_busy), "targetProcessRatio above 1"


@pytest.mark.parametrize(
    ("resources", "words"),
    [
        ({"requests": {"nvidia.com/gpu": "1"}}, "requests.nvidia.com/gpu 1: an extended resource"),
        (
            {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2"}},
            "needs a limit equal to it",
        ),
        ({"limits": {"example.com/fpga": "500m"}}, "limits.example.com/fpga 500m: an extended"),
        ({"requests": {"hugepages-2Mi": "64Mi", "memory": "1Gi"}}, "needs a limit equal to it"),
        ({"limits": {"hugepages-2Mi": "64Mi"}}, "hugepages-<size> needs a cpu or memory"),
    ],
)
def test_resources_no_pod_can_have_are_refused_naming_the_field(resources: Obj, words: str) -> None:
    """Issue 38: the StatefulSet controller met these in every pod it tried to create."""
    refused = model_error(document(resources=resources))
    assert refused.field.startswith("spec.resources"), refused
    assert words in str(refused), refused


def test_resources_a_pod_can_have_pass_and_the_crd_holds_the_same_rules() -> None:
    parse_app(
        document(resources={"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}})
    )
    parse_app(
        document(resources={"limits": {"nvidia.com/gpu": "2", "hugepages-2Mi": "64Mi", "cpu": "1"}})
    )
    parse_app(document(resources={"requests": {"cpu": "500m"}, "limits": {"cpu": "1"}}))
    rules = schema()["properties"]["spec"]["properties"]["resources"]["x-kubernetes-validations"]
    messages = " ".join(rule["message"] for rule in rules)
    for words in ("needs a limit equal to it", "takes a whole number", "needs a cpu or memory"):
        assert words in messages
