"""``eddyline demo store``: the transactional store engine, end to end.

A writer process counts words into a RocksDB store and commits every 1,000
records with the changelog offset of the last record. Its durability bound is
set to 2,500 records so the demo shows when the log gets synced. The writer
buffers more words without committing, and this process kills it with
SIGKILL. Then we reopen the store, check that its data is exactly the count at
its committed offset (every acknowledged commit, nothing uncommitted, nothing
torn), and query it at both isolation levels while an open transaction exists.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from eddyline_runtime.config import IsolationLevel
from eddyline_runtime.partitions import TaskId, TopicPartition, changelog_topic
from eddyline_runtime.state import (
    DurabilityBound,
    RocksDBStore,
    RocksDBStoreOptions,
    store_directory,
)

STORE_NAME = "word-counts"
CHANGELOG = TopicPartition(changelog_topic("demo", STORE_NAME), 0)
WORDS = ("apple", "banana", "cherry", "damson", "elder", "fig", "grape", "kiwi", "lime", "mango")
RECORDS_PER_COMMIT = 1_000
COMMITS = 5
UNCOMMITTED_RECORDS = 600
DEMO_BOUND = DurabilityBound(max_records=2_500)


def word_at(offset: int) -> str:
    """The word of the changelog record at ``offset``: deterministic, uneven counts."""
    return WORDS[(offset * offset + 3 * offset) % 17 % len(WORDS)]


def expected_counts(last_offset: int | None) -> dict[bytes, bytes]:
    """What the store must hold when it includes records 0..last_offset."""
    if last_offset is None:
        return {}
    counts = Counter(word_at(offset) for offset in range(last_offset + 1))
    return {word.encode(): str(n).encode() for word, n in counts.items()}


def run_writer(store_dir: Path) -> None:
    """The child: commit COMMITS transactions, leave one open, report, wait to be killed."""
    store = RocksDBStore(STORE_NAME, store_dir, RocksDBStoreOptions(durability=DEMO_BOUND))
    offset = -1

    def count(n: int) -> None:
        nonlocal offset
        for _ in range(n):
            offset += 1
            key = word_at(offset).encode()
            store.put(key, str(int(store.get(key) or b"0") + 1).encode())

    for number in range(1, COMMITS + 1):
        count(RECORDS_PER_COMMIT)
        store.commit({CHANGELOG: offset})
        durable = store.durable_offsets.get(CHANGELOG)
        _report(number=number, offset=offset, durable=durable)
    count(UNCOMMITTED_RECORDS)
    reader = store.reader(IsolationLevel.READ_COMMITTED)
    _report(
        open_transaction=UNCOMMITTED_RECORDS,
        uncommitted_bytes=store.approximate_num_uncommitted_bytes(),
        apple_committed=(reader.get(b"apple") or b"-").decode(),
        apple_uncommitted=(store.get(b"apple") or b"-").decode(),
    )
    threading.Event().wait()  # until SIGKILL


def _report(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def run_demo(state_dir: Path, out: TextIO = sys.stdout) -> int:
    """The parent: drive the writer, kill it, reopen, verify, query. Returns an exit code."""

    def say(line: str = "") -> None:
        print(line, file=out, flush=True)

    store_dir = store_directory(state_dir, TaskId(0, 0), STORE_NAME)
    if store_dir.exists():
        shutil.rmtree(store_dir)
    say(f"eddyline store engine demo: state store {STORE_NAME!r} in {store_dir}")
    say(f"durability bound for the demo: sync the log every {DEMO_BOUND.max_records} records\n")
    last_committed = _write_then_kill(store_dir, say)
    say("\n3. Reopen the store")
    with RocksDBStore(STORE_NAME, store_dir) as store:
        recovered, matches = _verify_reopened(store, last_committed, say)
        say("\n4. Query while the owner has an open transaction")
        _query_open_transaction(store, recovered, say)
    say(f"\n5. Closed; .checkpoint now reads: {(store_dir / '.checkpoint').read_text().split()}")
    return 0 if matches else 1


def _write_then_kill(store_dir: Path, say: Callable[[str], None]) -> int | None:
    """Steps 1 and 2: run the writer until its transaction is open, then SIGKILL it."""
    say(f"1. A writer process counts words, committing every {RECORDS_PER_COMMIT} records")
    writer = subprocess.Popen(
        [sys.executable, "-m", "eddyline_runtime.demo.store_demo", "--writer", str(store_dir)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout is not None
    last_committed = None
    for line in writer.stdout:
        event = json.loads(line)
        if "number" not in event:
            say(
                f"   then {event['open_transaction']} more records, not committed "
                f"({event['uncommitted_bytes']} bytes buffered)"
            )
            say(
                f"   a READ_COMMITTED reader sees apple = {event['apple_committed']}; "
                f"the writer reads its own write, apple = {event['apple_uncommitted']}"
            )
            break
        last_committed = event["offset"]
        durable = "none yet" if event["durable"] is None else event["durable"]
        say(
            f"   commit #{event['number']}: changelog offset {event['offset']:>5}"
            f"   log synced up to offset {durable}"
        )
    say(f"\n2. SIGKILL the writer (pid {writer.pid}) with its transaction open")
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    return last_committed


def _verify_reopened(
    store: RocksDBStore, last_committed: int | None, say: Callable[[str], None]
) -> tuple[int | None, bool]:
    """Step 3: the reopened store holds exactly the counts at its committed offset."""
    recovered = store.committed_offset(CHANGELOG)
    contents = dict(store.all())
    matches = contents == expected_counts(recovered)
    say(
        f"   committed changelog offset found: {recovered} "
        f"(last acknowledged commit: {last_committed})"
    )
    tail = (last_committed or 0) - (recovered if recovered is not None else -1)
    say(
        f"   restoration resumes at offset {0 if recovered is None else recovered + 1}: "
        f"{tail} committed records to replay from the changelog (a process crash loses "
        f"no commit; a machine crash at most the {DEMO_BOUND.max_records} records "
        "not yet synced)"
    )
    say(
        f"   data is exactly the word counts at offset {recovered}: "
        f"{'yes' if matches else 'NO'}; the open transaction left no trace"
    )
    say("   " + ", ".join(f"{k.decode()}={v.decode()}" for k, v in contents.items()))
    return recovered, matches


def _query_open_transaction(
    store: RocksDBStore, recovered: int | None, say: Callable[[str], None]
) -> None:
    """Step 4: another thread queries at both isolation levels, before and after commit."""
    store.put(b"apple", b"1000")
    store.put(b"zucchini", b"1")
    store.delete(b"banana")
    answers: dict[str, str] = {}

    def describe(words: dict[bytes, bytes]) -> str:
        return " ".join(
            f"{word}={words.get(word.encode(), b'-').decode()}"
            for word in ("apple", "banana", "zucchini")
        )

    def query() -> None:
        for level in IsolationLevel:
            answers[level.value] = describe(dict(store.reader(level).all()))

    query_thread = threading.Thread(target=query)
    query_thread.start()
    query_thread.join()
    for level, answer in answers.items():
        say(f"   {level:<17} {answer}")
    store.commit({CHANGELOG: (recovered or 0) + 3})
    after = dict(store.reader(IsolationLevel.READ_COMMITTED).all())
    say(f"   after commit, READ_COMMITTED sees {describe(after)}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--writer":
        run_writer(Path(sys.argv[2]))
    else:
        sys.exit(f"usage: {sys.argv[0]} --writer STORE_DIR (started by `eddyline demo store`)")
