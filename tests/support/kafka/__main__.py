"""``make kafka``: one KRaft broker for trying eddyline by hand, until Ctrl-C.

Usage: ``python -m tests.support.kafka [DIRECTORY]`` from the repository root.
The broker's data and log live in DIRECTORY (default ``.eddyline-state/kafka``),
formatted anew on each start.
"""

from __future__ import annotations

import shutil
import signal
import sys
from pathlib import Path
from types import FrameType

from tests.support.kafka.broker import ROOT, KafkaCluster, KafkaSetupError


def main(argv: list[str]) -> int:
    directory = Path(argv[0]) if argv else ROOT / ".eddyline-state" / "kafka"
    shutil.rmtree(directory, ignore_errors=True)
    cluster = KafkaCluster(directory)
    try:
        cluster.start()
    except KafkaSetupError as exc:
        cluster.stop()
        print(f"error: {exc}", file=sys.stderr)
        return 1
    node = cluster.nodes[0]
    print(
        f"Apache Kafka {cluster.version} (KRaft, one broker/controller) is up "
        f"after {cluster.start_seconds:.1f} s; log {node.log_file}\n"
        f"bootstrap: {cluster.bootstrap}\n"
        f"  eddyline run ... --log kafka://{cluster.bootstrap}\n"
        f"  EDDYLINE_TEST_KAFKA_BOOTSTRAP={cluster.bootstrap} make bench-log\n"
        "Ctrl-C stops it.",
        flush=True,
    )

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)  # also when started in the background (SIGINT ignored)
    try:
        while node.running:
            signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
