"""The process ``test_dead_letter_crash.py`` runs, and SIGKILLs: poison records to a DLQ.

Usage::

    dead_letter_worker.py LOG_URL STATE_DIR KILL_AFTER [TOPIC_PREFIX]

Parses the numbers of topic ``numbers`` (application id ``parse``) under
exactly-once, committing every 20 ms; a value that is not a number fails the
parsing step, and ``log-and-continue`` sends it to the dead-letter topic
``numbers-dlq``. When the number KILL_AFTER goes by (a record right after a
poison one: its skip is queued, not committed) the process SIGKILLs itself;
-1 never. Otherwise it runs until everything is processed and committed, then
closes cleanly. TOPIC_PREFIX: the Kafka topics' prefix (a test's own).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.log import Log, open_log
from eddyline_runtime.processing import StreamsBuilder, Topology

DLQ = "numbers-dlq"
# A safety net: a worker that never catches up fails instead of hanging the suite.
MAX_SECONDS = 120.0


def topology(kill_after: int) -> Topology:
    def die_at(_key: object, number: int) -> None:
        if number == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)

    builder = StreamsBuilder()
    (
        builder.stream("numbers", value_serde="string")
        .map_values(int)
        .peek(die_at)
        .to("parsed", value_serde="long")
    )
    return builder.build()


def open_worker_log(url: str, prefix: str) -> Log:
    if not prefix:
        return open_log(url)
    from eddyline_runtime.log.kafka import KafkaLog

    return KafkaLog.open(url, {}, topic_prefix=prefix)


def main() -> None:
    url, state_dir, kill_after = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    prefix = sys.argv[4] if len(sys.argv) > 4 else ""
    config = StreamsConfig.from_properties(
        {
            "application.id": "parse",
            "state.dir": str(state_dir),
            "processing.guarantee": "exactly_once_v2",
            "commit.interval.ms": 20,
            "processing.exception.handler": "log-and-continue",
            "errors.dead.letter.queue.topic.name": DLQ,
        }
    )
    log = open_worker_log(url, prefix)
    instance = StreamsInstance(topology(kill_after), config, log)
    started = time.monotonic()
    instance.start()
    try:
        while not instance.caught_up():
            if time.monotonic() - started > MAX_SECONDS:
                raise TimeoutError(f"not caught up after {MAX_SECONDS} s: {instance.input_lags()}")
            time.sleep(0.01)
    finally:
        instance.close()
        log.close()


if __name__ == "__main__":
    main()
