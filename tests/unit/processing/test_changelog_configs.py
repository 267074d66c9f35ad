"""``Materialized.with_logging_enabled(configs)``: a store's changelog created with its
configs, on the embedded log and through Kafka's admin client (a fake broker here), and
the configs eddyline would not apply as asked refused with the store named."""

from __future__ import annotations

from pathlib import Path

import pytest

from eddyline_runtime.engine.topics import resolve_topics
from eddyline_runtime.log import SqliteLog
from eddyline_runtime.processing import (
    Materialized,
    StreamsBuilder,
    TimeWindows,
    TopologyError,
)
from tests.support.kafka.fake_clients import FakeBroker, fake_log

DAY = 86_400_000


def _counting(materialized: Materialized) -> StreamsBuilder:
    builder = StreamsBuilder()
    builder.stream("input", key_serde="string").group_by_key().count(materialized)
    return builder


def test_a_key_value_changelog_is_compacted_by_default(tmp_path: Path) -> None:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("input", 2)
    resolve_topics(_counting(Materialized.as_("kv")).build(), "app", log)
    assert log.topics()["app-kv-changelog"].compacted
    assert log.topic_retention("app-kv-changelog") is None


def test_compact_delete_with_retention_reaches_the_embedded_log(tmp_path: Path) -> None:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("input", 2)
    configs = {"cleanup.policy": "compact,delete", "retention.ms": "3600000"}
    materialized = Materialized.as_("kv").with_logging_enabled(configs)
    resolve_topics(_counting(materialized).build(), "app", log)
    assert log.topics()["app-kv-changelog"].compacted
    assert log.topic_retention("app-kv-changelog") == 3_600_000


def test_compact_delete_with_retention_reaches_the_broker() -> None:
    """Through the Kafka adapter's admin client: the topic's described configs."""
    broker = FakeBroker()
    broker.topics["input"] = (2, {"cleanup.policy": "delete"})
    configs = {"cleanup.policy": "compact,delete", "retention.ms": "3600000"}
    materialized = Materialized.as_("kv").with_logging_enabled(configs)
    log = fake_log(broker)
    resolve_topics(_counting(materialized).build(), "app", log)
    partitions, topic_configs = broker.topics["app-kv-changelog"]
    assert partitions == 2
    assert topic_configs["cleanup.policy"] == "compact,delete"
    assert topic_configs["retention.ms"] == "3600000"
    assert log.topic_retention("app-kv-changelog") == 3_600_000


def test_a_window_changelog_keeps_kafkas_retention_rule(tmp_path: Path) -> None:
    """Kafka's WindowedChangelogTopicConfig: retention + additional retention, compact,delete."""
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("input", 1)
    builder = StreamsBuilder()
    builder.stream("input", key_serde="string").group_by_key().windowed_by(
        TimeWindows.of_size_with_grace(10, 5)
    ).count("windows")
    resolve_topics(builder.build(), "app", log, window_changelog_additional_retention_ms=DAY)
    assert log.topics()["app-windows-changelog"].compacted
    assert log.topic_retention("app-windows-changelog") == 15 + DAY


def test_a_window_store_refuses_changelog_configs() -> None:
    builder = StreamsBuilder()
    windowed = (
        builder.stream("input").group_by_key().windowed_by(TimeWindows.of_size_with_grace(10, 5))
    )
    configs = {"cleanup.policy": "compact,delete", "retention.ms": "5"}
    with pytest.raises(TopologyError, match=r'store "w".*with_retention'):
        windowed.count(Materialized.as_("w").with_logging_enabled(configs))


@pytest.mark.parametrize(
    ("configs", "message"),
    [
        ({"segment.bytes": "1024"}, r"'segment.bytes' is not one eddyline applies.*kafka-configs"),
        ({"cleanup.policy": "delete"}, "would drop keys never updated"),
        ({"cleanup.policy": "compact,delete"}, 'give "retention.ms" too'),
        ({"retention.ms": "5"}, "only compacted does nothing"),
        ({"cleanup.policy": "compact,delete", "retention.ms": "soon"}, "not a number"),
        ({"retention.ms": 5}, "must be a string"),
    ],
)
def test_changelog_configs_eddyline_would_not_apply_are_refused(
    configs: dict[str, str], message: str
) -> None:
    with pytest.raises(TopologyError, match=rf'store "kv".*{message}'):
        Materialized.as_("kv").with_logging_enabled(configs)


def test_logging_disabled_drops_the_configs() -> None:
    """Kafka's withLoggingDisabled clears the topic config given before."""
    configs = {"cleanup.policy": "compact"}
    materialized = Materialized.as_("kv").with_logging_enabled(configs).with_logging_disabled()
    assert materialized.logging_configs == ()
    assert not materialized.logging_enabled
