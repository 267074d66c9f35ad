"""The rule an upgrade compares two revisions' generated names by
(``resource_names.moved_names``), on pairs of real topologies: a generated name whose
meaning moved, or generated names renumbered, refuse; explicit names, edits that leave
the numbering alone, and plain additions or removals do not."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eddyline_runtime.membership import MemberReport
from eddyline_runtime.processing import KStream, StreamsBuilder
from eddyline_runtime.resource_names import GeneratedName, moved_names


def _by_value(key: Any, value: Any) -> Any:
    return value


def _keep(key: Any, value: Any) -> bool:
    return value is not None


def _joined(left: Any, right: Any) -> Any:
    return f"{left}|{right}"


def names(build: Callable[[StreamsBuilder], None]) -> list[GeneratedName]:
    builder = StreamsBuilder()
    build(builder)
    return builder.build().generated_names()


def _words(builder: StreamsBuilder, topic: str = "words") -> KStream:
    return builder.stream(topic, key_serde="string", value_serde="string")


def counts(*, filtered: bool = False, repartition_name: str | None = None) -> Any:
    def build(builder: StreamsBuilder) -> None:
        words = _words(builder)
        if filtered:
            words = words.filter(_keep)
        grouped = words.group_by(_by_value, repartition_name=repartition_name)
        grouped.count("word-counts").to_stream().to("out")

    return build


def test_a_filter_inserted_before_an_aggregation_shifts_its_generated_topic_and_refuses() -> None:
    before, after = names(counts()), names(counts(filtered=True))
    assert [n.name for n in before] == ["KSTREAM-AGGREGATE-STATE-STORE-0000000002-repartition"]
    assert [n.name for n in after] == ["KSTREAM-AGGREGATE-STATE-STORE-0000000003-repartition"]
    (problem,) = moved_names(before, after)
    assert "KSTREAM-AGGREGATE-STATE-STORE-0000000002-repartition" in problem
    assert "vanished while" in problem
    assert "KSTREAM-AGGREGATE-STATE-STORE-0000000003-repartition" in problem
    assert 'repartition_name="<name>"' in problem
    # The pin suggested is the old name, which keeps the old topic's records.
    assert 'repartition_name="KSTREAM-AGGREGATE-STATE-STORE-0000000002" keeps' in problem
    assert 'repartition_name="KSTREAM-AGGREGATE-STATE-STORE-0000000003"' not in problem


def test_the_same_edit_with_a_named_repartition_topic_is_allowed() -> None:
    before = names(counts(repartition_name="by-word"))
    after = names(counts(filtered=True, repartition_name="by-word"))
    assert before == after == []
    assert moved_names(before, after) == []


def test_pinning_the_old_generated_name_explicitly_allows_the_edit() -> None:
    """The way out that keeps the records in flight: the new revision names its topic as
    the old one was generated."""
    before = names(counts())
    pinned = "KSTREAM-AGGREGATE-STATE-STORE-0000000002"
    after = names(counts(filtered=True, repartition_name=pinned))
    assert after == []
    assert moved_names(before, after) == []


def test_an_unchanged_topology_and_an_edit_after_the_names_are_allowed() -> None:
    assert moved_names(names(counts()), names(counts())) == []

    def more_downstream(builder: StreamsBuilder) -> None:
        counted = _words(builder).group_by(_by_value).count("word-counts")
        counted.to_stream().filter(_keep).to("out")

    assert moved_names(names(counts()), names(more_downstream)) == []


def test_the_same_generated_name_on_another_operation_refuses() -> None:
    """A new stream's group_by built first takes the old one's number: same name, other
    input. Its records (and the old stream's in flight) would be read as the other's."""

    def two_streams(builder: StreamsBuilder) -> None:
        _words(builder, "clicks").group_by(_by_value).count("click-counts")
        _words(builder).group_by(_by_value).count("word-counts")

    problems = moved_names(names(counts()), names(two_streams))
    moved = [p for p in problems if "now means another operation" in p]
    assert len(moved) == 1
    assert "KSTREAM-AGGREGATE-STATE-STORE-0000000002-repartition" in moved[0]
    assert "reading [words] before" in moved[0] and "reading [clicks] now" in moved[0]


def test_removing_or_adding_an_unnamed_operation_alone_is_allowed() -> None:
    def nothing_grouped(builder: StreamsBuilder) -> None:
        _words(builder).to("out")

    assert moved_names(names(counts()), names(nothing_grouped)) == []
    assert moved_names(names(nothing_grouped), names(counts())) == []


def fk_join(*, filtered: bool = False, name: str | None = None) -> Any:
    def build(builder: StreamsBuilder) -> None:
        if filtered:
            _words(builder, "audit").filter(_keep).to("audited")
        left = builder.table("orders", "orders", key_serde="string", value_serde="string")
        right = builder.table("customers", "customers", key_serde="string", value_serde="string")
        left.join(right, lambda order: order, _joined, name=name).to_stream().to("out")

    return build


def test_a_foreign_key_join_renumbered_by_an_earlier_edit_refuses_naming_its_store() -> None:
    problems = moved_names(names(fk_join()), names(fk_join(filtered=True)))
    stores = [p for p in problems if p.startswith("generated state store")]
    (store,) = stores
    assert "KTABLE-FK-JOIN-SUBSCRIPTION-STATE-STORE-0000000008" in store
    assert 'name="<name>"' in store
    assert any(p.startswith("generated repartition topic") for p in problems)
    named = names(fk_join(name="orders-customers"))
    assert moved_names(named, names(fk_join(filtered=True, name="orders-customers"))) == []


def test_generated_names_travel_in_a_member_report() -> None:
    report = MemberReport(
        member="wc-0",
        topology_hash="h",
        tasks=frozenset(),
        stateful=frozenset(),
        stores={},
        ready=True,
        generated_names=tuple(names(fk_join())),
    )
    again = MemberReport.from_json(report.to_json())
    assert again.generated_names == report.generated_names
    older = report.to_json()
    del older["generated_names"]
    assert MemberReport.from_json(older).generated_names == ()


def test_an_old_generated_name_pinned_explicitly_is_kept_while_another_appears() -> None:
    """Revision 2 pins revision 1's topic by name and adds an unnamed group_by: nothing was
    renumbered away, since the old name is still there (explicitly)."""
    pinned = "KSTREAM-AGGREGATE-STATE-STORE-0000000002"

    def pinned_and_more(builder: StreamsBuilder) -> None:
        words = _words(builder).filter(_keep)
        words.group_by(_by_value, repartition_name=pinned).count("word-counts")
        _words(builder, "clicks").group_by(_by_value).count("click-counts")

    builder = StreamsBuilder()
    pinned_and_more(builder)
    topology = builder.build()
    kept = {*topology.stores, *topology.internal_topics}
    before, after = names(counts()), topology.generated_names()
    assert moved_names(before, after, still_named=kept) == []
    # Without knowing what the new revision names explicitly, it looks renumbered.
    assert moved_names(before, after) != []
