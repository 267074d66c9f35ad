"""The CRD: generated from the pydantic model, committed as generated, valid, and in
agreement with the runtime's own validation (StreamsConfig, the spec model)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import cel
import kubernetes_validate
import pytest

from eddyline_operator.crd import CRD_FILE_NAME, OUTPUT_DIRS, generate_crd, render_crd
from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.errors import ConfigError
from eddyline_runtime.spec import STREAMS_CONFIG_SCHEMA, ManifestError, parse_manifest

ROOT = Path(__file__).resolve().parents[3]


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


@pytest.mark.parametrize("directory", OUTPUT_DIRS)
def test_committed_crds_are_what_the_model_generates(directory: str) -> None:
    committed = (ROOT / directory / CRD_FILE_NAME).read_text(encoding="utf-8")
    assert committed == render_crd(), f"{directory}/{CRD_FILE_NAME} is stale: run `make crds`"


def test_the_crd_is_a_valid_kubernetes_object() -> None:
    assert kubernetes_validate.validate(generate_crd(), "1.32", strict=True) == "1.32"


def test_the_crd_names_scale_status_and_printer_columns() -> None:
    version = generate_crd()["spec"]["versions"][0]
    assert generate_crd()["spec"]["names"]["shortNames"] == ["sapp"]
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    assert "status" in version["subresources"]
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Replicas",
        "Ready",
        "Phase",
        "Revision",
        "Age",
    ]


def _walk(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, node)]
    for name, child in node.get("properties", {}).items():
        found.extend(_walk(child, f"{path}.{name}"))
    if isinstance(node.get("additionalProperties"), dict):
        found.extend(_walk(node["additionalProperties"], f"{path}[*]"))
    if "items" in node:
        found.extend(_walk(node["items"], f"{path}[]"))
    return found


def test_the_schema_is_structural() -> None:
    """Every node has a type, and nothing a structural schema forbids is left over."""
    for path, node in _walk(_schema()):
        # A node that keeps whatever it holds needs no type (spec.config's values).
        if not node.get("x-kubernetes-preserve-unknown-fields"):
            assert "type" in node, f"{path} has no type"
        for forbidden in ("$ref", "anyOf", "title", "const", "$defs"):
            assert forbidden not in node, f"{path} carries {forbidden}"
        assert node.get("additionalProperties") is not False, path


def test_config_defaults_are_the_runtime_defaults() -> None:
    runtime = StreamsConfig.from_properties({})
    dumped = {
        key: getattr(runtime, key.replace(".", "_")) for key in STREAMS_CONFIG_SCHEMA["properties"]
    }
    for key, prop in STREAMS_CONFIG_SCHEMA["properties"].items():
        if "default" in prop:
            assert dumped[key] == prop["default"], key


@pytest.mark.parametrize("key", sorted(STREAMS_CONFIG_SCHEMA["properties"]))
def test_config_schema_and_streams_config_agree_on_bounds_and_enums(key: str) -> None:
    prop = STREAMS_CONFIG_SCHEMA["properties"][key]
    if "minimum" in prop:
        StreamsConfig.from_properties({key: prop["minimum"]})
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            StreamsConfig.from_properties({key: prop["minimum"] - 1})
    for value in prop.get("enum", ()):
        StreamsConfig.from_properties({key: value})
    if "enum" in prop:
        with pytest.raises(ConfigError):
            StreamsConfig.from_properties({key: "SOMETHING_ELSE"})


def test_every_kafka_setting_a_cluster_needs_is_in_the_schema() -> None:
    wanted = {
        "processing.guarantee",
        "commit.interval.ms",
        "default.state.isolation.level",
        "statestore.uncommitted.max.bytes",
        "statestore.cache.max.bytes",
        "max.task.idle.ms",
        "num.standby.replicas",
        "automatic.state.relocation",
        "acceptable.recovery.lag",
        "max.warmup.replicas",
    }
    assert wanted <= set(STREAMS_CONFIG_SCHEMA["properties"])


def _rules(path: str) -> list[dict[str, str]]:
    for found, node in _walk(_schema()):
        if found == path:
            rules: list[dict[str, str]] = node.get("x-kubernetes-validations", [])
            return rules
    raise AssertionError(path)


def _passes(path: str, value: Any, old: Any = None) -> bool:
    results = []
    for rule in _rules(path):
        if "oldSelf" in rule["rule"] and old is None:
            continue  # transition rules run on updates only
        context = {"self": value} if old is None else {"self": value, "oldSelf": old}
        results.append(bool(cel.evaluate(rule["rule"], context)))
    return all(results)


def test_cel_refuses_a_secret_without_kafka() -> None:
    assert _passes(".spec.log", {"url": "kafka://k:9092", "secretName": "kafka-auth"})
    assert not _passes(".spec.log", {"url": "sqlite:///x.db", "secretName": "kafka-auth"})
    assert _passes(".spec.log", {"url": "sqlite:///x.db"})


def test_cel_keeps_storage_immutable_on_updates_only() -> None:
    storage = {"size": "1Gi", "logSize": "1Gi", "whenDeleted": "Retain"}
    assert _passes(".spec.storage", storage)
    assert _passes(".spec.storage", storage, old=storage)
    assert not _passes(".spec.storage", {**storage, "size": "2Gi"}, old=storage)
    assert not _passes(".spec.storage", {**storage, "storageClassName": "fast"}, old=storage)


def test_cel_refuses_required_zone_spread_on_the_embedded_log() -> None:
    spec = {"log": {"url": "sqlite:///x.db"}, "standbyPlacement": {"spread": "Required"}}
    assert not _passes(".spec", spec)
    assert _passes(".spec", {**spec, "log": {"url": "kafka://k:9092"}})
    assert _passes(".spec", {**spec, "standbyPlacement": {"spread": "Preferred"}})


def test_cel_limits_the_name_length() -> None:
    assert _passes("", {"metadata": {"name": "a" * 47}, "spec": {}})
    assert not _passes("", {"metadata": {"name": "a" * 48}, "spec": {}})


def test_the_model_refuses_what_cel_refuses() -> None:
    document: dict[str, Any] = {
        "apiVersion": "eddyline.dev/v1alpha1",
        "kind": "StreamApp",
        "metadata": {"name": "wc"},
        "spec": {
            "topology": {"ref": "wordcount:topology"},
            "log": {"url": "sqlite:///x.db"},
            "standbyPlacement": {"spread": "Required"},
        },
    }
    with pytest.raises(ManifestError, match=r"standbyPlacement\.spread"):
        parse_manifest(document)
    secret = copy.deepcopy(document)
    secret["spec"]["standbyPlacement"] = {}
    secret["spec"]["log"]["secretName"] = "kafka-auth"
    with pytest.raises(ManifestError, match="secretName"):
        parse_manifest(secret)


def test_every_default_passes_its_own_rules_as_written() -> None:
    """kube-apiserver refuses a CRD whose default fails the CEL rules of its own node, and it
    checks the default as written, without the defaults of the fields inside, transition
    rules too with ``oldSelf`` the same default (a real server refused `restore: {}` against
    `self.when != ...` and `storage: {}` against `self.size == oldSelf.size`: "no such key")."""
    for path, node in _walk(_schema()):
        if "default" not in node:
            continue
        for rule in node.get("x-kubernetes-validations", []):
            context = {"self": node["default"], "oldSelf": node["default"]}
            try:
                passed = cel.evaluate(rule["rule"], context)
            except (RuntimeError, KeyError, ValueError, TypeError) as error:
                raise AssertionError(
                    f"{path}: {rule['rule']} fails on the default: {error}"
                ) from None
            assert passed is True, f"{path}: the default {node['default']} fails {rule['rule']}"
