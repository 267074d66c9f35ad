"""The shared progress line: what it draws on a terminal, and that it is silent elsewhere.

A fake clock drives the rate and the time left; a pseudo-terminal stands for a user's
terminal and a pipe for a log collector.
"""

from __future__ import annotations

import fcntl
import io
import os
import pty
import struct
import termios
from collections.abc import Iterator

import pytest

from eddyline_runtime.progress import ProgressLine, duration_text, progress_wanted


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def terminal() -> Iterator[tuple[io.TextIOWrapper, int]]:
    """A stream on a pty's follower side, and the leader's fd to read what it shows."""
    leader, follower = pty.openpty()
    # 24 rows of 120 columns, as a terminal emulator sets them (a new pty reports 0 x 0).
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    stream = open(follower, "w", encoding="utf-8", closefd=True)  # noqa: SIM115
    try:
        yield stream, leader
    finally:
        stream.close()
        os.close(leader)


@pytest.fixture
def pipe() -> Iterator[tuple[io.TextIOWrapper, int]]:
    reader, writer = os.pipe()
    stream = open(writer, "w", encoding="utf-8", closefd=True)  # noqa: SIM115
    try:
        yield stream, reader
    finally:
        stream.close()
        os.close(reader)


def read_available(fd: int) -> str:
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except (BlockingIOError, OSError):
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode()


def test_a_terminal_gets_done_of_total_rate_and_time_left(
    terminal: tuple[io.TextIOWrapper, int],
) -> None:
    stream, leader = terminal
    clock = FakeClock()
    line = ProgressLine(
        stream, label="reading changelog", unit="records", total=10_000, clock=clock
    )
    assert line.enabled  # a terminal, found by itself
    line.update(0)
    clock.now += 2.0
    line.update(2_000)
    clock.now += 2.0
    line.update(4_000)
    line.close()
    shown = read_available(leader)
    # Each draw starts by going back to the column 0 and erasing the row.
    draws = [part for part in shown.split("\r\x1b[K") if part]
    assert draws == [
        "reading changelog: 0 of 10,000 records (0%), 0 s",
        "reading changelog: 2,000 of 10,000 records (20%), 1,000 records/s, 8 s left, 2 s",
        "reading changelog: 4,000 of 10,000 records (40%), 1,000 records/s, 6 s left, 4 s",
    ]
    assert shown.endswith("\r\x1b[K")  # closed: the row is left empty for what follows
    assert "\n" not in shown


def test_a_pipe_gets_nothing_at_all(pipe: tuple[io.TextIOWrapper, int]) -> None:
    stream, reader = pipe
    assert not progress_wanted(stream)
    clock = FakeClock()
    line = ProgressLine(stream, label="processing", unit="records", total=10, clock=clock)
    for done in range(11):
        clock.now += 1.0
        line.update(done)
    line.clear()
    line.close()
    stream.flush()
    assert read_available(reader) == ""


def test_no_progress_silences_a_terminal_too(terminal: tuple[io.TextIOWrapper, int]) -> None:
    stream, leader = terminal
    assert progress_wanted(stream)
    assert not progress_wanted(stream, no_progress=True)
    line = ProgressLine(
        stream,
        label="x",
        unit="records",
        enabled=progress_wanted(stream, no_progress=True),
    )
    line.update(5)
    line.close()
    assert read_available(leader) == ""


def test_redraws_are_at_most_twice_a_second_unless_the_phase_changes() -> None:
    out = io.StringIO()
    clock = FakeClock()
    line = ProgressLine(
        out, label="a", unit="records", total=100, enabled=True, clock=clock, width=200
    )
    line.update(1)
    clock.now += 0.1
    line.update(2)  # too soon: not drawn
    line.update(2, total=120)  # a new total alone is no reason to draw sooner
    line.update(3, label="b", unit="tasks", total=10)  # a new phase: drawn at once
    clock.now += 0.5
    line.update(4)
    draws = [part for part in out.getvalue().split("\r\x1b[K") if part]
    assert [d.split(":")[0] for d in draws] == ["a", "b", "b"]
    # The new phase measured its rate from its own start (3 tasks at its first draw).
    assert draws[2] == "b: 4 of 10 tasks (40%), 2.0 tasks/s, 3 s left, 0 s"


def test_clear_leaves_the_row_for_a_line_of_the_caller_and_the_next_update_redraws() -> None:
    out = io.StringIO()
    clock = FakeClock()
    line = ProgressLine(
        out, label="step", unit="pods ready", show_rate=False, enabled=True, clock=clock, width=200
    )
    line.update(1, total=3)
    line.clear()
    out.write("    12:00:01  Stopping\n")
    clock.now += 0.1  # sooner than a redraw would be due: a cleared line draws anyway
    line.update(2)
    assert out.getvalue() == (
        "\r\x1b[Kstep: 1 of 3 pods ready (33%), 0 s"
        "\r\x1b[K"
        "    12:00:01  Stopping\n"
        "\r\x1b[Kstep: 2 of 3 pods ready (67%), 0 s"
    )


def test_the_line_follows_the_terminal_width(terminal: tuple[io.TextIOWrapper, int]) -> None:
    stream, leader = terminal
    line = ProgressLine(stream, label="y" * 200, unit="records")
    line.update(1)
    drawn = read_available(leader).removeprefix("\r\x1b[K")
    assert len(drawn) == 119


def test_a_line_longer_than_the_terminal_is_cut_to_fit() -> None:
    out = io.StringIO()
    line = ProgressLine(out, label="x" * 100, unit="records", enabled=True, width=40)
    line.update(1)
    drawn = out.getvalue().removeprefix("\r\x1b[K")
    assert len(drawn) == 39  # one column short of the width: no wrap
    assert drawn.endswith("…")


def test_an_unknown_total_shows_the_count_and_rate_only() -> None:
    out = io.StringIO()
    clock = FakeClock()
    line = ProgressLine(out, label="read", unit="records", enabled=True, clock=clock, width=200)
    line.update(0)
    clock.now += 4
    line.update(100)
    assert out.getvalue().endswith("read: 100 records, 25 records/s, 4 s")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.4, "0 s"), (59.4, "59 s"), (65, "1 min 05 s"), (3599, "59 min 59 s"), (7620, "2 h 07 min")],
)
def test_durations_read_as_a_human_says_them(seconds: float, text: str) -> None:
    assert duration_text(seconds) == text


def test_a_new_phase_without_a_total_shows_none() -> None:
    out = io.StringIO()
    clock = FakeClock()
    line = ProgressLine(
        out, label="reading", unit="offsets", total=100, enabled=True, clock=clock, width=200
    )
    line.update(50)
    line.update(3, label="writing", unit="tasks")
    assert out.getvalue().endswith("\r\x1b[Kwriting: 3 tasks, 0 s")
