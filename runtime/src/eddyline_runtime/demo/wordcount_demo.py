"""``eddyline demo wordcount``: the word-count example, end to end, on three replicas.

1. Generates text lines into a fresh embedded log.
2. Runs the example's StreamApp as a local group of replicas (exactly-once,
   RocksDB stores, record cache, one standby per stateful task in another
   zone) until all input is processed and committed, with a progress line on
   a terminal (:mod:`eddyline_runtime.progress`; ``--no-progress`` turns it off).
3. Prints the top words, read through the replicas' interactive-query
   servers, checks every count against the generated text, and prints the
   thread, cache and store metrics the replicas export.
4. Kills (SIGKILL) the replica holding the top word's active copy, shows the
   key still answered by its standby (stale allowed), then the promoted
   replica serving it fresh, having restored only the changelog tail.
5. Produces more text and checks the counts again: still exactly once.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import yaml

from eddyline_runtime.errors import EddylineError
from eddyline_runtime.local_group import LocalGroup
from eddyline_runtime.log import Record, SqliteLog, read_partition
from eddyline_runtime.log.positions import read_positions
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.progress import ProgressLine, progress_wanted
from eddyline_runtime.query.client import QueryFailedError, QueryRouter
from eddyline_runtime.runner import load_app, start_group
from eddyline_runtime.serde import serde_for

INPUT_TOPIC = "text-lines"
OUTPUT_TOPIC = "word-counts"
STORE = "word-counts"
INPUT_PARTITIONS = 4
_TEXT = (
    "the stream flows past the eddy where state turns slowly while records keep "
    "arriving from every partition and each task counts what it sees exactly once "
    "before the commit makes it durable in the log and the store"
)
VOCABULARY = tuple(_TEXT.split())
_WAIT_SECONDS = 180.0


def generate_lines(count: int, seed: int = 7) -> list[str]:
    """Lines of 4-12 words drawn with a skewed (Zipf-like) distribution."""
    rng = random.Random(seed)
    weights = [1 / (rank + 1) for rank in range(len(VOCABULARY))]
    return [" ".join(rng.choices(VOCABULARY, weights, k=rng.randint(4, 12))) for _ in range(count)]


def run_demo(
    manifest: Path,
    state_dir: Path,
    lines: int,
    *,
    replicas: int = 3,
    base_port: int = 7070,
    out: TextIO = sys.stdout,
    no_progress: bool = False,
) -> int:
    show_progress = progress_wanted(out, no_progress=no_progress)
    if not manifest.is_file():
        print(
            f"error: {manifest} not found; run from the repository root or pass --manifest",
            file=sys.stderr,
        )
        return 2
    shutil.rmtree(state_dir, ignore_errors=True)
    state_dir.mkdir(parents=True)
    demo_manifest = _demo_manifest(manifest, state_dir.resolve(), replicas)
    app = load_app(demo_manifest)
    log = SqliteLog(state_dir / "log.db")
    texts = generate_lines(lines)
    log.create_topic(INPUT_TOPIC, INPUT_PARTITIONS)
    _produce(log, texts)
    expected = Counter(word for text in texts for word in text.lower().split())
    print(
        f"generated {lines:,} lines into {INPUT_TOPIC} ({INPUT_PARTITIONS} partitions)",
        file=out,
    )
    group = start_group(
        demo_manifest, app, base_port=base_port, logs_dir=state_dir / "logs", out=out
    )
    try:
        _wait_caught_up(log, app.metadata.name, group, out, progress=show_progress)
        router = QueryRouter([m.address or "" for m in group.members])
        counts = _all_counts(group)
        _print_top_words(counts, out)
        if counts != dict(expected):
            return _fail("the counts the replicas serve differ from the generated text")
        print(
            f"verified: {len(counts)} words, {sum(counts.values()):,} occurrences, every count "
            "equal to the input's",
            file=out,
        )
        _print_metrics(group, out)
        if replicas > 1:
            top_word = max(counts, key=lambda word: (counts[word], word))
            _failover(group, router, top_word, counts[top_word], out)
            more = generate_lines(max(lines // 10, 1), seed=8)
            _produce(log, more)
            expected.update(word for text in more for word in text.lower().split())
            print(f"\nproduced {len(more):,} more lines", file=out)
            _wait_caught_up(log, app.metadata.name, group, out, progress=show_progress)
            if _latest_counts(log) != dict(expected):
                return _fail("after the failover the published counts differ from the input")
            print(
                "verified after the failover: every published count equals the input's "
                "(nothing lost, nothing counted twice)",
                file=out,
            )
    except (EddylineError, TimeoutError) as error:
        return _fail(str(error), group)
    finally:
        codes = group.stop()
        log.close()
    print(f"\nstopped the replicas cleanly: exit codes {codes}", file=out)
    return 0


def _demo_manifest(manifest: Path, state_dir: Path, replicas: int) -> Path:
    """The example's manifest with its log, state and replicas in the demo's directory."""
    document = yaml.safe_load(manifest.read_text(encoding="utf-8"))
    spec = document["spec"]
    spec["replicas"] = replicas
    spec["log"] = {"url": f"sqlite:///{state_dir / 'log.db'}"}
    spec["config"]["state.dir"] = str(state_dir / "state")
    spec["config"]["num.standby.replicas"] = 1 if replicas > 1 else 0
    module = spec["topology"].partition(":")[0]
    shutil.copy(manifest.parent / f"{module.replace('.', '/')}.py", state_dir)
    path = state_dir / "streamapp.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def _produce(log: SqliteLog, texts: list[str]) -> None:
    now = int(time.time() * 1000)
    for partition in range(INPUT_PARTITIONS):
        log.produce(
            TopicPartition(INPUT_TOPIC, partition),
            [Record(None, text.encode(), now) for text in texts[partition::INPUT_PARTITIONS]],
        )


def _wait_caught_up(
    log: SqliteLog, group_id: str, group: LocalGroup, out: TextIO, *, progress: bool
) -> None:
    """Until every input and repartition record is processed and committed, with a progress
    line when ``progress``."""
    inputs = [
        TopicPartition(name, p)
        for name, spec in log.topics().items()
        if name == INPUT_TOPIC or name.endswith("-repartition")
        for p in range(spec.partitions)
    ]
    started = time.monotonic()
    line = ProgressLine(out, label="processing", unit="records", enabled=progress)
    try:
        while True:
            events = group.poll()
            if events:
                line.clear()
            for event in events:
                print(event, file=out, flush=True)
            ends = {tp: log.end_offset(tp) for tp in inputs}
            # Offsets below the group's position (read_positions: the engine's own start rule).
            positions = read_positions(log, group_id, inputs)
            done = sum(min(positions[tp], end) for tp, end in ends.items())
            total = sum(ends.values())
            elapsed = time.monotonic() - started
            if done == total:
                line.clear()
                print(
                    f"processed and committed {total:,} records (input and repartition) "
                    f"in {elapsed:.1f} s",
                    file=out,
                    flush=True,
                )
                return
            # Repartition topics grow while the input is read: the total grows with them.
            line.update(done, total=total)
            if elapsed > _WAIT_SECONDS:
                raise TimeoutError(f"not caught up after {_WAIT_SECONDS:.0f} s ({done} of {total})")
            time.sleep(0.1)
    finally:
        line.close()


def _all_counts(group: LocalGroup) -> dict[str, int]:
    """Every word's count, from the active copies the replicas serve (GET .../all)."""
    counts: dict[str, int] = {}
    for member in group.members:
        body = _get_json(f"http://{member.address}/v1/stores/{STORE}/all")
        counts.update({str(key): int(value) for key, value in body["entries"]})
    return counts


def _print_top_words(counts: dict[str, int], out: TextIO) -> None:
    print("\ntop words (interactive queries):", file=out)
    for word, count in sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:10]:
        print(f"  {word:<12} {count:>8,}", file=out)


def _print_metrics(group: LocalGroup, out: TextIO) -> None:
    """Sum the replicas' Prometheus metrics (GET /metrics) into a few lines."""
    totals: dict[str, float] = {}
    for member in group.members:
        with urllib.request.urlopen(f"http://{member.address}/metrics", timeout=5) as response:
            text = response.read().decode()
        for line in text.splitlines():
            if line and not line.startswith("#"):
                sample, _, value = line.rpartition(" ")
                family = sample.partition("{")[0]
                totals[family] = totals.get(family, 0.0) + float(value)
    prefix = "eddyline_"
    rows = [
        ("records processed", "stream_thread_metrics_process_total", "{:,.0f}"),
        ("commits", "stream_thread_metrics_commit_total", "{:,.0f}"),
        ("record cache hits", "stream_record_cache_metrics_hits_total", "{:,.0f}"),
        ("record cache misses", "stream_record_cache_metrics_misses_total", "{:,.0f}"),
        (
            "record cache forwards saved",
            "stream_record_cache_metrics_forwards_saved_total",
            "{:,.0f}",
        ),
        ("changelog records restored", "stream_state_metrics_restore_total", "{:,.0f}"),
    ]
    print("\nmetrics (summed over the replicas' /metrics):", file=out)
    for label, name, form in rows:
        print(f"  {label:<30} {form.format(totals.get(prefix + name, 0.0))}", file=out)


def _failover(group: LocalGroup, router: QueryRouter, word: str, count: int, out: TextIO) -> None:
    metadata = router.metadata(STORE, word)
    active = metadata["active_host"]
    victim = next(m.id for m in group.members if m.address == active)
    print(
        f'\n"{word}" lives in partition {metadata["partition"]}: active on replica {victim} '
        f"({active}), standby on {', '.join(metadata['standby_hosts']) or 'none'}",
        file=out,
    )
    print(f"killing replica {victim} with SIGKILL", file=out, flush=True)
    killed_at = time.monotonic()
    group.kill(victim)
    result = _retry(lambda: router.get(STORE, word), group, out)
    print(
        f'  {time.monotonic() - killed_at:.2f} s later: "{word}" = {result.value} from '
        f"{result.host} ({result.role}, stale={result.stale}, lag {result.lag})",
        file=out,
    )
    if result.value != count:
        raise EddylineError(f"the standby answered {result.value}, expected {count}")
    deadline = time.monotonic() + 30
    while True:
        for event in group.poll():
            print(f"  {event}", file=out, flush=True)
        result = _retry(lambda: router.get(STORE, word), group, out)
        if result.role == "active" and not result.stale:
            break
        if time.monotonic() > deadline:
            raise TimeoutError("no replica became active for the word's partition in 30 s")
        time.sleep(0.1)
    new_owner = next(m.id for m in group.members if m.address == result.host)
    print(
        f'  {time.monotonic() - killed_at:.2f} s later: "{word}" = {result.value} from '
        f"{result.host}, now the active copy on replica {new_owner}",
        file=out,
    )
    task = f"1_{metadata['partition']}"
    for line in _restore_lines(group, new_owner, task):
        print(f"  replica {new_owner}: {line}", file=out)
    while victim not in group.alive():  # the supervisor restarts it after a back-off
        for event in group.poll():
            print(f"  {event}", file=out, flush=True)
        if time.monotonic() > deadline:
            raise TimeoutError(f"replica {victim} was not restarted in 30 s")
        time.sleep(0.1)


def _retry(query: Callable[[], Any], group: LocalGroup, out: TextIO) -> Any:
    deadline = time.monotonic() + 10
    while True:
        try:
            return query()
        except QueryFailedError:
            if time.monotonic() > deadline:
                raise
            for event in group.poll():
                print(f"  {event}", file=out, flush=True)
            time.sleep(0.05)


def _restore_lines(group: LocalGroup, member_id: str, task: str) -> list[str]:
    path = group.logs_dir / f"replica-{member_id}.log" if group.logs_dir else None
    if path is None or not path.exists():
        return []
    marker = f"task {task} restored store {STORE}:"
    lines = [line for line in path.read_text().splitlines() if marker in line]
    return [line.partition("stream_thread: ")[2] or line for line in lines[-1:]]


def _latest_counts(log: SqliteLog) -> dict[str, int]:
    longs = serde_for("long")
    return {
        record.key.decode(): longs.deserialize(record.value)
        for partition in range(log.topics()[OUTPUT_TOPIC].partitions)
        for record in read_partition(log, TopicPartition(OUTPUT_TOPIC, partition))
        if record.key is not None and record.value is not None
    }


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def _fail(message: str, group: LocalGroup | None = None) -> int:
    print(f"error: {message}", file=sys.stderr)
    if group is not None and group.logs_dir is not None:
        print(f"the replicas' logs are in {group.logs_dir}", file=sys.stderr)
    return 1
