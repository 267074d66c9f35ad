"""Windowed keys written by eddyline's ``WindowedSerdes`` are Kafka's bytes: Kafka
Streams' own ``TimeWindowedSerializer``/``SessionWindowedSerializer`` (the pinned
release, kstreams/WindowedKeys.java) give the same bytes for the same keys, and its
deserializers read eddyline's bytes back to the same key and window."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from eddyline_runtime.processing import SessionWindow, TimeWindow, Windowed, WindowedSerdes
from eddyline_runtime.serde import serde_for
from tests.support.kafka.broker import kafka_libs

pytestmark = pytest.mark.slow

JAVA_SOURCE = Path(__file__).parent / "kstreams" / "WindowedKeys.java"
# Keys of several lengths (the key has no length prefix: the window sits in the last
# bytes), windows at 0, at large times and, for sessions, of one instant.
WINDOWS = [
    ("A", 0, 10), ("key-1", 60_000, 120_000), ("ü", 1_700_000_000_000, 1_700_000_300_000),
    ("", 5, 15), ("x" * 40, 2**40, 2**40 + 7),
]  # fmt: skip
SESSIONS = [("A", 0, 0), ("key-1", 10, 25), ("ü", 1_700_000_000_000, 1_700_000_000_999)]


@pytest.mark.skipif(shutil.which("javac") is None, reason="needs a JDK (javac)")
def test_windowed_keys_are_byte_exact_with_kafka_streams(tmp_path: Path) -> None:
    classpath = f"{kafka_libs()}/*"
    subprocess.run(
        ["javac", "-d", str(tmp_path), "-cp", classpath, str(JAVA_SOURCE)],
        check=True,
        capture_output=True,
    )
    lines, ours = [], []
    for key, start, end in WINDOWS:
        serde = serde_for(WindowedSerdes.time_windowed_serde_from("string", end - start))
        data = serde.serialize(Windowed(key, TimeWindow(start, end)))
        ours.append(data.hex())
        lines.append(f"serialize time {key} {start} {end}")
        lines.append(f"deserialize time {end - start} {data.hex()}")
    for key, start, end in SESSIONS:
        serde = serde_for(WindowedSerdes.session_windowed_serde_from("string"))
        data = serde.serialize(Windowed(key, SessionWindow(start, end)))
        ours.append(data.hex())
        lines.append(f"serialize session {key} {start} {end}")
        lines.append(f"deserialize session {data.hex()}")
    done = subprocess.run(
        ["java", "-cp", f"{classpath}:{tmp_path}", "WindowedKeys"],
        input="\n".join(lines) + "\n",
        check=True,
        capture_output=True,
        text=True,
    )
    answers = done.stdout.splitlines()
    assert answers[0::2] == ours  # Kafka's bytes are ours
    expected = [f"{k} {s} {e}" for k, s, e in [*WINDOWS, *SESSIONS]]
    assert answers[1::2] == expected  # and Kafka reads ours back
