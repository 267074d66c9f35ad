"""The StreamApp model: valid manifests parse; invalid ones name the field and the way out."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from eddyline_runtime.config import IsolationLevel
from eddyline_runtime.errors import ConfigError
from eddyline_runtime.spec import ManifestError, load_manifest, parse_manifest

MANIFEST = """
apiVersion: eddyline.dev/v1alpha1
kind: StreamApp
metadata:
  name: word-count
spec:
  topology: examples.word_count:build
  log:
    url: sqlite:///.eddyline-state/log.db
  config:
    processing.guarantee: exactly_once_v2
    statestore.cache.max.bytes: 10485760
"""
VALID: dict[str, Any] = {
    "apiVersion": "eddyline.dev/v1alpha1",
    "kind": "StreamApp",
    "metadata": {"name": "word-count"},
    "spec": {"topology": "examples.word_count:build"},
}


def test_a_yaml_manifest_parses_into_a_runtime_config(tmp_path: Path) -> None:
    (tmp_path / "app.yaml").write_text(MANIFEST)
    app = load_manifest(tmp_path / "app.yaml")
    assert app.metadata.name == "word-count"
    config = app.streams_config()
    assert config.application_id == "word-count"
    assert config.effective_isolation_level is IsolationLevel.READ_COMMITTED
    assert config.statestore_cache_max_bytes == 10 * 1024 * 1024


def test_defaults_fill_what_a_minimal_manifest_leaves_out() -> None:
    app = parse_manifest(VALID)
    assert app.spec.replicas == 1
    assert app.spec.log.url.startswith("sqlite:///")


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("kind",), "Streamapp", "kind: must be 'StreamApp'"),
        (
            ("metadata", "name"),
            "Word_Count",
            "metadata.name: 'Word_Count' is not a DNS-1035 label such as word-count",
        ),
        (
            ("spec", "topology"),
            "word_count",
            "spec.topology.ref: 'word_count' is not a module:function",
        ),
        (("spec", "replicas"), -1, "spec.replicas: must be a number greater than or equal to 0"),
        (("spec", "replica"), 2, "spec.replica: unknown field"),
        (
            ("spec", "config"),
            {"processing.guarantee": "exactly_once"},
            "spec.config.\"processing.guarantee\": invalid value 'exactly_once'",
        ),
    ],
)
def test_invalid_fields_are_named_with_what_they_accept(
    path: tuple[str, ...], value: object, message: str
) -> None:
    document = copy.deepcopy(VALID)
    target = document
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    with pytest.raises(ManifestError) as error:
        parse_manifest(document, source="app.yaml")
    assert f"app.yaml: {message}" in str(error.value)


def test_the_config_error_lists_the_accepted_values() -> None:
    document = copy.deepcopy(VALID)
    document["spec"]["config"] = {"default.state.isolation.level": "SNAPSHOT"}
    with pytest.raises(ManifestError, match="'READ_UNCOMMITTED', 'READ_COMMITTED'"):
        parse_manifest(document)


def test_unreadable_files_say_so(tmp_path: Path) -> None:
    broken = tmp_path / "app.yaml"
    broken.write_text("spec: [unclosed")
    with pytest.raises(ManifestError, match="not valid YAML"):
        load_manifest(broken)
    with pytest.raises(ManifestError, match="no such file"):
        load_manifest(tmp_path / "missing.yaml")


def test_a_spec_is_validated_without_the_environment_and_a_process_applies_it_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The operator parses a spec whatever its own EDDYLINE_* variables say; a process's
    config is the parsed settings with its environment over them."""
    monkeypatch.setenv("EDDYLINE_NUM_STREAM_THREADS", "999")
    document = copy.deepcopy(VALID)
    document["spec"]["config"] = {"num.stream.threads": 2}
    app = parse_manifest(document)
    assert app.settings.num_stream_threads == 2
    assert app.settings.application_id == "word-count"
    with pytest.raises(ConfigError, match="EDDYLINE_NUM_STREAM_THREADS"):
        app.streams_config()
    monkeypatch.setenv("EDDYLINE_NUM_STREAM_THREADS", "3")
    assert app.streams_config().num_stream_threads == 3
    assert app.streams_config(environ={}) is app.settings


def test_a_config_file_over_the_manifest_is_validated_naming_the_file() -> None:
    app = parse_manifest(copy.deepcopy(VALID))
    changed = app.with_config({"num.standby.replicas": 2}, source="extra.properties")
    assert changed.settings.num_standby_replicas == 2
    with pytest.raises(ManifestError, match=r'extra\.properties: spec\.config\."max\.task'):
        app.with_config({"max.task.idle.ms": -7}, source="extra.properties")


def test_a_copy_with_a_new_spec_carries_its_own_settings() -> None:
    app = parse_manifest(copy.deepcopy(VALID))
    spec = app.spec.model_copy(update={"config": {"num.standby.replicas": 2}})
    assert app.model_copy(update={"spec": spec}).settings.num_standby_replicas == 2
    assert app.settings.num_standby_replicas == 0


def test_a_streamapp_may_require_explicit_names_in_its_config() -> None:
    """KIP-1111's setting is a cluster setting: spec.config carries it to the pods."""
    app = parse_manifest(
        {
            **VALID,
            "spec": {**VALID["spec"], "config": {"ensure.explicit.internal.resource.naming": True}},
        }
    )
    assert app.streams_config().ensure_explicit_internal_resource_naming
    assert not parse_manifest(VALID).streams_config().ensure_explicit_internal_resource_naming
