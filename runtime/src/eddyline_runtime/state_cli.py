"""``eddyline state``: the stores a rebuild set aside, and writing one back.

When a store's changelog no longer fits it (truncated, rewritten, deleted),
the runtime rebuilds the store from the changelog and sets the old copy aside
in ``state.dir/.quarantine`` (see :func:`~eddyline_runtime.restore.replay.open_trusted`):
that copy may hold state the changelog lost. ``eddyline state quarantined``
lists such copies; ``eddyline state republish ENTRY --log URL`` writes a copy's
every key and value back into its changelog partition, as new records at the
changelog's end, one log transaction per batch. The running (rebuilt) copies
apply them as any changelog records, so the recovered values become the
store's latest. Run it with the application stopped or running: the records
are ordinary changelog writes. Values the application wrote after the rebuild
are overwritten by the copy's for the keys it holds, which is why this is an
operator's decision, never automatic.

A copy whose changelog lost records it applied stops its task until the user
decides (docs/state.md, "Changelog loss waits for your decision"): ``republish``
then marks it republished, and ``eddyline state accept-loss ENTRY`` marks the
loss accepted, so the next start rebuilds the store from the changelog.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from eddyline_runtime.errors import EddylineError
from eddyline_runtime.log import Record, TransactionalProducer, open_log
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.state import RocksDBStore
from eddyline_runtime.state.state_directory import (
    DECISION_LOSS_ACCEPTED,
    DECISION_REPUBLISHED,
    quarantine_directory,
    read_quarantine_note,
    record_decision,
    waiting_for_decision,
)

# Records per log transaction: bounded memory and transaction size, few commits.
REPUBLISH_BATCH_RECORDS = 10_000


def add_state_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    state = commands.add_parser(
        "state", help="stores a rebuild set aside (state.dir/.quarantine), and republishing one"
    )
    actions = state.add_subparsers(dest="action", required=True)
    listing = actions.add_parser(
        "quarantined", help="list the stores set aside in a state directory"
    )
    listing.add_argument("state_dir", type=Path, help="the instance's state.dir")
    republish = actions.add_parser(
        "republish",
        help="write a store set aside back into its changelog, as new records",
    )
    republish.add_argument(
        "entry", type=Path, help="the store's directory in state.dir/.quarantine"
    )
    republish.add_argument("--log", required=True, help="the application's log URL")
    republish.add_argument(
        "--transactional-id",
        default=None,
        help="the producer's transactional id (default: eddyline-republish-<store>)",
    )
    accept = actions.add_parser(
        "accept-loss",
        help="let a task whose changelog lost records rebuild its store from the changelog "
        "(values published higher may be published lower)",
    )
    accept.add_argument("entry", type=Path, help="the store's directory in state.dir/.quarantine")
    accept.add_argument("--log", required=True, help="the application's log URL")


def run_state_command(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    if args.action == "quarantined":
        return _list(args.state_dir, out)
    if args.action == "accept-loss":
        return _accept_loss(args.entry, args.log, out)
    return _republish(args.entry, args.log, args.transactional_id, out)


def _list(state_dir: Path, out: TextIO) -> int:
    folder = quarantine_directory(state_dir)
    entries = sorted(folder.iterdir()) if folder.is_dir() else []
    shown = 0
    for entry in entries:
        note = read_quarantine_note(entry) if entry.is_dir() else None
        if note is None:
            continue  # relocation's conflicts: no changelog verdict to show
        changelog = note.get("changelog", {})
        decision = (
            ": waiting for your decision (eddyline state republish ENTRY --log URL, or "
            "eddyline state accept-loss ENTRY); its task is stopped"
            if waiting_for_decision(note)
            else (f", decision: {note['decision']}" if "decision" in note else "")
        )
        print(
            f"{entry}  store {note.get('store')} ({note.get('copy')}), changelog "
            f"{changelog.get('topic')}-{changelog.get('partition')}, verdict "
            f"{note.get('verdict')}, committed offset {note.get('committed')}{decision}",
            file=out,
        )
        shown += 1
    if not shown:
        print(f"no store set aside in {folder}", file=out)
    return 0


def _noted(entry: Path) -> dict[str, Any]:
    note = read_quarantine_note(entry) if entry.is_dir() else None
    if note is None:
        raise EddylineError(
            f"{entry} is not a store set aside by a rebuild (no quarantine note in it); "
            "list them with: eddyline state quarantined STATE_DIR"
        )
    return note


def _accept_loss(entry: Path, log_url: str, out: TextIO) -> int:
    note = _noted(entry)
    changelog = _changelog(note)
    if not waiting_for_decision(note):
        if "decision" not in note:
            raise EddylineError(
                f"{entry} waits for no decision: only a copy whose task stopped over a "
                "changelog loss does; list them with: eddyline state quarantined STATE_DIR"
            )
        # Decided before, perhaps interrupted before the log was told: tell it now.
        _release(log_url, changelog)
        print(f"{entry} was decided before ({note['decision']}); {changelog} is released", file=out)
        return 0
    record_decision(entry, DECISION_LOSS_ACCEPTED)
    _release(log_url, changelog)
    print(
        f"loss accepted for store {note.get('store')} ({note.get('copy')}): the next start "
        f"rebuilds it from {changelog}; the copy stays at {entry} until the quarantine "
        "prunes it",
        file=out,
    )
    return 0


def _changelog(note: dict[str, Any]) -> TopicPartition:
    return TopicPartition(str(note["changelog"]["topic"]), int(note["changelog"]["partition"]))


def _release(log_url: str, changelog: TopicPartition) -> None:
    """Let writers rebuild from ``changelog`` again (the decision is recorded first: a crash
    in between leaves the hold, which running the command again releases)."""
    log = open_log(log_url)
    try:
        if changelog.topic in log.topics():
            log.release_changelog(changelog)
    finally:
        log.close()


def _republish(entry: Path, log_url: str, transactional_id: str | None, out: TextIO) -> int:
    note = _noted(entry)
    store_name = str(note["store"])
    if note.get("global_topic"):
        raise EddylineError(
            f'{entry} is a copy of global store "{store_name}": it holds the records of every '
            f'partition of topic "{note["global_topic"]}", which is the application\'s input, '
            "not a changelog of its own; republish writes to one partition and would misplace "
            "them. Produce the records you need to that topic yourself (each key to its "
            "partition); every instance's global store then reads them"
        )
    changelog = _changelog(note)
    log = open_log(log_url)
    try:
        if changelog.topic not in log.topics():
            raise EddylineError(
                f'changelog topic "{changelog.topic}" does not exist in {log_url}; start the '
                "application once (it creates its changelogs), then republish"
            )
        producer = log.transactional_producer(
            transactional_id or f"eddyline-republish-{store_name}"
        )
        written = 0
        try:
            with RocksDBStore(store_name, entry) as store:
                batch: list[Record] = []
                now = int(time.time() * 1000)  # new records: they are written now
                for key, value in store.all():
                    batch.append(Record(key, value, now))
                    if len(batch) >= REPUBLISH_BATCH_RECORDS:
                        written += _send(producer, changelog, batch)
                        batch = []
                if batch:
                    written += _send(producer, changelog, batch)
        finally:
            producer.close()
    finally:
        log.close()
    # Only once every record is committed: an interrupted republish is run again.
    if waiting_for_decision(note):
        record_decision(entry, DECISION_REPUBLISHED)
    if "decision" in note:
        _release(log_url, changelog)
    print(
        f"republished {written} records of store {store_name} from {entry} into "
        f"{changelog.topic}-{changelog.partition}",
        file=out,
    )
    return 0


def _send(producer: TransactionalProducer, changelog: TopicPartition, batch: list[Record]) -> int:
    producer.begin()
    try:
        producer.send_batch(changelog, batch)
        producer.commit()
    except BaseException:
        producer.abort()
        raise
    return len(batch)
