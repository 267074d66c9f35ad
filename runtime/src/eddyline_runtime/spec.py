"""The StreamApp resource: one pydantic model, the source of truth for every reader.

The operator generates the CRD schema from it and parses cluster objects with
it; ``eddyline run MANIFEST`` parses local manifests with it. It lives in the
runtime package so both sides import the same definition.

A minimal manifest::

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

An invalid manifest raises :class:`ManifestError`, naming the field by its
path (``spec.config."processing.guarantee"``) and what it accepts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.errors import ConfigError, EddylineError

API_VERSION = "eddyline.dev/v1alpha1"
KIND = "StreamApp"
# Kubernetes object names (RFC 1123 labels: pods and services derive from it).
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
_TOPOLOGY_REFERENCE = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"


class ManifestError(EddylineError, ValueError):
    """A StreamApp manifest that cannot be accepted; ``field`` is its path."""

    def __init__(self, source: str, field: str, problem: str) -> None:
        self.field = field
        super().__init__(f"{source}: {field}: {problem}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ObjectMeta(_Strict):
    name: str = Field(
        pattern=_DNS_LABEL,
        description="a DNS label (at most 63 lowercase letters, digits and '-')",
    )
    namespace: str | None = Field(default=None, pattern=_DNS_LABEL)
    labels: dict[str, str] = Field(default_factory=dict)


class LogSpec(_Strict):
    url: str = Field(
        default="sqlite:///.eddyline-state/log.db",
        description="where topics live; sqlite:///path is the embedded log",
    )


class StreamAppSpec(_Strict):
    topology: str = Field(
        pattern=_TOPOLOGY_REFERENCE,
        description="a module:function reference to the function that builds the topology",
    )
    image: str | None = Field(default=None, description="the image holding the topology")
    replicas: int = Field(default=1, ge=1, le=1000)
    zones: list[str] = Field(
        default_factory=list,
        description="zones to spread replicas over in local runs (replica i gets zone "
        "i mod len(zones)); on Kubernetes the nodes' topology.kubernetes.io/zone is used",
    )
    log: LogSpec = Field(default_factory=LogSpec)
    config: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="Kafka Streams settings by their names"
    )

    @field_validator("config")
    @classmethod
    def _known_settings(
        cls, config: dict[str, str | int | float | bool]
    ) -> dict[str, str | int | float | bool]:
        StreamsConfig.from_properties(config)  # raises ConfigError naming the key
        return config

    def streams_config(self, *, application_id: str) -> StreamsConfig:
        return StreamsConfig.from_properties({"application.id": application_id, **self.config})


class StreamApp(_Strict):
    api_version: Literal["eddyline.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["StreamApp"]
    metadata: ObjectMeta
    spec: StreamAppSpec

    def streams_config(self) -> StreamsConfig:
        """The runtime config: the spec's settings, with application.id = the app's name."""
        return self.spec.streams_config(application_id=self.metadata.name)


def parse_manifest(document: Any, *, source: str = "manifest") -> StreamApp:
    """Validate one parsed YAML/JSON document as a StreamApp."""
    if not isinstance(document, dict):
        raise ManifestError(source, "(document)", "expected a mapping with apiVersion, kind, ...")
    try:
        return StreamApp.model_validate(document)
    except ValidationError as exc:
        raise _manifest_error(source, exc) from None


def load_manifest(path: Path | str) -> StreamApp:
    """Read a StreamApp from a YAML file."""
    path = Path(path)
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ManifestError(str(path), "(file)", "no such file") from None
    except yaml.YAMLError as exc:
        raise ManifestError(str(path), "(file)", f"not valid YAML: {exc}") from None
    return parse_manifest(document, source=str(path))


def _manifest_error(source: str, exc: ValidationError) -> ManifestError:
    first = exc.errors()[0]
    path = ".".join(_path_part(part) for part in first["loc"]) or "(document)"
    original = first.get("ctx", {}).get("error")
    if isinstance(original, ConfigError):
        return ManifestError(source, f'{path}."{original.key}"', str(original))
    if first["type"] == "literal_error":
        return ManifestError(source, path, f"must be {first['ctx']['expected']}")
    if first["type"] == "string_pattern_mismatch":
        field_info = _field_description(first["loc"])
        return ManifestError(
            source, path, f"{first['input']!r} is not {field_info or first['msg']}"
        )
    if first["type"] == "extra_forbidden":
        return ManifestError(source, path, "unknown field; check the spelling")
    problem = first["msg"]
    if problem.startswith("Input should be greater") or problem.startswith("Input should be less"):
        problem = "must be a number " + problem.removeprefix("Input should be ")
    return ManifestError(source, path, problem)


def _path_part(part: int | str) -> str:
    return f"[{part}]" if isinstance(part, int) else str(part)


def _field_description(location: tuple[int | str, ...]) -> str | None:
    """The description of the field at ``location``, to say what it accepts."""
    model: type[BaseModel] = StreamApp
    description = None
    for part in location:
        fields = {f.alias or name: f for name, f in model.model_fields.items()}
        field = fields.get(str(part))
        if field is None:
            return None
        description = field.description
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
    return description
