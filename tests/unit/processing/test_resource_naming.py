"""``ensure.explicit.internal.resource.naming`` (KIP-1111): a topology whose stores or
internal topics carry generated names is refused, every one listed at once, in Kafka's
words, with the DSL call that made each and the parameter that names it."""

from __future__ import annotations

from typing import Any

import pytest

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.processing import (
    BufferConfig,
    JoinWindows,
    KStream,
    KTable,
    StreamsBuilder,
    Suppressed,
    TimeWindows,
    TopologyError,
)
from eddyline_runtime.resource_names import ResourceKind
from eddyline_runtime.testing import TopologyTestDriver

NAMING = "ensure.explicit.internal.resource.naming"
GROUP_BY_TOPIC = "KSTREAM-AGGREGATE-STATE-STORE-0000000002-repartition"


def _by_value(key: Any, value: Any) -> Any:
    return value


def _add(key: Any, value: Any, total: Any) -> Any:
    return total + 1


def _joined(left: Any, right: Any) -> Any:
    return f"{left}|{right}"


def _refusal(builder: StreamsBuilder) -> str:
    with pytest.raises(TopologyError) as refused:
        builder.build().ensure_explicit_naming()
    return str(refused.value)


def _words(builder: StreamsBuilder) -> KStream:
    return builder.stream("words", key_serde="string", value_serde="string")


def _tables(builder: StreamsBuilder) -> tuple[KTable, KTable]:
    left = builder.table("orders", "orders-store", key_serde="string", value_serde="string")
    right = builder.table("customers", "customers-store", key_serde="string", value_serde="string")
    return left, right


def test_a_count_after_an_unnamed_group_by_is_refused_naming_its_repartition_topic() -> None:
    builder = StreamsBuilder()
    _words(builder).group_by(_by_value).count("counts").to_stream().to("out")
    message = _refusal(builder)
    assert message.splitlines()[0] == (
        "Invalid topology: Following repartition topic(s) has not been named: " + GROUP_BY_TOPIC
    )
    assert "changelog" not in message.splitlines()[0]
    assert f'repartition topic "{GROUP_BY_TOPIC}" (KStream.group_by)' in message
    assert 'group_by(..., repartition_name="<name>")' in message
    # The way to keep the name an app already runs with: pin it.
    assert 'repartition_name="KSTREAM-AGGREGATE-STATE-STORE-0000000002" keeps this name' in message


def test_an_aggregate_after_an_unnamed_group_by_is_refused() -> None:
    builder = StreamsBuilder()
    _words(builder).group_by(_by_value).aggregate(lambda: 0, _add, "totals", "long")
    assert GROUP_BY_TOPIC in _refusal(builder)


def test_a_suppress_buffer_named_after_its_store_is_not_generated() -> None:
    """The buffer is ``<store>-suppress-buffer``: it follows an explicit name, so only the
    unnamed repartition topic before it is refused."""
    builder = StreamsBuilder()
    counts = _words(builder).group_by(_by_value).count("counts")
    counts.suppress(Suppressed.until_time_limit(1_000, BufferConfig.unbounded()))
    message = _refusal(builder)
    assert GROUP_BY_TOPIC in message
    assert "suppress-buffer" not in message
    assert "state store(s)" not in message


def test_an_unnamed_foreign_key_join_is_refused_with_its_store_changelog_and_topics() -> None:
    builder = StreamsBuilder()
    left, right = _tables(builder)
    left.join(right, lambda order: order, _joined).to_stream().to("out")
    lines = _refusal(builder).splitlines()
    store = "KTABLE-FK-JOIN-SUBSCRIPTION-STATE-STORE-0000000008"
    assert lines[:3] == [
        f"Invalid topology: Following changelog topic(s) has not been named: {store}-changelog",
        f"Following state store(s) has not been named: {store}",
        "Following repartition topic(s) has not been named: "
        "KTABLE-FK-JOIN-SUBSCRIPTION-REGISTRATION-0000000004-topic, "
        "KTABLE-FK-JOIN-SUBSCRIPTION-RESPONSE-0000000012-topic",
    ]
    assert any(
        f'state store "{store}" (KTable.join (foreign key)): name the join with name="<name>"'
        in line
        for line in lines
    )


def test_a_left_foreign_key_join_names_its_operation() -> None:
    builder = StreamsBuilder()
    left, right = _tables(builder)
    left.left_join(right, lambda order: order, _joined)
    assert "(KTable.left_join (foreign key))" in _refusal(builder)


def test_every_generated_name_is_listed_in_one_error() -> None:
    """Kafka lists them all, not the first: a user fixes the topology in one pass."""
    builder = StreamsBuilder()
    left, right = _tables(builder)
    left.join(right, lambda order: order, _joined)
    _words(builder).group_by(_by_value).count("counts")
    names = builder.build().generated_names()
    assert [n.kind for n in names] == [
        ResourceKind.REPARTITION_TOPIC,
        ResourceKind.STATE_STORE,
        ResourceKind.REPARTITION_TOPIC,
        ResourceKind.REPARTITION_TOPIC,
    ]
    message = _refusal(builder)
    assert all(f'"{n.name}"' in message for n in names)


def _explicit(builder: StreamsBuilder) -> None:
    """Every shape that makes state or internal topics, each named."""
    words = _words(builder)
    grouped = words.group_by(_by_value, repartition_name="by-word")
    grouped.count("counts").suppress(
        Suppressed.until_time_limit(1_000, BufferConfig.unbounded(), name="held-counts")
    )
    grouped.aggregate(lambda: 0, _add, "totals", "long")
    grouped.windowed_by(TimeWindows.of_size_with_grace(60_000, 0)).emit_final().count("per-min")
    other = builder.stream("other", key_serde="string", value_serde="string")
    words.join(
        other,
        _joined,
        JoinWindows.of_time_difference_without_grace(1_000),
        store_name="words-other",
    )
    words.repartition("rekeyed")
    left, right = _tables(builder)
    left.join(right, _joined, store_name="both")
    left.join(right, lambda order: order, _joined, name="order-customer")


def test_a_topology_naming_everything_passes() -> None:
    builder = StreamsBuilder()
    _explicit(builder)
    topology = builder.build()
    assert topology.generated_names() == []
    topology.ensure_explicit_naming()  # no error


def test_the_setting_is_false_by_default_and_read_by_its_kafka_name() -> None:
    assert not StreamsConfig.from_properties({"application.id": "a"}, environ={}).model_dump()[
        "ensure_explicit_internal_resource_naming"
    ]
    config = StreamsConfig.from_properties({"application.id": "a", NAMING: "true"}, environ={})
    assert config.ensure_explicit_internal_resource_naming


def test_the_test_driver_refuses_generated_names_only_when_the_setting_is_true() -> None:
    builder = StreamsBuilder()
    _words(builder).group_by(_by_value).count("counts").to_stream().to("out")
    with TopologyTestDriver(builder.build()):
        pass  # the default, as in Kafka: generated names are allowed
    with pytest.raises(TopologyError, match="repartition topic\\(s\\) has not been named"):
        TopologyTestDriver(builder.build(), {NAMING: True})


def test_the_test_driver_runs_an_explicitly_named_topology_with_the_setting() -> None:
    builder = StreamsBuilder()
    _words(builder).group_by(_by_value, repartition_name="by-word").count("counts")
    with TopologyTestDriver(builder.build(), {NAMING: True}) as driver:
        driver.create_input_topic("words").pipe_input("k", "a")
        assert driver.get_key_value_store("counts").get("a") == 1
