"""Child process for the multi-process log tests: one writer on a shared SQLite log.

``produce URL TXID COUNT BATCH``: open a producer for TXID, print ``ready``, wait
for ``go`` on stdin, then commit COUNT records to :data:`SHARED` in transactions
of BATCH, pausing briefly after each. Record ``i`` has key TXID and value ``i``.
Prints ``done``.

``zombie URL TXID``: open a producer for TXID, begin, send :data:`ZOMBIE_RECORDS`
to :data:`SHARED` and :data:`ZOMBIE_ONLY` and offsets :data:`ZOMBIE_OFFSETS`,
print ``sent EPOCH``, wait for ``commit`` on stdin, then try to commit. Prints
``fenced`` and exits 0 on ProducerFencedError, prints ``committed`` and exits
:data:`COMMITTED_EXIT` if the commit went through.
"""

from __future__ import annotations

import sys
import time

from eddyline_runtime.log import ProducerFencedError, Record, open_log
from eddyline_runtime.partitions import TopicPartition

SHARED = TopicPartition("shared-output", 0)
ZOMBIE_ONLY = TopicPartition("shared-output", 1)
INPUT = TopicPartition("shared-input", 0)
GROUP = "app"
ZOMBIE_RECORDS = 3
ZOMBIE_OFFSETS = {INPUT: 99}
COMMITTED_EXIT = 3
# A writer pauses after each commit so the other gets the lock: SQLite does not queue
# waiting writers, and without it one writer tends to run all its commits first.
PAUSE_SECONDS = 0.002


def say(line: str) -> None:
    print(line, flush=True)


def expect_on_stdin(word: str) -> None:
    line = sys.stdin.readline().strip()
    if line != word:
        raise SystemExit(f"expected {word!r} on stdin, got {line!r}")


def produce(url: str, txid: str, count: int, batch: int) -> None:
    log = open_log(url)
    producer = log.transactional_producer(txid)
    say("ready")
    expect_on_stdin("go")
    for start in range(0, count, batch):
        producer.begin()
        for i in range(start, min(start + batch, count)):
            producer.send(SHARED, Record(txid.encode(), b"%d" % i, i))
        producer.commit()
        time.sleep(PAUSE_SECONDS)
    producer.close()
    log.close()
    say("done")


def zombie(url: str, txid: str) -> None:
    log = open_log(url)
    producer = log.transactional_producer(txid)
    producer.begin()
    for i in range(ZOMBIE_RECORDS):
        producer.send(SHARED, Record(b"zombie", b"%d" % i, i))
        producer.send(ZOMBIE_ONLY, Record(b"zombie", b"%d" % i, i))
    producer.send_offsets(GROUP, ZOMBIE_OFFSETS)
    say(f"sent {producer.epoch}")
    expect_on_stdin("commit")
    try:
        producer.commit()
    except ProducerFencedError:
        say("fenced")
        return
    finally:
        log.close()
    say("committed")
    raise SystemExit(COMMITTED_EXIT)


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    if mode == "produce":
        produce(args[0], args[1], int(args[2]), int(args[3]))
    elif mode == "zombie":
        zombie(args[0], args[1])
    else:
        raise SystemExit(f"unknown mode {mode!r}")
