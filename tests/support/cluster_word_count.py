"""The word-count example on a cluster, seen from outside: its input and its exact counts.

The operator's e2e tests and benchmark write random lines straight into the
app's log (``text-lines``, four partitions) and read the counts back through
the query Service, as a user of the example would.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Sequence

from eddyline_runtime.log import Log, Record, open_log
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.query.client import QueryFailedError, QueryRouter

INPUT = "text-lines"
STORE = "word-counts"
PARTITIONS = 4


def random_lines(rng: random.Random, words: Sequence[str], count: int, most: int) -> list[str]:
    """``count`` lines of 1..``most`` words drawn from ``words``."""
    return [" ".join(rng.choices(words, k=rng.randint(1, most))) for _ in range(count)]


def create_input_topic(log_url: str) -> None:
    """The input topic (``text-lines``, four partitions) on the log at ``log_url``, before
    the app starts; one already there (a broker other modules share) is kept as it is."""
    log = open_log(log_url)
    try:
        log.create_topic(INPUT, PARTITIONS)
    finally:
        log.close()


def produce_lines(log_url: str, lines: Sequence[str]) -> None:
    """Keyless lines round-robin over the input's partitions, through a log of their own."""
    log = open_log(log_url)
    try:
        write_lines(log, lines)
    finally:
        log.close()


def write_lines(log: Log, lines: Sequence[str]) -> None:
    """Keyless lines round-robin over the input's partitions, through an open ``log`` (a
    producer thread keeps one open instead of opening one a batch)."""
    now = int(time.time() * 1000)
    for partition in range(PARTITIONS):
        records = [Record(None, line.encode(), now) for line in lines[partition::PARTITIONS]]
        log.produce(TopicPartition(INPUT, partition), records)


def counts_exact(router: QueryRouter, expected: Counter[str]) -> bool:
    """Whether every word's count, asked through ``router``, is the expected one."""
    return first_mismatch(router, expected) is None


def first_mismatch(router: QueryRouter, expected: Counter[str]) -> str | None:
    """The first word (in order) whose count, asked through ``router``, is not the expected
    one, with what the router answered; None when every count is exact."""
    for word, count in sorted(expected.items()):
        try:
            result = router.get(STORE, word)
        except QueryFailedError as error:
            return f"{word}: {error}"
        if not result.found or int(result.value) != count:
            return f"{word}: {result} (expected {count})"
    return None
