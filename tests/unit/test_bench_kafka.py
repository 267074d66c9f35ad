"""The pure parts of ``make bench-kafka`` (tests/bench/bench_kafka.py): its commit figures
and its ``--commit-mode`` option."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tests.bench.bench_kafka import COMMIT_MODES, START_MODES, commit_figures, mode_list, percentile


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.50) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile([7.0], 0.99) == 7.0


def test_commit_figures_come_from_the_last_commits_line(tmp_path: Path) -> None:
    log = tmp_path / "eddyline.log"
    commits = {
        # (instant, seconds, task transactions): 6 transactions over 2 s.
        "t-1": [[10.0, 0.010, 2], [11.0, 0.030, 2], [12.0, 0.020, 2]],
        # 1 transaction over 1 s.
        "t-2": [[10.0, 0.040, 0], [11.0, 0.050, 1]],
    }
    log.write_text(
        "RUNNING\nCOMMITS {}\nnoise\nCOMMITS " + json.dumps(commits) + "\n", encoding="utf-8"
    )
    figures = commit_figures(log)
    assert figures["commit_p50_ms"] == pytest.approx(30.0)
    assert figures["commit_p99_ms"] == pytest.approx(50.0)
    assert figures["transactions_per_s_per_thread"] == pytest.approx((3.0 + 1.0) / 2)


def test_a_run_that_printed_no_commits_has_no_commit_figures(tmp_path: Path) -> None:
    log = tmp_path / "killed.log"
    log.write_text("RUNNING\n", encoding="utf-8")
    assert commit_figures(log) == {}


@pytest.mark.parametrize(
    ("option", "accepted"), [("--commit-mode", COMMIT_MODES), ("--start-mode", START_MODES)]
)
def test_modes_are_checked_and_keep_their_order(option: str, accepted: tuple[str, ...]) -> None:
    modes = mode_list(option, accepted)
    assert modes("serial, concurrent") == ["serial", "concurrent"]
    for wrong in ("", "fast", "serial,serial"):
        with pytest.raises(argparse.ArgumentTypeError, match=f"{option} .*concurrent, serial"):
            modes(wrong)
    if "pipelined" not in accepted:  # a start has no pipelining
        with pytest.raises(argparse.ArgumentTypeError):
            modes("pipelined")
