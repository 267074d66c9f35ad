"""``eddyline demo wordcount``: the word-count example, end to end on the embedded log.

Generates text lines into a fresh log, runs the example's StreamApp manifest
(exactly-once, RocksDB stores, record cache) with a progress line until all
input is processed and committed, then prints the top words, checks every
count against the generated text, and prints the store, cache and commit
metrics.
"""

from __future__ import annotations

import random
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import TextIO

import yaml

from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.metrics import MetricName
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.runner import run_app
from eddyline_runtime.serde import serde_for
from eddyline_runtime.spec import parse_manifest

INPUT_TOPIC = "text-lines"
OUTPUT_TOPIC = "word-counts"
INPUT_PARTITIONS = 4
_TEXT = (
    "the stream flows past the eddy where state turns slowly while records keep "
    "arriving from every partition and each task counts what it sees exactly once "
    "before the commit makes it durable in the log and the store"
)
VOCABULARY = tuple(_TEXT.split())


def generate_lines(count: int, seed: int = 7) -> list[str]:
    """Lines of 4-12 words drawn with a skewed (Zipf-like) distribution."""
    rng = random.Random(seed)
    weights = [1 / (rank + 1) for rank in range(len(VOCABULARY))]
    return [" ".join(rng.choices(VOCABULARY, weights, k=rng.randint(4, 12))) for _ in range(count)]


def run_demo(manifest: Path, state_dir: Path, lines: int, out: TextIO = sys.stdout) -> int:
    if not manifest.is_file():
        print(
            f"error: {manifest} not found; run from the repository root or pass --manifest",
            file=sys.stderr,
        )
        return 2
    shutil.rmtree(state_dir, ignore_errors=True)
    document = yaml.safe_load(manifest.read_text(encoding="utf-8"))
    document["spec"]["config"]["state.dir"] = str(state_dir / "state")
    app = parse_manifest(document, source=str(manifest))
    log = SqliteLog(state_dir / "log.db")
    try:
        texts = generate_lines(lines)
        log.create_topic(INPUT_TOPIC, INPUT_PARTITIONS)
        for partition in range(INPUT_PARTITIONS):
            log.produce(
                TopicPartition(INPUT_TOPIC, partition),
                [
                    Record(None, text.encode(), offset)
                    for offset, text in enumerate(texts[partition::INPUT_PARTITIONS])
                ],
            )
        print(
            f"generated {lines:,} lines into {INPUT_TOPIC} ({INPUT_PARTITIONS} partitions); "
            f"running {app.metadata.name} ({app.spec.config.get('processing.guarantee')})",
            file=out,
        )
        instance = run_app(
            app, log, search_path=[manifest.resolve().parent], until_caught_up=True, out=out
        )
        counts = _latest_counts(log)
        expected = Counter(word for text in texts for word in text.lower().split())
        print("\ntop words:", file=out)
        for word, count in sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:10]:
            print(f"  {word:<12} {count:>8,}", file=out)
        if counts != dict(expected):
            print("error: the counts differ from the generated text", file=sys.stderr)
            return 1
        print(
            f"\nverified: {len(counts)} words, {sum(counts.values()):,} occurrences, every "
            f"count equal to the input's",
            file=out,
        )
        _print_metrics(instance.final_metrics, out)
    finally:
        log.close()
    return 0


def _latest_counts(log: SqliteLog) -> dict[str, int]:
    longs = serde_for("long")
    latest: dict[str, int] = {}
    for partition in range(log.topics()[OUTPUT_TOPIC].partitions):
        tp = TopicPartition(OUTPUT_TOPIC, partition)
        position = log.beginning_offset(tp)
        while True:
            fetched = log.fetch(tp, position, 10_000)
            for record in fetched.records:
                if record.key is not None and record.value is not None:
                    latest[record.key.decode()] = longs.deserialize(record.value)
            if not fetched.records:
                break
            position = fetched.records[-1].offset + 1
    return latest


def _print_metrics(snapshot: dict[MetricName, float], out: TextIO) -> None:
    def total(group: str, name: str) -> float:
        return sum(v for k, v in snapshot.items() if k.group == group and k.name == name)

    def highest(group: str, name: str) -> float:
        return max(
            (v for k, v in snapshot.items() if k.group == group and k.name == name), default=0
        )

    hits = total("stream-record-cache-metrics", "hits-total")
    misses = total("stream-record-cache-metrics", "misses-total")
    print("\nmetrics:", file=out)
    rows = [
        ("records processed", f"{total('stream-thread-metrics', 'process-total'):,.0f}"),
        ("commits", f"{total('stream-thread-metrics', 'commit-total'):,.0f}"),
        ("commit latency avg", f"{highest('stream-thread-metrics', 'commit-latency-avg'):.1f} ms"),
        ("record cache hits / misses", f"{hits:,.0f} / {misses:,.0f}"),
        (
            "record cache forwards saved",
            f"{total('stream-record-cache-metrics', 'forwards-saved-total'):,.0f}",
        ),
        (
            "store commit latency avg",
            f"{highest('stream-state-metrics', 'commit-latency-avg') / 1e6:.2f} ms",
        ),
        ("changelog records restored", f"{total('stream-state-metrics', 'restore-total'):,.0f}"),
    ]
    for label, value in rows:
        print(f"  {label:<30} {value}", file=out)
