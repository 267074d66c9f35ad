"""``Materialized``: how an aggregation or a table keeps its store (Kafka Streams'
``Materialized``).

A value names the store and may give its key and value serdes (names, as
everywhere in the DSL: ``"string"``, ``"long"``, ``"json"``...), the retention
of a window or session store, and whether the store has a record cache in front
of it::

    Materialized.as_("counts").with_value_serde("long").with_caching_disabled()

Every DSL method taking a store name also takes a ``Materialized``; a plain
name is ``Materialized.as_(name)``. The serdes default to the operation's
(the grouped stream's key serde, the aggregation's value serde).

Retention (window and session stores only) defaults to Kafka Streams' minimum:
window size + grace for time windows, inactivity gap + grace for sessions,
2 * time difference + grace for sliding windows. A shorter one is refused when
the topology is built, with Kafka Streams' message: those windows would expire
from the store before they close. A longer one keeps closed windows queryable
for longer.

Caching (the KIP-63 record cache) is on unless disabled: with it, a store's
updates between two commits reach the store and downstream once per key; with
it off every update is written and forwarded.

A table may keep every version of a key, not only the latest:
``Materialized.as_versioned("prices", history_retention_ms=3_600_000)`` (Kafka's
``Materialized.as(Stores.persistentVersionedKeyValueStore("prices", ofHours(1)))``,
KIP-889). A stream joined with such a table meets the table's value as of each
record's timestamp (KIP-914). A versioned store has no record cache (as in Kafka:
``with_caching_enabled`` on one is refused) and is for ``builder.table`` only so far.

Logging (the store's changelog topic) is on unless disabled. A store without a
changelog survives a clean restart on the same disk, but nothing can rebuild it:
a run refuses it with standbys configured or under exactly-once
(``eddyline_runtime.engine.instance.refuse_unlogged_stores``).
``with_logging_enabled(configs)`` gives the changelog topic's configs at creation
(Kafka's ``withLoggingEnabled(topicConfig)``); a key-value store's changelog is
``cleanup.policy=compact`` unless they say ``compact,delete`` with a
``retention.ms``, and a window or session store's is Kafka's ``compact,delete``
with the store's retention plus ``windowstore.changelog.additional.retention.ms``
(``engine/topics.py`` applies both, on the embedded log and on a broker). Configs
eddyline would not apply as asked are refused naming the store
(:func:`check_changelog_configs`), not dropped. A ``retention.ms`` given is set on
the changelog at every start, an existing one included; dropping it from the configs
later does not set the topic back to ``compact`` (do that with the broker's tools).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from eddyline_runtime.processing.topology import TopologyError
from eddyline_runtime.processing.windows import SessionWindows, SlidingWindows, TimeWindows


@dataclass(frozen=True, slots=True)
class Materialized:
    """A store's name, serdes, retention and caching; build with :meth:`as_`."""

    store_name: str
    key_serde: str | None = None
    value_serde: str | None = None
    retention_ms: int | None = None
    caching_enabled: bool = True
    logging_enabled: bool = True
    # A versioned store's history retention (KIP-889); None: not versioned.
    history_retention_ms: int | None = None
    # The changelog topic's configs given to with_logging_enabled, as sorted pairs.
    logging_configs: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.store_name, str) or not self.store_name:
            raise TopologyError(
                f"Materialized needs a non-empty store name, got {self.store_name!r}: it names "
                "the store's directory and changelog, which must not change when the "
                "topology changes elsewhere"
            )
        if self.retention_ms is not None and (
            type(self.retention_ms) is not int or self.retention_ms < 0
        ):
            raise TopologyError(
                f'store "{self.store_name}": retention {self.retention_ms!r} is not a number '
                "of milliseconds >= 0"
            )
        if self.history_retention_ms is not None:
            if type(self.history_retention_ms) is not int or self.history_retention_ms < 0:
                raise TopologyError(
                    f'versioned store "{self.store_name}": history retention '
                    f"{self.history_retention_ms!r} is not a number of milliseconds >= 0; "
                    "give how long old versions stay queryable"
                )
            if self.caching_enabled:
                raise TopologyError(
                    f'versioned store "{self.store_name}": a versioned store has no record '
                    "cache (as in Kafka Streams); drop with_caching_enabled"
                )
        check_changelog_configs(self.store_name, dict(self.logging_configs))

    @classmethod
    def as_(cls, store_name: str) -> Materialized:
        """Kafka Streams' ``Materialized.as(storeName)``."""
        return cls(store_name)

    @classmethod
    def as_versioned(cls, store_name: str, history_retention_ms: int) -> Materialized:
        """A versioned key-value store keeping old versions ``history_retention_ms`` long
        (Kafka's ``Stores.persistentVersionedKeyValueStore(name, historyRetention)``)."""
        return cls(store_name, caching_enabled=False, history_retention_ms=history_retention_ms)

    def with_key_serde(self, serde: str) -> Materialized:
        return replace(self, key_serde=serde)

    def with_value_serde(self, serde: str) -> Materialized:
        return replace(self, value_serde=serde)

    def with_retention(self, retention_ms: int) -> Materialized:
        """How long a window or session store keeps windows (milliseconds)."""
        return replace(self, retention_ms=retention_ms)

    def with_caching_enabled(self) -> Materialized:
        return replace(self, caching_enabled=True)

    def with_caching_disabled(self) -> Materialized:
        """Write and forward every update (no record cache in front of this store)."""
        return replace(self, caching_enabled=False)

    def with_logging_enabled(self, configs: Mapping[str, str] | None = None) -> Materialized:
        """A changelog (the default), created with ``configs`` (Kafka's
        ``withLoggingEnabled(topicConfig)``): see :func:`check_changelog_configs`."""
        pairs = tuple(sorted((configs or {}).items()))
        return replace(self, logging_enabled=True, logging_configs=pairs)

    def with_logging_disabled(self) -> Materialized:
        """No changelog: the store lives on this member's disk only. A run refuses it
        where a changelog is needed (standbys, exactly-once recovery)."""
        return replace(self, logging_enabled=False, logging_configs=())


# The changelog configs eddyline applies, on the embedded log and on a broker (through
# Log.create_topic and Log.set_topic_retention). Others are refused rather than dropped.
CHANGELOG_CONFIGS = ("cleanup.policy", "retention.ms")


def check_changelog_configs(store: str, configs: Mapping[str, str]) -> None:
    """Refuse changelog configs eddyline would not apply as asked.

    A key-value store's changelog is ``cleanup.policy=compact`` (Kafka's default);
    ``{"cleanup.policy": "compact,delete", "retention.ms": "<ms>"}`` also deletes
    records older than that. ``delete`` alone is refused (the changelog would
    lose keys that were never updated, and a restore would lose them with it), and
    ``retention.ms`` without ``delete`` in the policy is refused (a compacted
    topic ignores it). A window or session store's changelog is set from the
    store's retention (see docs/windows.md) and takes none of these."""
    for key, value in configs.items():
        if key not in CHANGELOG_CONFIGS:
            raise TopologyError(
                f'store "{store}": changelog config {key!r} is not one eddyline applies '
                f"(it applies {', '.join(CHANGELOG_CONFIGS)}); set it on the topic with the "
                "broker's tools (kafka-configs.sh --alter --entity-type topics), or drop it"
            )
        if not isinstance(value, str):
            raise TopologyError(
                f'store "{store}": changelog config {key}={value!r} must be a string, as '
                f'Kafka topic configs are ({key}="{value}")'
            )
    policy = configs.get("cleanup.policy", "compact")
    if policy not in ("compact", "compact,delete"):
        raise TopologyError(
            f'store "{store}": changelog cleanup.policy={policy!r}: a changelog is '
            '"compact" or "compact,delete"; "delete" alone would drop keys never updated '
            "since, and a restore of the store with them"
        )
    retention = configs.get("retention.ms")
    if policy == "compact,delete" and retention is None:
        raise TopologyError(
            f'store "{store}": cleanup.policy=compact,delete deletes by age: give '
            '"retention.ms" too (milliseconds)'
        )
    if retention is not None:
        if policy != "compact,delete":
            raise TopologyError(
                f'store "{store}": retention.ms on a changelog that is only compacted does '
                'nothing: add "cleanup.policy": "compact,delete", or drop retention.ms'
            )
        if not retention.isdigit():
            raise TopologyError(
                f'store "{store}": changelog retention.ms={retention!r} is not a number of '
                "milliseconds >= 0"
            )


def as_materialized(store: str | Materialized) -> Materialized:
    """A DSL method's ``store`` argument as a ``Materialized``."""
    if isinstance(store, Materialized):
        return store
    if not isinstance(store, str):
        raise TopologyError(
            f"a store is given by name or as Materialized.as_(name)..., got {type(store).__name__}"
        )
    return Materialized.as_(store)


def key_value_store(materialized: Materialized, *, versioned: bool = False) -> Materialized:
    """Refuse what a key-value store cannot have: a retention; and a versioned store
    where the operation cannot keep one (``versioned``: it can)."""
    if materialized.history_retention_ms is not None and not versioned:
        raise TopologyError(
            f'store "{materialized.store_name}": Materialized.as_versioned is supported '
            "for builder.table only so far (aggregations, table filters and joins keep "
            "their latest values); use Materialized.as_ here"
        )
    if materialized.retention_ms is not None:
        raise TopologyError(
            f'store "{materialized.store_name}": with_retention applies to window and '
            "session stores; a key-value store keeps every key until it is deleted. "
            "Drop with_retention"
        )
    return materialized


def store_retention_ms(
    materialized: Materialized, windows: TimeWindows | SessionWindows | SlidingWindows
) -> int:
    """The retention of a windowed aggregation's store: the one given, at least Kafka
    Streams' minimum for ``windows`` (the minimum when none is given)."""
    name, given = materialized.store_name, materialized.retention_ms
    retention = windows.retention_ms if given is None else given
    if retention >= windows.retention_ms:
        return retention
    if isinstance(windows, SlidingWindows):
        raise TopologyError(
            f"The retention period of the window store {name} must be no smaller than "
            f"2 * time difference plus the grace period. Got time difference="
            f"[{windows.time_difference_ms}], grace=[{windows.grace_ms}], "
            f"retention=[{retention}]"
        )
    if isinstance(windows, TimeWindows):
        raise TopologyError(
            f"The retention period of the window store {name} must be no smaller than its "
            f"window size plus the grace period. Got size=[{windows.size_ms}], "
            f"grace=[{windows.grace_ms}], retention=[{retention}]"
        )
    raise TopologyError(
        f"The retention period of the session store {name} must be no smaller than the "
        f"session inactivity gap plus the grace period. Got gap=[{windows.gap_ms}], "
        f"grace=[{windows.grace_ms}], retention=[{retention}]"
    )
