"""On a real Kafka broker: the backfill reads the history read_committed up to the
positions an exactly-once replay committed, and builds the replay's stores byte for
byte (a count and a windowed count with grace and emit-final)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from eddyline_runtime.backfill import BackfillPlan, backfill_layout, run_task_history
from eddyline_runtime.backfill.task_history import partition_key
from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.log.kafka import KafkaLog
from eddyline_runtime.partitions import TaskId
from eddyline_runtime.processing.topology import Topology
from tests.integration.backfill.test_task_history import ingested_build
from tests.support.backfill import replay, store_contents, write_history
from tests.support.topologies.backfill_topologies import INPUT, keyed_count, windowed_count

pytestmark = pytest.mark.slow

PARTITIONS = 3
RECORDS = 3_000


@pytest.fixture
def log(kafka_bootstrap: str) -> Iterator[KafkaLog]:
    log = KafkaLog.open(
        f"kafka://{kafka_bootstrap}", {}, topic_prefix=f"backfill-{uuid.uuid4().hex[:8]}."
    )
    yield log
    log.close()


@pytest.mark.parametrize(
    ("build", "store"), [(keyed_count, "counts"), (windowed_count, "window-counts")]
)
def test_a_backfill_on_kafka_equals_an_exactly_once_replay(
    tmp_path: Path, log: KafkaLog, build: object, store: str
) -> None:
    topology: Topology = build()  # type: ignore[operator]
    application = f"backfill-{uuid.uuid4().hex[:8]}"
    state_dir = tmp_path / "replay-state"
    config = StreamsConfig.from_properties(
        {
            "application.id": application,
            "state.dir": str(state_dir),
            "processing.guarantee": "exactly_once_v2",
            "commit.interval.ms": 100,
        },
        environ={},
    )
    ends = write_history(log, INPUT, PARTITIONS, RECORDS)
    replay(topology, config, log)
    committed = log.committed_offsets(application, list(ends))
    assert committed == ends
    layout = backfill_layout(topology, application, {INPUT: PARTITIONS})
    plan = BackfillPlan(
        application=application,
        topology="unused: the task runs in this process",
        stores=(store,),
        log_url=log.url,
        output=str(tmp_path / "builds"),
        build_id="b1",
        end_offsets={partition_key(tp): offset for tp, offset in committed.items()},
    )
    total = 0
    for partition in range(PARTITIONS):
        task = TaskId(0, partition)
        built = run_task_history(
            topology,
            config,
            layout=layout,
            task_id=task,
            log=log,
            plan=plan,
            work_dir=tmp_path / "work",
        )
        total += built.records
        expected = store_contents(config, state_dir, task, store)
        assert expected
        got = ingested_build(plan, built, store, config, tmp_path / f"ingested-{partition}")
        assert got == expected
    assert total == RECORDS
