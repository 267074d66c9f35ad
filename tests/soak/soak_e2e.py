"""``make soak-e2e``: the e2e modules a fresh clone's ``make test`` once failed, round after
round, with both cores kept busy beside them.

One failure in a whole ``make test`` (issue 38: the scale-in hand-over timed out once on a
fresh clone, then passed 3 of 3 alone) is a defect, and a single run does not find it. This
runs each module in ``MODULES`` ``--rounds`` times in a row (default 10), each run its own
``pytest`` process (its own control plane and broker, as ``make test`` starts them), while a
CPU hog keeps every core busy: a machine where the test competes for CPU is where timing
assumptions break. It prints a line per run, then the passes and failures per module and a
final JSON line; each run's whole output is kept under ``--out`` (the failures' paths are
printed), and a failed run's temporary directory with its pods' logs beside it. Exit code
0 only when nothing failed.

The hog is bounded: one busy process per core (``--hog-workers``), each ending by itself at
the soak's time bound or when this script is gone (it watches its parent), and stopped by
this script when the soak ends. ``--no-hog`` runs without it.

It takes hours at the default (four modules of minutes each, ten rounds): not part of
``make test``. Usage::

    make soak-e2e                         # 10 rounds, hog on
    make soak-e2e SOAK_ARGS="--rounds 1"  # one round
    .venv/bin/python -m tests.soak.soak_e2e --rounds 3 --modules scale_in upgrade
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The modules issue 38 names: each starts pods on the real control plane and moves tasks.
MODULES = {
    "scale_in": "tests/e2e/test_operator_scale_in.py",
    "quickstart": "tests/e2e/test_operator_quickstart.py",
    "autoscale": "tests/e2e/test_operator_autoscale.py",
    "upgrade": "tests/e2e/test_operator_upgrade.py",
}
# One module's run at most this long before it counts as failed (the modules' own
# per-test timeouts are 900 s; a module has up to three such tests).
RUN_TIMEOUT_SECONDS = 3_600
# What the hog runs: busy arithmetic until its time bound, or until its parent (this
# script) is gone, checked every few milliseconds' worth of work.
_HOG = """
import os, sys, time
end, parent = time.monotonic() + float(sys.argv[1]), int(sys.argv[2])
while time.monotonic() < end and os.getppid() == parent:
    for _ in range(200_000):
        pass
"""


@dataclass(frozen=True)
class Run:
    round: int
    module: str
    passed: bool
    seconds: float
    exit_code: int | None  # None: timed out
    output: Path


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="soak-e2e", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="rounds of every module (10)")
    parser.add_argument(
        "--modules",
        nargs="+",
        choices=sorted(MODULES),
        default=list(MODULES),
        help="which modules (all four by default)",
    )
    parser.add_argument("--no-hog", action="store_true", help="run without the CPU hog")
    parser.add_argument(
        "--hog-workers",
        type=int,
        default=os.cpu_count() or 2,
        help="busy processes beside the tests (default: one per core)",
    )
    parser.add_argument(
        "--run-timeout",
        type=float,
        default=RUN_TIMEOUT_SECONDS,
        help=f"seconds a module's run may take before it counts as failed ({RUN_TIMEOUT_SECONDS})",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / ".eddyline-state" / "soak-e2e",
        help="where each run's output is kept (.eddyline-state/soak-e2e)",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, not {args.rounds}")
    if args.hog_workers < 1:
        parser.error(f"--hog-workers must be at least 1, not {args.hog_workers} (or --no-hog)")
    return args


@contextmanager
def cpu_hog(workers: int, seconds: float) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``workers`` busy processes for at most ``seconds``; stopped on the way out."""
    hogs = [
        subprocess.Popen([sys.executable, "-c", _HOG, str(seconds), str(os.getpid())])
        for _ in range(workers)
    ]
    try:
        yield hogs
    finally:
        for hog in hogs:
            if hog.poll() is None:
                hog.terminate()
        for hog in hogs:
            try:
                hog.wait(10)
            except subprocess.TimeoutExpired:
                hog.kill()
                hog.wait()


def run_module(round_: int, name: str, timeout: float, out_dir: Path) -> Run:
    """One ``pytest`` process for the module; its output goes to a file of its own, and
    its temporary directory (the pods' logs, the broker's, the control plane's) is kept
    beside it when the run fails: pytest keeps only its last three, and the next runs
    would delete the one that says why (a pod's log found the first soak failure's
    cause)."""
    output = out_dir / f"round-{round_:02d}-{name}.log"
    temporary = out_dir / f"round-{round_:02d}-{name}-tmp"
    shutil.rmtree(temporary, ignore_errors=True)
    started = time.monotonic()
    with output.open("wb") as sink:
        # A session of its own: a run that times out is stopped with every process it
        # started (control plane, broker, pods), not only pytest.
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pytest",
                MODULES[name],
                "-q",
                "-p",
                "no:cacheprovider",
                f"--basetemp={temporary}",
            ],
            cwd=ROOT,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code: int | None = process.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
            _stop_session(process)
        except BaseException:  # Ctrl-C: leave nothing behind
            _stop_session(process)
            raise
    if code == 0:
        shutil.rmtree(temporary, ignore_errors=True)
    return Run(round_, name, code == 0, time.monotonic() - started, code, output)


def _stop_session(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the run's process group (pytest's fixtures then stop what they started),
    SIGKILL if it is still there a minute later."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


def describe(run: Run) -> str:
    if run.passed:
        return "passed"
    if run.exit_code is None:
        return "timed out"
    return f"failed (exit {run.exit_code})"


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    # The hog outlives no soak: its bound is the longest the soak can take.
    bound = args.rounds * len(args.modules) * args.run_timeout
    hog_workers = 0 if args.no_hog else args.hog_workers
    print(
        f"soak-e2e: {args.rounds} round(s) of {', '.join(args.modules)}; "
        + (f"{hog_workers} busy process(es) beside them" if hog_workers else "no CPU hog")
        + f"; output in {args.out}",
        flush=True,
    )
    runs: list[Run] = []
    with cpu_hog(hog_workers, bound) if hog_workers else _nothing():
        for round_ in range(1, args.rounds + 1):
            for name in args.modules:
                run = run_module(round_, name, args.run_timeout, args.out)
                runs.append(run)
                print(
                    f"round {round_}/{args.rounds} {name}: {describe(run)} in {run.seconds:.0f} s"
                    + ("" if run.passed else f" (output: {run.output})"),
                    flush=True,
                )
    print("\nmodule        passes  failures", flush=True)
    summary: dict[str, dict[str, object]] = {}
    for name in args.modules:
        mine = [run for run in runs if run.module == name]
        passes = sum(run.passed for run in mine)
        failed = [str(run.output) for run in mine if not run.passed]
        print(f"{name:<12}  {passes:>6}  {len(failed):>8}", flush=True)
        summary[name] = {"passes": passes, "failures": len(failed), "failed_runs": failed}
    failures = sum(not run.passed for run in runs)
    print(
        json.dumps(
            {
                "rounds": args.rounds,
                "hog_workers": hog_workers,
                "modules": summary,
                "failures": failures,
                "seconds": round(sum(run.seconds for run in runs)),
            }
        ),
        flush=True,
    )
    return 0 if failures == 0 else 1


@contextmanager
def _nothing() -> Iterator[None]:
    yield


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
