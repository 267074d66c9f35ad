"""The word count with a fixed wall-clock cost per line, for the pods of the e2e tests.

Each line sleeps ``LINE_SECONDS`` before it is split, as a call to an external service
would: one stream thread processes at most ``1 / LINE_SECONDS`` lines a second however fast
the machine is (a loaded machine only makes it slower), so a backlog of ``n`` lines keeps the
pod behind for at least ``n * LINE_SECONDS`` seconds. The autoscaler's e2e test
(tests/e2e/test_operator_autoscale.py) relies on that: a plain word count on a quiet machine
kept up with more than 17,000 lines/s, so no bounded load step could be sure to put it behind.

The kubelet stand-in puts this directory on the pods' PYTHONPATH beside the examples
(tests/support/control_plane/fixture.py): ``topology: {ref: throttled_wordcount:topology}``.
"""

import time

from eddyline_runtime.processing import StreamsBuilder

INPUT_TOPIC = "text-lines"
OUTPUT_TOPIC = "word-counts"
STORE = "word-counts"
# Seconds of wall-clock time each line costs (a sleep: no CPU, so the machine's two cores
# stay free for the rest of the suite).
LINE_SECONDS = 0.001


def _words(line: str) -> list[str]:
    time.sleep(LINE_SECONDS)
    return line.lower().split()


def topology() -> StreamsBuilder:
    builder = StreamsBuilder()
    (
        builder.stream(INPUT_TOPIC, value_serde="string")
        .flat_map_values(_words)
        .group_by(lambda _, word: word, value_serde="string")
        .count(STORE)
        .to_stream()
        .to(OUTPUT_TOPIC, key_serde="string", value_serde="long")
    )
    return builder
