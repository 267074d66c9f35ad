"""A backfill's changelog write that stops mid-transaction, to be SIGKILLed there.

``python -m tests.support.backfill_kill LOG_URL TOPIC_PREFIX CHANGELOG READY [--supersede]``
writes :func:`contents` to partition 0 of ``CHANGELOG`` with the backfill's own
writer, as the job's task does (replacing an earlier state with ``--supersede``);
after more than one send (so on Kafka records of the open transaction are on the
broker) the contents stop coming: the script creates ``READY`` and waits to be
killed.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from eddyline_runtime.backfill.changelog_writer import SEND_RECORDS, write_store_changelog
from eddyline_runtime.log import Log, open_log
from eddyline_runtime.partitions import TopicPartition

RECORDS: Final = 25_000
STALL_AFTER: Final = SEND_RECORDS + 5_000
TRANSACTIONAL_ID: Final = "kill-test-backfill-store-0"


def contents() -> Iterator[tuple[bytes, bytes]]:
    """A store partition's contents, in key order."""
    for index in range(RECORDS):
        yield f"key-{index:06d}".encode(), f"value-{index}".encode()


def open_test_log(url: str, prefix: str) -> Log:
    if url.startswith("kafka://"):
        from eddyline_runtime.log.kafka import KafkaLog

        return KafkaLog.open(url, {}, topic_prefix=prefix)
    return open_log(url)


def main(argv: list[str]) -> None:
    url, prefix, topic, ready, *options = argv

    def stalling() -> Iterator[tuple[bytes, bytes]]:
        for index, item in enumerate(contents()):
            if index == STALL_AFTER:
                Path(ready).write_text("mid-write", encoding="utf-8")
                threading.Event().wait()  # until SIGKILL
            yield item

    log = open_test_log(url, prefix)
    write_store_changelog(
        log,
        TopicPartition(topic, 0),
        stalling,
        transactional_id=TRANSACTIONAL_ID,
        build_id="kill-test",
        supersede="--supersede" in options,
    )
    raise SystemExit("the write finished: it was meant to be killed mid-write")


if __name__ == "__main__":
    main(sys.argv[1:])
