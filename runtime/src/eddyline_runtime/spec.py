"""The StreamApp resource: one pydantic model, the source of truth for every reader.

The operator generates the CRD schema from it (``make crds``) and parses
cluster objects with it; ``eddyline run MANIFEST`` parses local manifests with
it. It lives in the runtime package so both sides import the same definition.

A minimal manifest::

    apiVersion: eddyline.dev/v1alpha1
    kind: StreamApp
    metadata:
      name: word-count
    spec:
      topology: examples.word_count:build      # or {ref: ..., revision: "2"}
      log:
        url: sqlite:///.eddyline-state/log.db
      config:
        processing.guarantee: exactly_once_v2

An invalid manifest raises :class:`ManifestError`, naming the field by its
path (``spec.config."processing.guarantee"``) and what it accepts.

What only a cluster reads (image, storage, standby placement, resources,
suspend) has defaults, so local manifests need none of it. Constraints that
the API server must enforce too carry their schema here: ``pattern``/``ge``
become the CRD's patterns and minimums, and ``x-kubernetes-validations``
(CEL) hold the cross-field rules. ``spec.config``'s schema comes from
``StreamsConfig``'s fields (config.py), and its settings are validated once per
parse, as written, never with the environment (:attr:`StreamApp.settings`).
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal, Self

import yaml
from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from eddyline_runtime.config import (
    CLUSTER_SETTINGS,
    StreamsConfig,
    cluster_settings_schema,
    unknown_setting_error,
)
from eddyline_runtime.errors import ConfigError, EddylineError
from eddyline_runtime.resource_names import GeneratedName, ResourceKind

API_VERSION = "eddyline.dev/v1alpha1"
GROUP = "eddyline.dev"
VERSION = "v1alpha1"
KIND = "StreamApp"
PLURAL = "streamapps"
SHORT_NAME = "sapp"
# Kubernetes object names (RFC 1123 labels: pods and services derive from it).
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
# The app's own name: its Services take it, and Service names are RFC 1035 labels (a letter
# first); the length is checked apart (MAX_NAME_LENGTH).
APP_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
# RFC 1123 subdomains (Secret and claim names).
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# A label key: an optional DNS-subdomain prefix and "/", then a name of at most 63 characters.
_LABEL_KEY = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
# A label key's prefix holds at most 253 characters (a DNS subdomain).
MAX_LABEL_PREFIX = 253
_TOPOLOGY_REFERENCE = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"
# A revision becomes a label value: at most 63 characters, alphanumeric at both ends.
_REVISION = r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
# Log URLs the runtime opens: the embedded log, or Kafka bootstrap servers.
_LOG_URL = r"^(sqlite:///.+|kafka://[^,/\s]+(,[^,/\s]+)*)$"
# A non-negative Kubernetes quantity (no sign: "-1Gi" is refused here, not by the kubelet).
_QUANTITY = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$"
# A quantity above zero (a claim's size: "0" is refused by the API server, and a claim
# template cannot change afterwards).
_POSITIVE_QUANTITY = (
    r"^([0-9]*[1-9][0-9]*(\.[0-9]*)?|[0-9]*\.[0-9]*[1-9][0-9]*)"
    r"([eE][0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$"
)
# A resource name: a standard one, or a domain-qualified extended resource.
_RESOURCE_NAME = (
    r"^(cpu|memory|ephemeral-storage|hugepages-[0-9]+(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?|"
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$"
)
# An image reference: whatever the registry accepts, but never whitespace.
_IMAGE = r"^\S+$"
# Pods are named <name>-<ordinal> and carry it in a label (at most 63 characters), and
# the Services <name>-headless / <name>-query: 47 leaves room for every suffix.
MAX_NAME_LENGTH = 47
# With restores on, Jobs are named <name>-restore-<10 hex> and their pods carry that name
# in the job-name label (at most 63 characters): 44 leaves room.
MAX_NAME_LENGTH_WITH_RESTORE = 44
DEFAULT_ZONE_KEY = "topology.kubernetes.io/zone"


class ManifestError(EddylineError, ValueError):
    """A StreamApp manifest that cannot be accepted; ``field`` is its path."""

    def __init__(self, source: str, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{source}: {field}: {problem}")


def _rules(*rules: tuple[str, str]) -> dict[str, Any]:
    """CEL rules for the CRD (``x-kubernetes-validations``); pydantic checks the same."""
    return {"x-kubernetes-validations": [{"rule": r, "message": m} for r, m in rules]}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ObjectMeta(_Strict):
    name: str = Field(
        pattern=APP_NAME_PATTERN,
        max_length=63,
        description="a DNS-1035 label (lowercase letters, digits and '-', a letter first): "
        "the app's Services take it",
    )
    namespace: str | None = Field(default=None, pattern=_DNS_LABEL)
    labels: dict[str, str] = Field(default_factory=dict)


class PullPolicy(enum.StrEnum):
    ALWAYS = "Always"
    IF_NOT_PRESENT = "IfNotPresent"
    NEVER = "Never"


class SpreadPolicy(enum.StrEnum):
    """How hard the scheduler must spread replicas over zones."""

    REQUIRED = "Required"  # DoNotSchedule: a pod waits rather than share a zone
    PREFERRED = "Preferred"  # ScheduleAnyway: spread when possible


class ClaimRetention(enum.StrEnum):
    """What happens to the state claims when the StreamApp is deleted."""

    RETAIN = "Retain"
    DELETE = "Delete"


class BackfillFrom(enum.StrEnum):
    """Where a backfill's history starts."""

    # The first offset the log still holds of every input partition (docs/backfill.md: an
    # earlier start that retention deleted cannot be read).
    EARLIEST_RETAINED = "EarliestRetained"
    # Each input partition's first record at or after ``fromTimestamp`` (Kafka's
    # offsetsForTimes, as its application reset tool's --to-datetime finds it).
    TIMESTAMP = "Timestamp"


class UpgradeStrategy(enum.StrEnum):
    """How a full-cluster topology upgrade replaces the pods (docs/operator.md, "Upgrade
    strategies")."""

    # Processing pauses on every pod, which keep serving their copies read-only; the pods
    # are replaced one at a time, each while the others' copies cover it: queries are
    # answered throughout (docs/queries.md).
    ROLLING = "Rolling"
    # Every pod stops at once after its final commit and the new revision's pods start
    # together: one pod start instead of one per pod, and no query is answered from the
    # first stop until the new pods serve (the upgrade before issue 36).
    RECREATE = "Recreate"


# What the CRD's rules and the model say of a backfill's start, in the same words.
_TIMESTAMP_MISSING = "from: Timestamp needs fromTimestamp (RFC 3339, e.g. 2026-11-01T00:00:00Z)"
_TIMESTAMP_UNUSED = (
    "fromTimestamp is read only with from: Timestamp; set from: Timestamp, or drop fromTimestamp"
)


class BackfillSpec(_Strict):
    """Stores of a new topology revision built from the input's history by a Spark Job during
    the upgrade to that revision (docs/backfill.md, "The operator's side")."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            ("self.from != 'Timestamp' || has(self.fromTimestamp)", _TIMESTAMP_MISSING),
            ("!has(self.fromTimestamp) || self.from == 'Timestamp'", _TIMESTAMP_UNUSED),
        )
    )

    stores: list[str] = Field(
        min_length=1,
        description="stores of the new revision to build from history; each must be new in "
        "that revision (no store of that name runs before the upgrade), in its one "
        "sub-topology, and logged",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    from_: BackfillFrom = Field(
        default=BackfillFrom.EARLIEST_RETAINED,
        alias="from",
        description="where the history starts: EarliestRetained (the first offset the log "
        "still holds) or Timestamp (each input partition's first record at or after "
        "fromTimestamp)",
    )
    from_timestamp: AwareDatetime | None = Field(
        default=None,
        alias="fromTimestamp",
        description="with from: Timestamp, where the history starts: an RFC 3339 time with "
        "its zone (2026-11-01T00:00:00Z)",
    )

    @model_validator(mode="after")
    def _timestamp_with_its_from(self) -> Self:
        timestamped = self.from_ is BackfillFrom.TIMESTAMP
        if timestamped and self.from_timestamp is None:
            raise ValueError(_TIMESTAMP_MISSING)
        if not timestamped and self.from_timestamp is not None:
            raise ValueError(_TIMESTAMP_UNUSED)
        return self

    @field_validator("stores")
    @classmethod
    def _unique_names(cls, stores: list[str]) -> list[str]:
        doubled = sorted({store for store in stores if stores.count(store) > 1})
        if doubled:
            raise ValueError(f"names {', '.join(repr(s) for s in doubled)} more than once")
        blank = [store for store in stores if not store.strip()]
        if blank:
            raise ValueError("a store name is empty")
        return stores


class TopologySpec(_Strict):
    ref: str = Field(
        pattern=_TOPOLOGY_REFERENCE,
        description="a module:function reference to the function that builds the topology "
        "(imported inside the app's image, never by the operator)",
    )
    revision: str = Field(
        default="1",
        pattern=_REVISION,
        description="the topology's revision; changing it is a topology change (every pod "
        "restarts together, state relocates per KIP-816) instead of a rolling config change",
    )
    upgrade_deadline_seconds: int = Field(
        default=300,
        alias="upgradeDeadlineSeconds",
        ge=1,
        description="how long the pods of a new topology revision may take to be ready (every "
        "active task restored) before the upgrade is rolled back to the revision that ran",
    )
    upgrade_strategy: UpgradeStrategy = Field(
        default=UpgradeStrategy.ROLLING,
        alias="upgradeStrategy",
        description="how an upgrade to a new revision replaces the pods: Rolling (processing "
        "pauses, pods are replaced one at a time and queries are answered throughout) or "
        "Recreate (every pod stops at once and the new ones start together: faster with many "
        "pods, no query answered in between); read once, when the upgrade begins",
    )
    backfill: BackfillSpec | None = Field(
        default=None,
        description="stores of this revision to build from the input's history (a Spark Job) "
        "when an upgrade to it begins; read once, at that moment",
    )


class LogSpec(_Strict):
    model_config = ConfigDict(
        json_schema_extra=_rules(
            (
                "!has(self.secretName) || self.url.startsWith('kafka://')",
                "secretName holds Kafka client settings: it needs a kafka:// url",
            )
        )
    )
    url: str = Field(
        default="sqlite:///.eddyline-state/log.db",
        pattern=_LOG_URL,
        description="where topics live: sqlite:///path is the embedded log (one node only), "
        "kafka://host:port,host:port the production log",
    )
    secret_name: str | None = Field(
        default=None,
        alias="secretName",
        pattern=_DNS_SUBDOMAIN,
        description="a Secret whose keys are Kafka client settings (sasl.username, ...)",
    )

    @model_validator(mode="after")
    def _secret_needs_kafka(self) -> LogSpec:
        if self.secret_name is not None and not self.url.startswith("kafka://"):
            raise ValueError("secretName holds Kafka client settings: it needs a kafka:// url")
        return self


class StandbyPlacement(_Strict):
    model_config = ConfigDict(
        json_schema_extra=_rules(
            (
                # has(): the API server checks the rule on this object's own default too.
                "!has(self.topologyKey) || "
                f"!self.topologyKey.matches(r'^[^/]{{{MAX_LABEL_PREFIX + 1},}}/')",
                f"topologyKey's prefix (before '/') must be at most {MAX_LABEL_PREFIX} "
                "characters: it is a DNS subdomain",
            )
        )
    )
    topology_key: str = Field(
        default=DEFAULT_ZONE_KEY,
        alias="topologyKey",
        pattern=_LABEL_KEY,
        description="the node label that names a zone; a task's standby lands in another zone "
        "than its active copy",
    )

    @field_validator("topology_key")
    @classmethod
    def _prefix_length(cls, key: str) -> str:
        prefix, slash, _ = key.rpartition("/")
        if slash and len(prefix) > MAX_LABEL_PREFIX:
            raise ValueError(
                f"the prefix before '/' has {len(prefix)} characters; at most "
                f"{MAX_LABEL_PREFIX} (a DNS subdomain such as topology.kubernetes.io)"
            )
        return key

    spread: SpreadPolicy = Field(
        default=SpreadPolicy.PREFERRED,
        description="Required: a pod stays Pending rather than share a zone; Preferred: spread "
        "when the nodes allow",
    )


class StorageSpec(_Strict):
    model_config = ConfigDict(
        json_schema_extra=_rules(
            (
                # has(): kube-apiserver checks the `storage: {}` default as written (before
                # `size` is defaulted inside it), transition rules included.
                "has(self.size) == has(oldSelf.size)"
                " && (!has(self.size) || self.size == oldSelf.size)",
                "size is immutable: a StatefulSet's claim templates cannot change "
                "(resize the claims themselves)",
            ),
            (
                "has(self.storageClassName) == has(oldSelf.storageClassName) && "
                "(!has(self.storageClassName) || "
                "self.storageClassName == oldSelf.storageClassName)",
                "storageClassName is immutable: a StatefulSet's claim templates cannot change",
            ),
        )
    )
    size: str = Field(
        default="1Gi",
        pattern=_POSITIVE_QUANTITY,
        description="each pod's claim for state.dir (a quantity such as 10Gi)",
    )
    storage_class_name: str | None = Field(
        default=None,
        alias="storageClassName",
        pattern=_DNS_SUBDOMAIN,
        description="the claims' storage class (default: the cluster's default class)",
    )
    log_size: str = Field(
        default="1Gi",
        alias="logSize",
        pattern=_POSITIVE_QUANTITY,
        description="the shared claim holding the embedded sqlite log (unused with Kafka)",
    )
    when_deleted: ClaimRetention = Field(
        default=ClaimRetention.RETAIN,
        alias="whenDeleted",
        description="Retain keeps the claims when the StreamApp is deleted (state is "
        "expensive to rebuild); Delete removes them",
    )


# Resource kinds a pod may name (a bound keeps the CEL rules' cost estimate small).
_MAX_RESOURCES = 16
_QUANTITY_MAP = Annotated[
    dict[str, str],
    WithJsonSchema(
        {
            "type": "object",
            "maxProperties": _MAX_RESOURCES,
            "additionalProperties": {"type": "string", "pattern": _QUANTITY},
            "x-kubernetes-validations": [
                {
                    "rule": f"self.all(k, k.matches(r'{_RESOURCE_NAME}'))",
                    "message": "resource names must be cpu, memory, ephemeral-storage, "
                    "hugepages-<size> or a domain-qualified name such as nvidia.com/gpu",
                }
            ],
        }
    ),
]


_NOT_OVERCOMMITTED = (
    "an extended resource (such as nvidia.com/gpu) or hugepages-<size> request needs a "
    "limit equal to it (limits.<name>): these cannot be overcommitted"
)
_WHOLE_EXTENDED = (
    "an extended resource (a domain-qualified name such as nvidia.com/gpu) takes a whole "
    "number such as 1, not a fraction"
)
_HUGEPAGES_NEED = "hugepages-<size> needs a cpu or memory request or limit beside it"


class ResourcesSpec(_Strict):
    model_config = ConfigDict(
        json_schema_extra=_rules(
            (
                # quantity() is the Kubernetes CEL library (API servers from 1.29 on); it is
                # called only for a resource named in both maps.
                "!has(self.requests) || !has(self.limits) || self.requests.all(k, "
                "!(k in self.limits) || "
                "quantity(self.requests[k]).compareTo(quantity(self.limits[k])) <= 0)",
                "each request must be at most its limit (requests.cpu <= limits.cpu, ...)",
            ),
            # What the API server refuses in a pod, refused here instead of by the
            # StatefulSet controller for every pod (issue 38): extended resources and
            # hugepages cannot be overcommitted, extended resources come whole, and
            # hugepages need a cpu or memory request or limit beside them.
            (
                "!has(self.requests) || self.requests.all(k, "
                "!(k.contains('/') || k.startsWith('hugepages-')) || "
                "(has(self.limits) && k in self.limits && "
                "quantity(self.requests[k]).compareTo(quantity(self.limits[k])) == 0))",
                _NOT_OVERCOMMITTED,
            ),
            (
                "(!has(self.requests) || self.requests.all(k, "
                "!k.contains('/') || quantity(self.requests[k]).isInteger())) && "
                "(!has(self.limits) || self.limits.all(k, "
                "!k.contains('/') || quantity(self.limits[k]).isInteger()))",
                _WHOLE_EXTENDED,
            ),
            (
                "!((has(self.requests) && self.requests.exists(k, k.startsWith('hugepages-')))"
                " || (has(self.limits) && self.limits.exists(k, k.startsWith('hugepages-'))))"
                " || (has(self.requests) && ('cpu' in self.requests || 'memory' in self.requests))"
                " || (has(self.limits) && ('cpu' in self.limits || 'memory' in self.limits))",
                _HUGEPAGES_NEED,
            ),
        )
    )
    requests: _QUANTITY_MAP = Field(
        default_factory=dict, description="cpu, memory, ... each pod asks for"
    )
    limits: _QUANTITY_MAP = Field(default_factory=dict, description="the most each pod may use")

    @field_validator("requests", "limits")
    @classmethod
    def _quantities(cls, values: dict[str, str]) -> dict[str, str]:
        if len(values) > _MAX_RESOURCES:
            raise ValueError(f"at most {_MAX_RESOURCES} resources")
        for name, quantity in values.items():
            if not re.match(_RESOURCE_NAME, name):
                raise ValueError(f"{name!r} is not a resource name: use {RESOURCE_NAMES}")
            if not re.match(_QUANTITY, quantity):
                raise ValueError(f"{name}: {quantity!r} is not {FORMS[_QUANTITY]}")
        return values

    @model_validator(mode="after")
    def _requests_within_limits(self) -> ResourcesSpec:
        for name, request in self.requests.items():
            limit = self.limits.get(name)
            if limit is not None and quantity_value(request) > quantity_value(limit):
                raise ValueError(
                    f"requests.{name} {request} is above limits.{name} {limit}: a request "
                    "must be at most its limit"
                )
            if _not_overcommittable(name) and (
                limit is None or quantity_value(limit) != quantity_value(request)
            ):
                raise ValueError(f"requests.{name} {request}: {_NOT_OVERCOMMITTED}")
        for where, values in (("requests", self.requests), ("limits", self.limits)):
            for name, amount in values.items():
                value = quantity_value(amount)
                if "/" in name and value != value.to_integral_value():
                    raise ValueError(f"{where}.{name} {amount}: {_WHOLE_EXTENDED}")
        named = {*self.requests, *self.limits}
        if any(n.startswith("hugepages-") for n in named) and not named & {"cpu", "memory"}:
            raise ValueError(_HUGEPAGES_NEED)
        return self


def _not_overcommittable(name: str) -> bool:
    """Extended resources (a domain-qualified name) and hugepages: Kubernetes wants their
    request equal to their limit."""
    return "/" in name or name.startswith("hugepages-")


# Spark masters a restore Job may use: local threads in the Job's pod, or executors on the
# cluster the Job runs in (k8s://https://host[:port]).
_SPARK_MASTER = r"^(local(\[([1-9][0-9]*|\*)\])?|k8s://https?://[^\s/]+(:[0-9]+)?/?)$"
# Spark's --executor-memory / spark.executor.memory form: a number and an optional unit.
_SPARK_MEMORY = r"^[1-9][0-9]*[kKmMgGtT]?$"

# What each pattern accepts, in words: the CRD's rules and the model's errors say this
# instead of the regex (crd.structural turns each pattern into a CEL rule with it).
FORMS: dict[str, str] = {
    _DNS_LABEL: "a DNS label: at most 63 lowercase letters, digits and '-', starting and "
    "ending with a letter or digit",
    APP_NAME_PATTERN: "a DNS-1035 label such as word-count: lowercase letters, digits and '-', "
    "starting with a letter and ending with a letter or digit",
    _DNS_SUBDOMAIN: "a DNS subdomain such as kafka-client: lowercase letters, digits, '-' and '.'",
    _LABEL_KEY: "a label key such as topology.kubernetes.io/zone: an optional DNS-subdomain "
    "prefix and '/', then at most 63 letters, digits, '-', '_' and '.'",
    _TOPOLOGY_REFERENCE: "a module:function reference such as wordcount:topology",
    _REVISION: "a revision such as 2 or v1.3: at most 63 letters, digits, '-', '_' and '.', "
    "starting and ending with a letter or digit",
    _LOG_URL: "a log URL: sqlite:///path or kafka://host:port[,host:port...]",
    _QUANTITY: "a quantity such as 10Gi or 500m",
    _POSITIVE_QUANTITY: "a quantity above zero such as 10Gi",
    _IMAGE: "an image reference such as ghcr.io/org/app:1.0, without spaces",
    _SPARK_MASTER: "a Spark master: local[*], local[N] or k8s://https://host[:port]",
    _SPARK_MEMORY: "Spark's memory form such as 1g or 512m",
}
RESOURCE_NAMES = (
    "cpu, memory, ephemeral-storage, hugepages-<size> or a domain-qualified name such as "
    "nvidia.com/gpu"
)
_QUANTITY_UNITS: dict[str, Decimal] = {
    "": Decimal(1), "m": Decimal("0.001"), "k": Decimal(10**3), "M": Decimal(10**6),
    "G": Decimal(10**9), "T": Decimal(10**12), "P": Decimal(10**15), "E": Decimal(10**18),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
    "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}  # fmt: skip


def quantity_value(quantity: str) -> Decimal:
    """A quantity (already matched against _QUANTITY) as a number, to compare two."""
    found = re.match(r"^([0-9.]+)([eE][0-9]+|[A-Za-z]*)$", quantity)
    if found is None:
        raise ValueError(f"{quantity!r} is not {FORMS[_QUANTITY]}")
    number, unit = found.groups()
    if unit[:1] in ("e", "E") and unit[1:].isdigit():
        return Decimal(number) * Decimal(10) ** int(unit[1:])
    return Decimal(number) * _QUANTITY_UNITS[unit]


class RestoreWhen(enum.StrEnum):
    """When a task whose store is missing waits for a Spark restore build instead of replaying."""

    NEVER = "Never"  # always replay the changelog record by record
    ALWAYS = "Always"  # every missing store with a non-empty changelog
    WHEN_LAG_ABOVE = "WhenLagAbove"  # only changelogs longer than restore.lagAbove records


class RestoreSpec(_Strict):
    """Spark restore Jobs the operator launches for stores that must be rebuilt."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            (
                # has(self.when): kube-apiserver checks the `restore: {}` default as written,
                # before `when` is defaulted inside it.
                "!has(self.when) || self.when != 'WhenLagAbove' || has(self.lagAbove)",
                "when WhenLagAbove needs lagAbove (changelog records)",
            )
        )
    )
    when: RestoreWhen = Field(
        default=RestoreWhen.NEVER,
        description="Never (replay changelogs), Always (a Spark build for every missing store), "
        "WhenLagAbove (only for changelogs longer than lagAbove records)",
    )
    lag_above: int | None = Field(
        default=None,
        alias="lagAbove",
        ge=0,
        description="with WhenLagAbove: changelog records above which a missing store waits "
        "for a Spark build instead of replaying",
    )
    image: str | None = Field(
        default=None,
        min_length=1,
        pattern=_IMAGE,
        description="the restore-job image (Java, PySpark and eddyline; restore.Dockerfile); "
        "default: the app's image",
    )
    master: str = Field(
        default="local[*]",
        pattern=_SPARK_MASTER,
        description="Spark master: local[*] or local[N] inside the Job's pod, or "
        "k8s://https://kubernetes.default.svc for executors on the cluster (client mode)",
    )
    executors: int = Field(default=2, ge=1, le=1000, description="executors with a k8s:// master")
    executor_cores: int = Field(default=1, ge=1, le=64, alias="executorCores")
    executor_memory: str = Field(
        default="1g",
        alias="executorMemory",
        pattern=_SPARK_MEMORY,
        description="memory per executor, Spark's form (1g, 512m)",
    )
    resources: ResourcesSpec = Field(
        default_factory=ResourcesSpec,
        description="the Job's pod (the Spark driver, and the executors with local[N])",
    )
    wait_seconds: int = Field(
        default=600,
        alias="waitSeconds",
        ge=1,
        description="how long a task waits for the build before it replays the changelog",
    )
    storage_size: str = Field(
        default="1Gi",
        alias="storageSize",
        pattern=_POSITIVE_QUANTITY,
        description="the claim shared by the Job and the pods for build output",
    )

    @model_validator(mode="after")
    def _threshold(self) -> RestoreSpec:
        if self.when is RestoreWhen.WHEN_LAG_ABOVE and self.lag_above is None:
            raise ValueError("when WhenLagAbove needs lagAbove (changelog records)")
        return self

    def wait_threshold(self) -> int:
        """Changelog records above which a missing store waits for a build; -1: never."""
        if self.when is RestoreWhen.NEVER:
            return -1
        if self.when is RestoreWhen.ALWAYS:
            return 0
        return self.lag_above or 0


class AutoscalingSpec(_Strict):
    """Lag-driven autoscaling: the operator sets spec.replicas (through the scale
    subresource) from the pods' busy share and input lag, within [minReplicas, maxReplicas]
    and never above the tasks the app can use."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            (
                # has(): the API server checks rules on the object as written.
                "!has(self.minReplicas) || self.minReplicas <= self.maxReplicas",
                "minReplicas must be at most maxReplicas",
            ),
            (
                "has(self.targetProcessRatio) || has(self.maxLagRecords) || "
                "has(self.maxLagSeconds)",
                "autoscaling needs at least one target: targetProcessRatio (0 to 1], "
                "maxLagRecords or maxLagSeconds",
            ),
        )
    )
    min_replicas: int = Field(
        default=1,
        alias="minReplicas",
        ge=1,
        le=1000,
        description="the fewest pods the autoscaler sets, at least 1 (it never scales to "
        "zero: that is spec.suspend)",
    )
    max_replicas: int = Field(
        alias="maxReplicas",
        ge=1,
        le=1000,
        description="the most pods the autoscaler sets (never more than the app's tasks)",
    )
    target_process_ratio: float | None = Field(
        default=None,
        alias="targetProcessRatio",
        gt=0,
        le=1,
        description="the mean busy share of the pods' stream threads (process-ratio) to aim "
        "at, above 0 and at most 1",
    )
    max_lag_records: int | None = Field(
        default=None,
        alias="maxLagRecords",
        ge=1,
        description="total input lag in records (records-lag summed over partitions) above "
        "which to scale out",
    )
    max_lag_seconds: float | None = Field(
        default=None,
        alias="maxLagSeconds",
        gt=0,
        description="input lag in seconds (lag records / process-rate) above which to scale out",
    )
    scale_up_stabilization_seconds: int = Field(
        default=0,
        alias="scaleUpStabilizationSeconds",
        ge=0,
        le=3600,
        description="scale out only to the lowest recommendation of this many seconds",
    )
    scale_down_stabilization_seconds: int = Field(
        default=300,
        alias="scaleDownStabilizationSeconds",
        ge=0,
        le=3600,
        description="scale in only to the highest recommendation of this many seconds",
    )

    @model_validator(mode="after")
    def _bounds_and_target(self) -> AutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"minReplicas {self.min_replicas} is above maxReplicas {self.max_replicas}: "
                "minReplicas must be at most maxReplicas"
            )
        if (
            self.target_process_ratio is None
            and self.max_lag_records is None
            and self.max_lag_seconds is None
        ):
            raise ValueError(
                "autoscaling needs at least one target: targetProcessRatio (0 to 1], "
                "maxLagRecords or maxLagSeconds"
            )
        return self


# The CRD's schema of spec.config: the settings a cluster may set, by Kafka Streams' names,
# generated from StreamsConfig's fields (config.py: cluster=True, their bounds, defaults and
# descriptions), so that the API server and the runtime read one definition.
STREAMS_CONFIG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Kafka Streams settings by their names; each pod loads them once at start",
    "properties": cluster_settings_schema(),
    "additionalProperties": False,
    # The API server keeps keys outside the properties instead of pruning them (the typed
    # properties still apply), so that the operator (refuse_unknown_cluster_settings)
    # refuses a typo by name even from a client that sends no strict field validation.
    # A map with a CEL rule naming the keys is what a real API server cannot type.
    "x-kubernetes-preserve-unknown-fields": True,
}


def refuse_unknown_cluster_settings(
    config: Mapping[str, object], *, source: str = "StreamApp"
) -> None:
    """Raise ManifestError for a ``spec.config`` key a cluster may not set.

    The keys a cluster may set are the CRD's properties (config.CLUSTER_SETTINGS); a local
    run reads every
    StreamsConfig setting (``restore.build.dir``, ``memory.limit.bytes``, ...), some of which
    the operator sets itself on a cluster. The message is StreamsConfig's own for an unknown
    setting: the known names and the closest one.
    """
    for key, value in config.items():
        if key not in CLUSTER_SETTINGS:
            error = unknown_setting_error(key, value, CLUSTER_SETTINGS)
            raise ManifestError(source, f'spec.config."{key}"', str(error))


_StreamsSettings = Annotated[
    dict[str, str | int | float | bool], WithJsonSchema(STREAMS_CONFIG_SCHEMA)
]


# The backfill Job writes its build where restore builds go, and pods ingest it from there.
BACKFILL_NEEDS_RESTORE = (
    "topology.backfill needs spec.restore.when Always or WhenLagAbove: the backfill's build "
    "goes to the restore claim, which Never does not create"
)


class StreamAppSpec(_Strict):
    model_config = ConfigDict(
        json_schema_extra=_rules(
            (
                "!self.log.url.startsWith('sqlite:') || self.standbyPlacement.spread != 'Required'",
                "standbyPlacement.spread Required needs a log every node reaches (kafka://): "
                "the embedded sqlite log pins every pod to one node",
            ),
            (
                "!has(self.topology) || !has(self.topology.backfill) || (has(self.restore) "
                "&& has(self.restore.when) && self.restore.when != 'Never')",
                BACKFILL_NEEDS_RESTORE,
            ),
        )
    )
    topology: TopologySpec = Field(
        description="the topology: {ref: module:function, revision}; a bare module:function "
        "string is accepted by local runs"
    )
    image: str | None = Field(
        default=None,
        min_length=1,
        pattern=_IMAGE,
        description="the image holding eddyline and the topology (default: the operator's "
        "runtime image)",
    )
    image_pull_policy: PullPolicy = Field(
        default=PullPolicy.IF_NOT_PRESENT, alias="imagePullPolicy"
    )
    replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="pods running the app; 0 scales to zero as suspend does (so the scale "
        "subresource, kubectl scale, an HPA or KEDA can scale to zero)",
    )
    zones: list[str] = Field(
        default_factory=list,
        description="zones to spread replicas over in local runs (replica i gets zone "
        "i mod len(zones)); on Kubernetes the nodes' zone label is used",
    )
    log: LogSpec = Field(default_factory=LogSpec)
    config: _StreamsSettings = Field(
        default_factory=dict, description="Kafka Streams settings by their names"
    )
    standby_placement: StandbyPlacement = Field(
        default_factory=StandbyPlacement, alias="standbyPlacement"
    )
    storage: StorageSpec = Field(default_factory=StorageSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    suspend: bool = Field(
        default=False, description="true scales to zero pods and keeps the state claims"
    )
    restore: RestoreSpec = Field(
        default_factory=RestoreSpec,
        description="Spark restore Jobs for missing stores with long changelogs",
    )
    autoscaling: AutoscalingSpec | None = Field(
        default=None,
        description="lag-driven autoscaling of replicas (absent: no automatic scaling)",
    )

    @field_validator("topology", mode="before")
    @classmethod
    def _bare_reference(cls, value: Any) -> Any:
        # Local manifests say `topology: module:function`; the cluster form is an object.
        return {"ref": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _backfill_needs_the_restore_claim(self) -> StreamAppSpec:
        if self.topology.backfill is not None and self.restore.when is RestoreWhen.NEVER:
            raise ValueError(BACKFILL_NEEDS_RESTORE)
        return self

    @model_validator(mode="after")
    def _placement_needs_a_shared_log(self) -> StreamAppSpec:
        if self.log.url.startswith("sqlite:") and (
            self.standby_placement.spread is SpreadPolicy.REQUIRED
        ):
            raise ValueError(
                "standbyPlacement.spread Required needs a log every node reaches (kafka://): "
                "the embedded sqlite log pins every pod to one node"
            )
        return self

    @property
    def suspended(self) -> bool:
        """No pods run: spec.suspend, or replicas scaled to 0 (the same to the operator)."""
        return self.suspend or self.replicas == 0


class ConditionStatus(enum.StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Phase(enum.StrEnum):
    """The one-word summary `kubectl get sapp` prints."""

    PENDING = "Pending"
    PROGRESSING = "Progressing"
    RUNNING = "Running"
    DEGRADED = "Degraded"
    SUSPENDED = "Suspended"


class ConditionType(enum.StrEnum):
    """The condition types the operator sets on a StreamApp (``status.conditions[].type``).
    ``Condition.type`` stays a string: a status read back may hold a type another tool wrote,
    and it must still parse."""

    READY = "Ready"
    PROGRESSING = "Progressing"
    DEGRADED = "Degraded"
    UPGRADING = "Upgrading"
    # A Spark restore Job builds state (spec.restore).
    RESTORING = "Restoring"
    # A topology upgrade's backfill Job builds stores from history (spec.topology.backfill).
    BACKFILLING = "Backfilling"
    # Pods above spec.replicas hand their tasks over, one at a time (scale_in.py).
    SCALING_IN = "ScalingIn"
    # eddyline.dev/pause-reconciliation is "true".
    PAUSED = "Paused"


class Condition(_Strict):
    """A condition per the Kubernetes API conventions (metav1.Condition)."""

    type: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9]*$")
    status: ConditionStatus
    reason: str = Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    message: str = ""
    last_transition_time: str = Field(
        alias="lastTransitionTime", json_schema_extra={"format": "date-time"}
    )
    observed_generation: int | None = Field(default=None, alias="observedGeneration", ge=0)


class RestoreJobState(enum.StrEnum):
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class RestoreJobStatus(_Strict):
    """A Spark restore Job the operator launched, as it last saw it."""

    name: str
    store: str
    partitions: list[int] = Field(default_factory=list)
    state: RestoreJobState
    message: str = ""
    started_at: str | None = Field(default=None, alias="startedAt")
    finished_at: str | None = Field(default=None, alias="finishedAt")


class TopologyRecord(_Strict):
    """A topology as the operator records it: the spec's ref and revision, and the hash of
    ``describe()`` the pods report once they run it."""

    ref: str
    revision: str
    hash: str | None = None

    def same_spec(self, other: TopologyRecord) -> bool:
        """The same ref and revision (the hash is what pods report, not what was asked)."""
        return self.ref == other.ref and self.revision == other.revision

    def __str__(self) -> str:
        return f"{self.ref}@{self.revision}"


class UpgradeStep(enum.StrEnum):
    """The step of a full-cluster topology upgrade under way."""

    STOPPING = "Stopping"
    # Only with spec.topology.backfill, and never while rolling back (docs/backfill.md).
    BACKFILLING = "Backfilling"
    PUBLISHING = "Publishing"
    STARTING = "Starting"


class UpgradeOutcome(enum.StrEnum):
    SUCCEEDED = "Succeeded"
    ROLLED_BACK = "RolledBack"


class UpgradeStepRecord(_Strict):
    step: str = Field(description="a step, prefixed RollBack while rolling back")
    started_at: str = Field(alias="startedAt", json_schema_extra={"format": "date-time"})


class UpgradeFailure(_Strict):
    """Why an upgrade was rolled back: the reason, and the pod and error when a pod said."""

    reason: str
    pod: str | None = None
    message: str = ""


class GeneratedNameRecord(_Strict):
    """A store or internal topic the running revision's DSL named itself, and its meaning."""

    name: str
    kind: ResourceKind
    operation: str = ""
    way_out: str = Field(default="", alias="wayOut")
    attached: list[str] = Field(default_factory=list, description="the processors using it")
    inputs: list[str] = Field(
        default_factory=list, description="the topics its writing sub-topology reads"
    )
    logged: bool = False

    @classmethod
    def of(cls, name: GeneratedName) -> GeneratedNameRecord:
        return cls(
            name=name.name,
            kind=name.kind,
            operation=name.operation,
            wayOut=name.way_out,
            attached=list(name.attached),
            inputs=list(name.inputs),
            logged=name.logged,
        )

    def generated_name(self) -> GeneratedName:
        return GeneratedName(
            self.name,
            self.kind,
            self.operation,
            self.way_out,
            tuple(self.attached),
            tuple(self.inputs),
            self.logged,
        )


class BackfillState(enum.StrEnum):
    PENDING = "Pending"  # recorded at Stopping: the Job starts once no pod processes
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class BackfillRecord(_Strict):
    """An upgrade's backfill: what it builds, its Job, and how it went (the Job's verdict)."""

    stores: list[str]
    from_: BackfillFrom = Field(default=BackfillFrom.EARLIEST_RETAINED, alias="from")
    from_timestamp: AwareDatetime | None = Field(default=None, alias="fromTimestamp")
    job: str = Field(description="the backfill Job's name (fixed at Stopping)")
    build_id: str = Field(alias="buildId", description="names the build in the restore claim")
    state: BackfillState = BackfillState.PENDING
    message: str = ""
    records: int | None = Field(default=None, description="history records run, once done")
    end_offsets: dict[str, int] = Field(
        default_factory=dict,
        alias="endOffsets",
        description="topic:partition -> the offset the history ends at (exclusive): the "
        "committed positions the new revision resumes from",
    )
    started_at: str | None = Field(default=None, alias="startedAt")
    finished_at: str | None = Field(default=None, alias="finishedAt")


class BackfillVerdict(_Strict):
    """What the backfill Job (``eddyline backfill job``) says as its termination message: both
    the Job and the operator read it, so it lives with the status it fills in."""

    state: BackfillState
    message: str = ""
    build_id: str = Field(default="", alias="buildId")
    records: int | None = None
    end_offsets: dict[str, int] = Field(default_factory=dict, alias="endOffsets")

    @classmethod
    def from_text(cls, text: str) -> BackfillVerdict | None:
        try:
            return cls.model_validate_json(text)
        except ValidationError:
            return None

    def to_text(self) -> str:
        return self.model_dump_json(by_alias=True)


class UpgradeStatus(_Strict):
    """The upgrade under way: the operator's write-ahead log (each step is written here before
    the operator acts on it; a restarted operator resumes from it)."""

    from_topology: TopologyRecord = Field(alias="from")
    to_topology: TopologyRecord = Field(alias="to")
    step: UpgradeStep
    steps: list[UpgradeStepRecord] = Field(default_factory=list)
    placement: dict[str, dict[str, list[str]]] = Field(
        default_factory=dict,
        description="store -> partition -> pods holding it before the upgrade, active first: "
        "new tasks are assigned where their (relocated) state is",
    )
    generated_names: list[GeneratedNameRecord] = Field(
        default_factory=list,
        alias="generatedNames",
        description="the stores and internal topics the running revision's DSL named itself, "
        "as its pods reported them when the upgrade started: the new revision's are compared "
        "with them before any task is assigned",
    )
    strategy: UpgradeStrategy = Field(
        default=UpgradeStrategy.ROLLING,
        description="spec.topology.upgradeStrategy when the upgrade began (its rollback too)",
    )
    backfill: BackfillRecord | None = None
    rollback: UpgradeFailure | None = None


class LastUpgrade(_Strict):
    from_topology: TopologyRecord = Field(alias="from")
    to_topology: TopologyRecord = Field(alias="to")
    outcome: UpgradeOutcome
    steps: list[UpgradeStepRecord] = Field(default_factory=list)
    finished_at: str = Field(alias="finishedAt", json_schema_extra={"format": "date-time"})
    strategy: UpgradeStrategy = UpgradeStrategy.ROLLING
    backfill: BackfillRecord | None = None
    rollback: UpgradeFailure | None = None


class ScalingDecision(_Strict):
    """One replica change the autoscaler made."""

    time: str = Field(json_schema_extra={"format": "date-time"})
    from_replicas: int = Field(alias="fromReplicas")
    to_replicas: int = Field(alias="toReplicas")
    reason: str = Field(description="why, with the figures")


class AutoscalingStatus(_Strict):
    """What the autoscaler last saw and did (spec.autoscaling)."""

    current_replicas: int | None = Field(default=None, alias="currentReplicas")
    desired_replicas: int | None = Field(default=None, alias="desiredReplicas")
    last_decision: ScalingDecision | None = Field(default=None, alias="lastDecision")


class StreamAppStatus(_Strict):
    observed_generation: int | None = Field(
        default=None,
        alias="observedGeneration",
        description="the metadata.generation this status describes",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    phase: Phase | None = None
    replicas: int | None = Field(default=None, description="pods that exist")
    ready_replicas: int | None = Field(default=None, alias="readyReplicas")
    revision: str | None = Field(default=None, description="the topology revision running")
    selector: str | None = Field(default=None, description="the pods' label selector (scale)")
    max_standby_lag: int | None = Field(
        default=None,
        alias="maxStandbyLag",
        description="the largest standby lag in changelog records, from the pods' /v1/lags",
    )
    membership_generation: int | None = Field(default=None, alias="membershipGeneration")
    log_node: str | None = Field(
        default=None,
        alias="logNode",
        description="the node every pod is pinned to while the embedded sqlite log is used",
    )
    message: str | None = None
    restore_jobs: list[RestoreJobStatus] | None = Field(
        default=None,
        alias="restoreJobs",
        description="the newest Spark restore Jobs (spec.restore) and how they went",
    )
    topology: TopologyRecord | None = Field(
        default=None, description="the topology published to the pods (what runs)"
    )
    upgrade: UpgradeStatus | None = None
    last_upgrade: LastUpgrade | None = Field(default=None, alias="lastUpgrade")
    failed_topology: TopologyRecord | None = Field(
        default=None,
        alias="failedTopology",
        description="a topology that was rolled back; not tried again until spec.topology changes",
    )
    autoscaling: AutoscalingStatus | None = Field(
        default=None, description="the autoscaler's view (spec.autoscaling)"
    )


class StreamApp(_Strict):
    api_version: Literal["eddyline.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["StreamApp"]
    metadata: ObjectMeta
    spec: StreamAppSpec
    # spec.config validated once, as written (never the environment), with application.id
    # the app's name: what the operator reads, and what each process starts from.
    _settings: StreamsConfig = PrivateAttr()

    @model_validator(mode="after")
    def _validated_settings(self) -> StreamApp:
        self._validate_settings()
        return self

    def _validate_settings(self) -> None:
        self._settings = StreamsConfig.from_properties(
            {"application.id": self.metadata.name, **self.spec.config}, environ={}
        )  # raises ConfigError naming the key

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy; with ``update`` (a new spec, say), its settings validated again from the
        copy's spec.config, never the original's carried over."""
        copied = super().model_copy(update=update, deep=deep)
        if update:
            copied._validate_settings()
        return copied

    @property
    def settings(self) -> StreamsConfig:
        """spec.config as validated, without any environment: the operator's view."""
        return self._settings

    def with_config(self, config: Mapping[str, Any], *, source: str) -> StreamApp:
        """This app with ``spec.config`` replaced (``eddyline run --config FILE``: ``source``
        names the file in errors), validated as a manifest is."""
        document = self.model_dump(by_alias=True, mode="json")
        return parse_manifest(
            {**document, "spec": {**document["spec"], "config": dict(config)}}, source=source
        )

    def streams_config(self, environ: Mapping[str, str] | None = None) -> StreamsConfig:
        """What this process runs with: :attr:`settings`, overridden by the environment's
        ``EDDYLINE_<NAME>`` variables (``environ``, default this process's). A process
        builds it once at start and hands it on."""
        return self._settings.overridden_by(os.environ if environ is None else environ)


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
        # Raised once the whole document is valid (StreamApp._validated_settings): always
        # about a spec.config key.
        return ManifestError(source, f'spec.config."{original.key}"', str(original))
    if first["type"] == "literal_error":
        return ManifestError(source, path, f"must be {first['ctx']['expected']}")
    if first["type"] == "string_pattern_mismatch":
        # The accepted form in words, never the regex.
        form = FORMS.get(str(first.get("ctx", {}).get("pattern")))
        field_info = form or _field_description(first["loc"])
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
