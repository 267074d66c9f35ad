"""The member ``test_kafka_zombie_member.py`` freezes (SIGSTOP) mid-transaction and thaws.

Usage (from the repository's root)::

    python -m tests.integration.log.zombie_member_worker BOOTSTRAP PREFIX STATE_DIR \
        MEMBERSHIP EVENTS FREEZE_AT

It runs the tests' word count (tests/support/word_count.py) as member ``a`` on the broker,
its topics under PREFIX, and follows the membership file MEMBERSHIP (a :class:`Membership`,
as a local group's supervisor writes it) by applying each new generation's assignment.
At its FREEZE_AT-th commit with records to commit it stops itself with SIGSTOP just before
the commit's calls to the broker: every thread stops at once, as a SIGSTOP from outside
would stop them, with the stream thread's transactions open and holding what it produced
since the last commit (a random external SIGSTOP lands there only sometimes: the thread
commits as soon as it has caught up). The parent moves the tasks, then sends SIGCONT.
EVENTS gets one JSON line per event (one ``write()`` on an ``O_APPEND`` file): ``freezing``,
and per commit the tasks whose transaction committed and those dropped uncommitted because
another member fenced them.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from eddyline_runtime.assignor import Member
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.engine.stream_thread import CommitReport
from eddyline_runtime.log import CommittedTransaction, TransactionalProducer
from eddyline_runtime.log.kafka import KafkaLog
from eddyline_runtime.membership import Membership
from tests.support.word_count import streams_config, word_count


def main() -> None:
    bootstrap, prefix = sys.argv[1], sys.argv[2]
    state_dir, membership_path, events_path = (Path(arg) for arg in sys.argv[3:6])
    freeze_at = int(sys.argv[6])
    fd = os.open(events_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def emit(line: dict[str, object]) -> None:
        os.write(fd, (json.dumps(line) + "\n").encode())

    commits_with_records = [0]

    class FreezingLog(KafkaLog):
        def commit_transactions(
            self, producers: Sequence[TransactionalProducer]
        ) -> list[CommittedTransaction | Exception]:
            if producers and commits_with_records[0] == freeze_at - 1:
                commits_with_records[0] += 1
                emit({"event": "freezing", "at": time.time(), "producers": len(producers)})
                os.kill(os.getpid(), signal.SIGSTOP)
            return super().commit_transactions(producers)

    def committed(report: CommitReport) -> None:
        if report.records:
            commits_with_records[0] += 1
        line = {
            "event": "commit",
            "at": time.time(),
            "reason": report.reason,
            "records": report.records,
            "transactions": report.transactions,
            "migrated": [str(task) for task in report.migrated],
        }
        emit(line)

    membership = Membership.read(membership_path)
    assert membership is not None
    log = FreezingLog.open(f"kafka://{bootstrap}", {}, topic_prefix=prefix)
    instance = StreamsInstance(
        word_count(),
        streams_config(state_dir, **{"commit.interval.ms": 100}),
        log,
        instance_id="a",
        member=Member("a", address="127.0.0.1:1"),
        assignment=membership.assignment,
        on_commit=[committed],
    )
    instance.start()
    generation = membership.generation
    try:
        while True:  # until the parent kills it
            instance.check()
            current = Membership.read(membership_path)
            if current is not None and current.generation > generation:
                generation = current.generation
                instance.apply_assignment(current.assignment)
            time.sleep(0.05)
    finally:
        instance.close(10)
        log.close()


if __name__ == "__main__":
    main()
