"""The ``eddyline`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eddyline", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run a demonstration")
    demos = demo.add_subparsers(dest="demo", required=True)
    store = demos.add_parser(
        "store", help="the transactional store: write, crash, reopen, query at both isolations"
    )
    store.add_argument(
        "--state-dir",
        type=Path,
        default=Path(".eddyline-state/demo"),
        help="where the demo's store lives (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.command == "demo" and args.demo == "store":
        from eddyline_runtime.demo.store_demo import run_demo

        return run_demo(args.state_dir)
    parser.error("unknown command")
    return 2


if __name__ == "__main__":
    sys.exit(main())
