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

from eddyline_runtime.log import Record, open_log
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.query.client import QueryFailedError, QueryRouter

INPUT = "text-lines"
STORE = "word-counts"
PARTITIONS = 4


def random_lines(rng: random.Random, words: Sequence[str], count: int, most: int) -> list[str]:
    """``count`` lines of 1..``most`` words drawn from ``words``."""
    return [" ".join(rng.choices(words, k=rng.randint(1, most))) for _ in range(count)]


def produce_lines(log_url: str, lines: Sequence[str]) -> None:
    """Keyless lines round-robin over the input's partitions, through a log of their own."""
    log = open_log(log_url)
    try:
        now = int(time.time() * 1000)
        for partition in range(PARTITIONS):
            records = [Record(None, line.encode(), now) for line in lines[partition::PARTITIONS]]
            log.produce(TopicPartition(INPUT, partition), records)
    finally:
        log.close()


def counts_exact(router: QueryRouter, expected: Counter[str]) -> bool:
    """Whether every word's count, asked through ``router``, is the expected one."""
    for word, count in expected.items():
        try:
            result = router.get(STORE, word)
        except QueryFailedError:
            return False
        if not result.found or int(result.value) != count:
            return False
    return True
