"""Keys land where Kafka's default partitioner would put them."""

from __future__ import annotations

import pytest

from eddyline_runtime.partitions import (
    TopicPartition,
    changelog_topic,
    is_changelog_of,
    murmur2,
    partition_for_key,
)


@pytest.mark.parametrize(
    ("data", "expected"),
    [  # Kafka's own test vectors for Utils.murmur2
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
def test_murmur2_matches_kafka(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


def test_partition_for_key_is_stable_and_in_range() -> None:
    assert partition_for_key(b"21", 4) == (-973932308 & 0x7FFFFFFF) % 4
    assert {partition_for_key(b"k%d" % i, 3) for i in range(100)} == {0, 1, 2}


def test_topic_partitions_print_as_kafka_does() -> None:
    assert str(TopicPartition("app-counts-changelog", 3)) == "app-counts-changelog-3"


def test_a_changelog_is_named_as_kafka_streams_names_it_and_found_by_its_store() -> None:
    topic = changelog_topic("app", "counts")
    assert topic == "app-counts-changelog"
    assert is_changelog_of(topic, "counts")
    assert not is_changelog_of(topic, "other")
    assert not is_changelog_of("app-counts", "counts")
