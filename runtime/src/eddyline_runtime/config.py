"""The runtime's configuration, with Kafka Streams' names.

One frozen pydantic model, :class:`StreamsConfig`, holds every setting a pod
reads once at start. Users write Kafka Streams' dotted names
(``statestore.uncommitted.max.bytes``); the environment may override any of
them as ``EDDYLINE_`` + the name upper-cased with dots as underscores
(``EDDYLINE_STATESTORE_UNCOMMITTED_MAX_BYTES``), and wins over files and
manifests; :meth:`StreamsConfig.from_file` reads a Java ``.properties`` or a
YAML file. The environment is read only where a process builds its own config
(``from_properties`` without ``environ``, :meth:`StreamsConfig.overridden_by`):
the operator validates a StreamApp's settings with ``environ={}``, so a spec's
validity never depends on the operator pod's variables.

The fields are also the CRD's schema of ``spec.config``: those marked
``cluster=True`` (:data:`CLUSTER_SETTINGS`) become its properties, with their
bounds, defaults and descriptions (:func:`cluster_settings_schema`). A bad value raises
:class:`~eddyline_runtime.errors.ConfigError` naming the key, the value and
what is accepted.
"""

from __future__ import annotations

import contextlib
import difflib
import enum
import os
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator

from eddyline_runtime.errors import (
    ConfigError,
    InvalidUncommittedBytesLimitError,
    UnknownIsolationLevelError,
    one_of,
)

# KIP-892's default for statestore.uncommitted.max.bytes: 64 MiB.
DEFAULT_UNCOMMITTED_MAX_BYTES = 64 * 1024 * 1024
# KIP-63's record cache default: 10 MiB per instance.
DEFAULT_CACHE_MAX_BYTES = 10 * 1024 * 1024
# KIP-892: -1 means the uncommitted buffer is unbounded.
UNLIMITED = -1
# The most stream threads one instance may run. Kafka Streams sets no bound;
# here each thread holds its own fetch buffers, record cache share and
# uncommitted budget, and 100,000 threads grew memory by 120 MB/s until the
# process was killed. 64 is well beyond what a pod's cores can use (a thread
# runs one task at a time), and an instance starts no more threads than it
# has tasks anyway.
MAX_STREAM_THREADS = 64
# Stores set aside by rebuilds: the newest 4, for at most 7 days (time to republish one).
DEFAULT_QUARANTINE_MAX_STORES = 4
DEFAULT_QUARANTINE_RETENTION_MS = 7 * 24 * 60 * 60 * 1000
# Kafka Streams' windowstore.changelog.additional.retention.ms: a window or session
# store's changelog keeps records this much longer than the store keeps them.
DEFAULT_WINDOW_CHANGELOG_ADDITIONAL_RETENTION_MS = 24 * 60 * 60 * 1000
# Kafka's broker default log.retention.check.interval.ms: how often a log that does
# not apply retention by itself (the embedded one) is asked to.
DEFAULT_LOG_RETENTION_CHECK_INTERVAL_MS = 5 * 60 * 1000
# KIP-63's original name for statestore.cache.max.bytes, deprecated by KIP-770.
DEPRECATED_CACHE_KEY = "cache.max.bytes.buffering"
# The environment overrides a setting as EDDYLINE_ + its name, dots as underscores.
ENV_PREFIX = "EDDYLINE_"
_CACHE_KEYS = ("statestore.cache.max.bytes", "statestore_cache_max_bytes")


class IsolationLevel(enum.StrEnum):
    """What a reader on another thread sees of a store's open transaction (KIP-892)."""

    READ_UNCOMMITTED = "READ_UNCOMMITTED"
    READ_COMMITTED = "READ_COMMITTED"

    @classmethod
    def parse(
        cls, value: IsolationLevel | str, *, key: str = "default.state.isolation.level"
    ) -> IsolationLevel:
        """Accept an enum member or its name (any case); reject anything else by name."""
        if isinstance(value, IsolationLevel):
            return value
        try:
            return cls(str(value).strip().upper())
        except ValueError:
            raise UnknownIsolationLevelError(
                key,
                value,
                one_of(m.value for m in cls),
                hint="pass one of them, or leave it unset to use default.state.isolation.level",
            ) from None


class ProcessingGuarantee(enum.StrEnum):
    """``processing.guarantee``: Kafka Streams' two current guarantees."""

    AT_LEAST_ONCE = "at_least_once"
    EXACTLY_ONCE_V2 = "exactly_once_v2"


class CommitMode(enum.StrEnum):
    """``commit.mode`` (eddyline's own): how a stream thread commits its tasks' transactions
    under exactly-once (docs/kafka.md, "Committing a thread's tasks together")."""

    # As concurrent, and each task's outputs go into its open transaction as processing
    # produces them, as Kafka Streams' producer sends them: a commit then waits only for
    # what the last iterations and the cache's flush produced (docs/kafka.md, "Sending
    # outputs before the commit"; not the default: no gain measured yet).
    PIPELINED = "pipelined"
    # Every task's flush, send_offsets_to_transaction and commit_transaction at once, each
    # task on its own producer: a cycle costs about one task's round trips.
    CONCURRENT = "concurrent"
    # One task's commit after another (the previous behaviour, kept measurable).
    SERIAL = "serial"


class ExceptionHandlerKind(enum.StrEnum):
    """Which of a record's failures a handler answers (Kafka's three handler settings)."""

    DESERIALIZATION = "deserialization"
    PROCESSING = "processing"
    PRODUCTION = "production"

    @property
    def setting(self) -> str:
        """The handler's setting, by Kafka's name since 4.0 (KIP-1033)."""
        return f"{self.value}.exception.handler"


# The built-in handlers, as eddyline names them (the setting's canonical values).
LOG_AND_CONTINUE = "log-and-continue"
LOG_AND_FAIL = "log-and-fail"
# Kafka's built-in handler classes -> (the failures they answer, eddyline's built-in).
KAFKA_EXCEPTION_HANDLERS = {
    "LogAndContinueExceptionHandler": (ExceptionHandlerKind.DESERIALIZATION, LOG_AND_CONTINUE),
    "LogAndFailExceptionHandler": (ExceptionHandlerKind.DESERIALIZATION, LOG_AND_FAIL),
    "LogAndContinueProcessingExceptionHandler": (ExceptionHandlerKind.PROCESSING, LOG_AND_CONTINUE),
    "LogAndFailProcessingExceptionHandler": (ExceptionHandlerKind.PROCESSING, LOG_AND_FAIL),
    "DefaultProductionExceptionHandler": (ExceptionHandlerKind.PRODUCTION, LOG_AND_FAIL),
}
_KAFKA_ERRORS_PACKAGE = "org.apache.kafka.streams.errors."
# Kafka's names before 4.0 (deprecated by KIP-1033's renaming) -> today's.
DEPRECATED_HANDLER_KEYS = {
    f"default.{kind.setting}": kind.setting
    for kind in (ExceptionHandlerKind.DESERIALIZATION, ExceptionHandlerKind.PRODUCTION)
}


def parse_exception_handler(kind: ExceptionHandlerKind, value: Any) -> str:
    """A handler setting's value in its canonical form: ``log-and-continue``,
    ``log-and-fail`` or a ``module:function`` reference (loaded when a task starts).

    Kafka's class names are accepted for the failures they answer, with or
    without their package; one for another kind of failure is refused by name.
    """
    text = str(value).strip() if value is not None else ""
    if text in (LOG_AND_CONTINUE, LOG_AND_FAIL):
        return text
    short = text.removeprefix(_KAFKA_ERRORS_PACKAGE)
    if short in KAFKA_EXCEPTION_HANDLERS:
        answers, built_in = KAFKA_EXCEPTION_HANDLERS[short]
        if answers is kind:
            return built_in
        raise ConfigError(
            kind.setting,
            value,
            _handler_choices(kind),
            hint=f"{short} answers {answers.value} failures; set it as {answers.setting}",
        )
    module, _, function = text.partition(":")
    modules = module.split(".")
    if module and function.isidentifier() and all(part.isidentifier() for part in modules):
        return text
    raise ConfigError(kind.setting, value, _handler_choices(kind))


def _handler_choices(kind: ExceptionHandlerKind) -> str:
    kafka = [name for name, (answers, _) in KAFKA_EXCEPTION_HANDLERS.items() if answers is kind]
    return (
        f"{one_of([LOG_AND_CONTINUE, LOG_AND_FAIL])}, Kafka's {one_of(kafka)}, or a "
        "'module:function' reference to your own handler (see docs/errors.md)"
    )


def validate_uncommitted_max_bytes(
    value: int, *, key: str = "statestore.uncommitted.max.bytes"
) -> int:
    """-1 (no limit) or a non-negative byte count."""
    if isinstance(value, bool) or not isinstance(value, int) or value < UNLIMITED:
        raise InvalidUncommittedBytesLimitError(
            key,
            value,
            "-1 (no limit) or a number of bytes >= 0",
            hint=f"the default is {DEFAULT_UNCOMMITTED_MAX_BYTES} (64 MiB)",
        )
    return value


def _setting(
    kafka_name: str,
    default: Any,
    description: str,
    *,
    cluster: bool = False,
    schema: Callable[[dict[str, Any]], None] | None = None,
    **constraints: Any,
) -> Any:
    """A field read from its Kafka Streams name or the same with underscores.

    The field itself must be named ``kafka_name`` with dots as underscores:
    that also gives its environment variable, EDDYLINE_<NAME>. ``cluster``: a
    StreamApp on a cluster may set it in ``spec.config`` (the CRD's schema of
    spec.config is generated from these fields, descriptions and bounds included);
    ``schema`` adjusts that schema where the API server needs another form.
    """

    def extra(node: dict[str, Any]) -> None:
        if cluster:
            node[CLUSTER_MARK] = True
        if schema is not None:
            schema(node)

    return Field(
        default=default,
        validation_alias=AliasChoices(kafka_name, kafka_name.replace(".", "_")),
        description=description,
        json_schema_extra=extra,
        **constraints,
    )


# The JSON-schema key that marks a setting a cluster may set (spec.py reads it).
CLUSTER_MARK = "x-eddyline-cluster"


def _share_as_rule(node: dict[str, Any]) -> None:
    # A CEL rule, not exclusiveMinimum/maximum: its message says the accepted values in
    # words, and double() takes a whole number (1) as well.
    node.pop("exclusiveMinimum", None)
    node.pop("maximum", None)
    node["x-kubernetes-validations"] = [
        {
            "rule": "double(self) > 0.0 && double(self) <= 1.0",
            "message": "rocksdb.memory.limit.share must be a number above 0 and at most 1 (a "
            "share of the pod's memory limit, such as 0.5)",
        }
    ]


def _local_path(node: dict[str, Any]) -> None:
    # No default on a cluster (the API server would write /tmp/eddyline into every
    # StreamApp, where the operator sets the pod's volume), and no "path" format (not
    # OpenAPI's).
    node.pop("default", None)
    node.pop("format", None)
    node["minLength"] = 1


class StreamsConfig(BaseModel):
    """Settings a pod reads once at start. Field aliases are Kafka Streams' names.

    Build it with :meth:`from_properties` (the environment's ``EDDYLINE_<NAME>``
    variables win) or with ``environ={}`` to validate settings as written.
    """

    model_config = ConfigDict(
        populate_by_name=True,
        frozen=True,
        extra="forbid",
        use_enum_values=False,
    )

    application_id: str = _setting(
        "application.id", "eddyline-app", "names the app's topics and group (a StreamApp's name)"
    )
    state_dir: Path = _setting(
        "state.dir",
        Path("/tmp/eddyline"),
        "local runs only: on a cluster the operator sets it to the pod's volume",
        cluster=True,
        schema=_local_path,
    )
    processing_guarantee: ProcessingGuarantee = _setting(
        "processing.guarantee",
        ProcessingGuarantee.AT_LEAST_ONCE,
        "exactly_once_v2 commits outputs, changelogs and input offsets in one transaction",
        cluster=True,
    )
    # eddyline's own; only a log with round trips to overlap (Kafka) commits concurrently.
    commit_mode: CommitMode = _setting(
        "commit.mode",
        CommitMode.CONCURRENT,
        "exactly-once: pipelined sends outputs into the tasks' open transactions as they are "
        "produced and commits them together, concurrent sends them at the commit and commits "
        "together, serial commits one task after another",
    )
    num_stream_threads: int = _setting(
        "num.stream.threads",
        1,
        "stream threads per pod (no more are started than the pod has tasks)",
        cluster=True,
        ge=1,
        le=MAX_STREAM_THREADS,
    )
    statestore_uncommitted_max_bytes: int = _setting(
        "statestore.uncommitted.max.bytes",
        DEFAULT_UNCOMMITTED_MAX_BYTES,
        "uncommitted writes buffered per instance before an early commit; -1: no limit",
        cluster=True,
        ge=UNLIMITED,
    )
    statestore_cache_max_bytes: int = Field(
        default=DEFAULT_CACHE_MAX_BYTES,
        ge=0,
        # cache.max.bytes.buffering is the deprecated name (KIP-63's original).
        validation_alias=AliasChoices(
            "statestore.cache.max.bytes", "statestore_cache_max_bytes", "cache.max.bytes.buffering"
        ),
        description="the record cache per instance (KIP-63); 0 turns it off",
        json_schema_extra={CLUSTER_MARK: True},
    )
    # None: not set; the effective interval depends on the guarantee (Kafka's rule).
    # 0 commits after every loop of the stream thread, i.e. after each batch of
    # at most 1,000 records per task (never in the middle of a record).
    commit_interval_ms: int | None = _setting(
        "commit.interval.ms",
        None,
        "how often tasks commit (default: 100 under exactly-once, 30000 otherwise)",
        cluster=True,
        ge=0,
    )
    max_task_idle_ms: int = _setting(
        "max.task.idle.ms",
        0,
        "KIP-695: -1 never waits for a lagging input, 0 waits while it has lag, N also N ms "
        "for data not produced yet",
        cluster=True,
        ge=-1,
    )
    # Placed on other members (other zones first).
    num_standby_replicas: int = _setting(
        "num.standby.replicas",
        0,
        "standby copies per stateful task, in other zones; capped at replicas - 1",
        cluster=True,
        ge=0,
    )
    # KIP-441 (Kafka Streams' names and defaults): a stateful task moves only to a member
    # whose copy trails its changelog by at most acceptable.recovery.lag records; until
    # then that member warms up a replica (at most max.warmup.replicas across the group),
    # and the assignment is recomputed when warm-ups report caught up, or at the latest
    # every probing.rebalance.interval.ms.
    acceptable_recovery_lag: int = _setting(
        "acceptable.recovery.lag",
        10_000,
        "KIP-441: a stateful task moves to another pod only once that pod's copy trails its "
        "changelog by at most this many records; until then it warms up there",
        cluster=True,
        ge=0,
    )
    max_warmup_replicas: int = _setting(
        "max.warmup.replicas",
        2,
        "KIP-441: warm-up replicas across the app at a time (on top of standbys)",
        cluster=True,
        ge=1,
    )
    probing_rebalance_interval_ms: int = _setting(
        "probing.rebalance.interval.ms",
        10 * 60 * 1000,
        "KIP-441: local runs only; on a cluster the operator assigns again every cycle",
        cluster=True,
        ge=1,
    )
    memory_limit_bytes: int = _setting(
        "memory.limit.bytes",
        -1,
        "the container's memory limit in bytes, as the downward API gives it (resourceFieldRef "
        "limits.memory -> EDDYLINE_MEMORY_LIMIT_BYTES); -1: none known",
        ge=-1,
    )
    # eddyline's own; without a known limit RocksDB is not capped.
    rocksdb_memory_limit_share: float = _setting(
        "rocksdb.memory.limit.share",
        0.5,
        "the share of the pod's memory limit (limits.memory, through the downward API) that "
        "all its RocksDB stores use together: block cache and write buffers",
        cluster=True,
        schema=_share_as_rule,
        gt=0,
        le=1,
    )
    automatic_state_relocation: bool = _setting(
        "automatic.state.relocation",
        True,
        "KIP-816: move state whose sub-topology ordinal changed instead of rebuilding it",
        cluster=True,
    )
    ensure_explicit_internal_resource_naming: bool = _setting(
        "ensure.explicit.internal.resource.naming",
        False,
        "KIP-1111: refuse to start a topology in which any state store, changelog or "
        "repartition topic has a generated name (names shift when the topology is edited)",
        cluster=True,
    )
    # A store whose changelog no longer fits it is set aside, not deleted (it may be the
    # best copy of its state left). Each is a whole store on disk.
    state_quarantine_max_stores: int = _setting(
        "state.quarantine.max.stores",
        DEFAULT_QUARANTINE_MAX_STORES,
        "stores set aside (not deleted) when their changelog no longer fits them: how many "
        "each pod keeps (see eddyline state republish)",
        cluster=True,
        ge=0,
    )
    state_quarantine_retention_ms: int = _setting(
        "state.quarantine.retention.ms",
        DEFAULT_QUARANTINE_RETENTION_MS,
        "how long a store set aside is kept",
        cluster=True,
        ge=0,
    )
    state_rebuild_after_changelog_recreated: bool = _setting(
        "state.rebuild.after.changelog.recreated",
        False,
        "rebuild stores whose whole changelog topic was deleted and created again (refused by "
        "default: the new topic holds none of their state)",
        cluster=True,
    )
    # eddyline's own. A task whose store is missing ingests the newest build that fits,
    # then replays only the changelog after the build's offset.
    restore_build_dir: Path | None = _setting(
        "restore.build.dir",
        None,
        "where Spark restore builds (eddyline restore build --output) are found; "
        "unset: always replay changelogs",
    )
    # eddyline's own, set by the operator from spec.restore. It waits at most
    # restore.wait.ms, then replays the changelog. A standby's or warm-up's store waits
    # the same way, without holding up the thread's active tasks.
    restore_wait_lag_above: int = _setting(
        "restore.wait.lag.above",
        -1,
        "a task whose store is missing and whose changelog holds more than this many records "
        "waits for a Spark build (restorePending) instead of replaying; -1 never waits",
        ge=-1,
    )
    restore_wait_ms: int = _setting(
        "restore.wait.ms", 600_000, "how long a store waits for a Spark build", ge=0
    )
    windowstore_changelog_additional_retention_ms: int = _setting(
        "windowstore.changelog.additional.retention.ms",
        DEFAULT_WINDOW_CHANGELOG_ADDITIONAL_RETENTION_MS,
        "how much longer a window or session store's changelog keeps records than the store",
        ge=0,
    )
    # A Kafka broker does it itself; see Log.enforce_retention.
    log_retention_check_interval_ms: int = _setting(
        "log.retention.check.interval.ms",
        DEFAULT_LOG_RETENTION_CHECK_INTERVAL_MS,
        "how often stream threads ask the log to delete records past their topic's "
        "retention.ms after a commit",
        ge=0,
    )
    application_server: str | None = _setting(
        "application.server",
        None,
        "local runs only: on a cluster each pod answers queries at its pod IP",
        cluster=True,
    )
    # None means "not set by the user": the effective level then depends on
    # the processing guarantee (see effective_isolation_level).
    default_state_isolation_level: IsolationLevel | None = _setting(
        "default.state.isolation.level",
        None,
        "what queries see of open transactions (KIP-892; default: READ_COMMITTED under "
        "exactly-once, READ_UNCOMMITTED otherwise)",
        cluster=True,
    )

    # KIP-1033 / KIP-1034: what happens to a record that cannot be processed.
    deserialization_exception_handler: str = _setting(
        "deserialization.exception.handler",
        LOG_AND_FAIL,
        "a record whose key or value does not deserialize: log-and-fail (stop the task), "
        "log-and-continue (skip it) or a module:function handler; Kafka's class names too",
        cluster=True,
    )
    processing_exception_handler: str = _setting(
        "processing.exception.handler",
        LOG_AND_FAIL,
        "a record a processor raised on: log-and-fail, log-and-continue or module:function",
        cluster=True,
    )
    production_exception_handler: str = _setting(
        "production.exception.handler",
        LOG_AND_FAIL,
        "an output that does not serialize: log-and-fail, log-and-continue or module:function",
        cluster=True,
    )
    errors_dead_letter_queue_topic_name: str | None = _setting(
        "errors.dead.letter.queue.topic.name",
        None,
        "KIP-1034: the topic the built-in handlers write a failed record to (its original key "
        "and value, __streams.errors.* headers); it must exist: the app does not create it",
        cluster=True,
    )

    @field_validator("state_dir", mode="before")
    @classmethod
    def _nonempty_state_dir(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            raise ConfigError("state.dir", value, "a directory path", hint="or leave it unset")
        return value

    @field_validator("deserialization_exception_handler", mode="before")
    @classmethod
    def _parse_deserialization_handler(cls, value: Any) -> str:
        return parse_exception_handler(ExceptionHandlerKind.DESERIALIZATION, value)

    @field_validator("processing_exception_handler", mode="before")
    @classmethod
    def _parse_processing_handler(cls, value: Any) -> str:
        return parse_exception_handler(ExceptionHandlerKind.PROCESSING, value)

    @field_validator("production_exception_handler", mode="before")
    @classmethod
    def _parse_production_handler(cls, value: Any) -> str:
        return parse_exception_handler(ExceptionHandlerKind.PRODUCTION, value)

    @field_validator("errors_dead_letter_queue_topic_name", mode="before")
    @classmethod
    def _parse_dead_letter_topic(cls, value: Any) -> str | None:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None  # Kafka's default: no dead-letter queue
        return str(value).strip()

    def exception_handler(self, kind: ExceptionHandlerKind) -> str:
        """The handler chosen for ``kind`` of failure (canonical, see parse_exception_handler)."""
        return str(getattr(self, kind.setting.replace(".", "_")))

    @field_validator("default_state_isolation_level", mode="before")
    @classmethod
    def _parse_isolation(cls, value: Any) -> IsolationLevel | None:
        if value is None or value == "":
            return None
        return IsolationLevel.parse(value)

    @field_validator("max_task_idle_ms", mode="before")
    @classmethod
    def _parse_max_task_idle_ms(cls, value: Any) -> int:
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                value = int(value.strip())
        if isinstance(value, bool) or not isinstance(value, int) or value < -1:
            raise ConfigError(
                "max.task.idle.ms",
                value,
                "-1 or >= 0 (-1: never wait; 0: wait only for data already produced; "
                "N > 0: also wait up to N ms for new data)",
            )
        return value

    @field_validator("statestore_uncommitted_max_bytes", mode="before")
    @classmethod
    def _parse_uncommitted_max_bytes(cls, value: Any) -> int:
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                value = int(value.strip())
        return validate_uncommitted_max_bytes(value)

    @property
    def effective_isolation_level(self) -> IsolationLevel:
        """KIP-892: READ_UNCOMMITTED unless exactly-once is on and the user chose nothing."""
        if self.default_state_isolation_level is not None:
            return self.default_state_isolation_level
        if self.processing_guarantee is ProcessingGuarantee.EXACTLY_ONCE_V2:
            return IsolationLevel.READ_COMMITTED
        return IsolationLevel.READ_UNCOMMITTED

    @property
    def effective_commit_interval_ms(self) -> int:
        """Kafka Streams' defaults: 30 s under at-least-once, 100 ms under exactly-once."""
        if self.commit_interval_ms is not None:
            return self.commit_interval_ms
        if self.processing_guarantee is ProcessingGuarantee.EXACTLY_ONCE_V2:
            return 100
        return 30_000

    @property
    def cache_bytes_per_thread(self) -> int:
        """Each stream thread's record cache (KIP-63: split evenly, never shared)."""
        return self.statestore_cache_max_bytes // self.num_stream_threads

    @classmethod
    def from_file(
        cls, path: Path | str, overrides: Mapping[str, Any] | None = None
    ) -> StreamsConfig:
        """Read a Java ``.properties`` or a YAML file; ``overrides`` win over the file,
        the environment over both."""
        return cls.from_properties({**read_settings_file(Path(path)), **(overrides or {})})

    @classmethod
    def from_properties(
        cls, properties: Mapping[str, Any], *, environ: Mapping[str, str] | None = None
    ) -> StreamsConfig:
        """Build from Kafka Streams-style properties; errors name the key and accepted values.

        ``environ`` (default: this process's environment) overrides them by
        ``EDDYLINE_<NAME>``; ``environ={}`` validates the properties as written, as the
        operator does with a StreamApp's spec.config.
        """
        if DEPRECATED_CACHE_KEY in properties:
            properties = _without_deprecated_cache_key(properties)
        if any(key in properties for key in DEPRECATED_HANDLER_KEYS):
            properties = _without_deprecated_handler_keys(properties)
        return cls._validated(properties, os.environ if environ is None else environ)

    def overridden_by(self, environ: Mapping[str, str]) -> StreamsConfig:
        """These settings with the environment's ``EDDYLINE_<NAME>`` variables over them
        (itself when none is set): what one process runs with."""
        if not _environment_settings(environ):
            return self
        return self._validated(self.model_dump(), environ)

    @classmethod
    def _validated(cls, properties: Mapping[str, Any], environ: Mapping[str, str]) -> StreamsConfig:
        # The environment wins over files and manifests: it is how one pod (or one run)
        # overrides a setting without editing what everyone shares.
        overrides = _environment_settings(environ)
        normalized = {
            field: value
            for key, value in properties.items()
            if (field := _FIELD_OF_ALIAS.get(key, key)) not in overrides
        }
        try:
            return cls.model_validate({**normalized, **overrides})
        except ValidationError as exc:
            raise _config_error_from(exc, properties, environ) from None


def _environment_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """Field name -> value of every ``EDDYLINE_<NAME>`` variable naming a setting."""
    return {
        name: environ[variable]
        for name in _FIELD_KEYS
        if (variable := environment_variable(name)) in environ
    }


def environment_variable(field_name: str) -> str:
    """The variable that overrides a setting: EDDYLINE_ + its field name upper-cased."""
    return f"{ENV_PREFIX}{field_name.upper()}"


def _without_deprecated_cache_key(properties: Mapping[str, Any]) -> dict[str, Any]:
    """Warn about ``cache.max.bytes.buffering``; the new name wins when both are set."""
    rest = {key: value for key, value in properties.items() if key != DEPRECATED_CACHE_KEY}
    if any(key in rest for key in _CACHE_KEYS):
        warnings.warn(
            f'"{DEPRECATED_CACHE_KEY}" is deprecated and ignored here because '
            '"statestore.cache.max.bytes" is also set; remove the old name',
            FutureWarning,
            stacklevel=3,
        )
        return rest
    warnings.warn(
        f'"{DEPRECATED_CACHE_KEY}" is deprecated; rename it to "statestore.cache.max.bytes" '
        "(same meaning: record cache bytes per instance)",
        FutureWarning,
        stacklevel=3,
    )
    return {**rest, "statestore.cache.max.bytes": properties[DEPRECATED_CACHE_KEY]}


def _without_deprecated_handler_keys(properties: Mapping[str, Any]) -> dict[str, Any]:
    """Kafka's ``default.``-prefixed handler names (before 4.0): warn, and use them under
    today's name unless that is set too (then it wins, as in Kafka Streams)."""
    renamed = dict(properties)
    for old, new in DEPRECATED_HANDLER_KEYS.items():
        if old not in renamed:
            continue
        value = renamed.pop(old)
        if new in renamed or new.replace(".", "_") in renamed:
            warnings.warn(
                f'"{old}" is deprecated and ignored here because "{new}" is also set; '
                "remove the old name",
                FutureWarning,
                stacklevel=3,
            )
            continue
        warnings.warn(
            f'"{old}" is deprecated; rename it to "{new}" (same meaning, Kafka 4.0\'s name)',
            FutureWarning,
            stacklevel=3,
        )
        renamed[new] = value
    return renamed


def read_settings_file(path: Path) -> dict[str, Any]:
    """Settings from ``key=value`` lines (``.properties``) or a YAML mapping (``.yml``)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError("(file)", str(path), "a readable settings file", hint=str(exc)) from None
    if path.suffix in (".yaml", ".yml"):
        try:
            document = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError("(file)", str(path), "valid YAML", hint=str(exc)) from None
        if not isinstance(document, dict):
            raise ConfigError("(file)", str(path), "a YAML mapping of setting names to values")
        return {str(key): value for key, value in document.items()}
    settings: dict[str, Any] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        separator = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if separator < 0:
            raise ConfigError(
                f"{path}:{number}", line, "key=value lines", hint="comments start with #"
            )
        settings[line[:separator].strip()] = line[separator + 1 :].strip()
    return settings


# Field names are the Kafka names with dots as underscores (see _setting).
_FIELD_KEYS = {name: name.replace("_", ".") for name in StreamsConfig.model_fields}

_FIELD_OF_KEY = {key: name for name, key in _FIELD_KEYS.items()}

# Every name a setting may be given by (Kafka's, underscores, deprecated aliases) -> field.
_FIELD_OF_ALIAS = {
    alias: name
    for name, field in StreamsConfig.model_fields.items()
    for alias in getattr(field.validation_alias, "choices", ())
    if isinstance(alias, str)
}


def cluster_settings_schema() -> dict[str, dict[str, Any]]:
    """The JSON schema of each setting a cluster may set, by its Kafka name, in field order:
    what the CRD's spec.config is made of (types, bounds, enums, defaults, descriptions)."""
    schema = StreamsConfig.model_json_schema(by_alias=True, mode="validation")
    definitions: dict[str, Any] = schema.get("$defs", {})
    return {
        key: _inlined(node, definitions)
        for key, node in schema["properties"].items()
        if node.pop(CLUSTER_MARK, False)
    }


def _inlined(node: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    """``node`` with its ``$ref`` (an enum's) replaced by the definition; the node's own
    keys (description, default) win over the definition's."""
    if "anyOf" in node:
        node = {**node, "anyOf": [_inlined(option, definitions) for option in node["anyOf"]]}
    if "$ref" not in node:
        return node
    rest = {k: v for k, v in node.items() if k != "$ref"}
    return {**definitions[node["$ref"].rsplit("/", 1)[-1]], **rest}


# The names a StreamApp on a cluster may set in spec.config (the fields marked cluster=True).
CLUSTER_SETTINGS = tuple(cluster_settings_schema())


def unknown_setting_error(key: str, value: object, known: Iterable[str]) -> ConfigError:
    """The one rule for a setting name nobody knows: list the known names, suggest the closest.

    Shared by StreamsConfig (every setting a run reads) and the StreamApp model (the settings
    a cluster may set), so a typo reads the same wherever it is caught.
    """
    names = sorted(known)
    closest = difflib.get_close_matches(key, names, n=1)
    hint = f'did you mean "{closest[0]}"?' if closest else "check the spelling"
    return ConfigError(key, value, f"the known settings {one_of(names)}", hint=hint)


def _config_error_from(
    exc: ValidationError, properties: Mapping[str, Any], environ: Mapping[str, str]
) -> ConfigError:
    """Turn pydantic's first complaint into our error: the key, the value, what is accepted."""
    first = exc.errors()[0]
    # Our own validators raise ConfigError (a ValueError); pydantic wraps it.
    original = first.get("ctx", {}).get("error")
    location = str(first["loc"][0]) if first["loc"] else "?"
    # pydantic reports the alias the user wrote, or the field name.
    field_name = _FIELD_OF_KEY.get(location, location)
    key = _FIELD_KEYS.get(field_name, location)
    variable = environment_variable(field_name)
    if variable in environ:
        # The environment overrode the setting: the bad value is the variable's.
        accepted = (
            original.accepted
            if isinstance(original, ConfigError)
            else first["msg"].removeprefix("Input should be ")
        )
        return ConfigError(
            variable,
            environ[variable],
            accepted,
            hint=f'it overrides "{key}" of every manifest and config file; fix or unset it',
        )
    if isinstance(original, ConfigError):
        return original
    value = properties.get(key, properties.get(location, first.get("input")))
    if first["type"] == "extra_forbidden":
        return unknown_setting_error(location, value, _FIELD_KEYS.values())
    if field_name == "processing_guarantee":
        return ConfigError(key, value, one_of(g.value for g in ProcessingGuarantee))
    accepted = first["msg"].removeprefix("Input should be ")
    if accepted.startswith(("greater", "less")):
        accepted = f"numbers {accepted}"
    return ConfigError(key, value, accepted)
