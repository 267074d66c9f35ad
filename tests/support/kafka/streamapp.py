"""The word-count example as a StreamApp on a ``kafka://`` log, on the real control plane.

Shared by ``tests/e2e/test_operator_kafka.py`` and ``tests/bench/bench_operator_kafka.py``:
the manifest (every topic on the broker, pods spread over the zones, client settings from a
Secret the operator mounts), deploying it through the real ``kubectl`` until Ready, and the
output topic read ``read_committed``. Pods are processes on their own loopback addresses
(``127.<cluster>.<node>.<n>``); the broker's ``127.0.0.1`` listener is the host side all of them
reach.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

import yaml
from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as KafkaPartition

from eddyline_runtime.log.kafka import KafkaLog
from tests.support.cluster_word_count import INPUT, PARTITIONS
from tests.support.control_plane.client import wait_until
from tests.support.control_plane.operator import Operator

OUTPUT = "word-counts"
# Bounds for a broken run on a loaded 2-core machine, not expectations.
READY_TIMEOUT = 300


def manifest(app: str, bootstrap: str, secret: str) -> dict[str, Any]:
    """``examples/wordcount`` with its log on the broker and the pods spread over zones."""
    return {
        "apiVersion": "eddyline.dev/v1alpha1",
        "kind": "StreamApp",
        "metadata": {"name": app},
        "spec": {
            "topology": {"ref": "wordcount:topology", "revision": "1"},
            "image": "ghcr.io/eddyline/examples:0.1.0",
            "replicas": 3,
            "log": {"url": f"kafka://{bootstrap}", "secretName": secret},
            "config": {"processing.guarantee": "exactly_once_v2", "num.standby.replicas": 1},
            "standbyPlacement": {"spread": "Required"},
            "storage": {"size": "1Gi"},
        },
    }


def create_input(bootstrap: str) -> None:
    """The input topic, before the app, as a user's: it must not hold anything yet."""
    log = KafkaLog.open(f"kafka://{bootstrap}")
    try:
        if INPUT in log.topics():
            raise RuntimeError(
                f"{INPUT} already exists on {bootstrap}: the word count's counts would include "
                "its records; use a fresh broker"
            )
        log.create_topic(INPUT, PARTITIONS)
    finally:
        log.close()


def ready(operator: Operator, app: str, replicas: int = 3) -> bool:
    found = operator.app(app)
    status = found.get("status", {})
    condition = operator.condition(app, "Ready")
    return bool(
        status.get("readyReplicas") == replicas
        and condition is not None
        and condition["status"] == "True"
        and status.get("observedGeneration") == found["metadata"]["generation"]
    )


def deploy(operator: Operator, app: str, bootstrap: str, secret: str) -> str:
    """Creates the Secret, applies the StreamApp, waits until Ready; the query Service."""
    operator.wait_watching()
    operator.kubectl(
        "create", "secret", "generic", secret,
        # Client settings (docs/kafka.md): eddyline's own topic setting and a librdkafka one.
        "--from-literal=replication.factor=1",
        "--from-literal=client.rack=eddyline-e2e",
    )  # fmt: skip
    applied = operator.kubectl(
        "apply", "-f", "-", stdin=yaml.safe_dump(manifest(app, bootstrap, secret))
    )
    assert applied.strip() == f"streamapp.eddyline.dev/{app} created", applied
    return query_service_when_ready(operator, app)


def query_service_when_ready(operator: Operator, app: str, replicas: int = 3) -> str:
    """Waits until the app has ``replicas`` ready pods and Ready=True (printing the
    operator's view if not); the address of its query Service."""
    try:
        wait_until(
            lambda: ready(operator, app, replicas),
            f"{replicas} ready pods and Ready=True",
            READY_TIMEOUT,
        )
    except TimeoutError:
        print(operator.describe_failure(app))
        raise
    service = operator.get("", "services", f"{app}-query")
    assert service is not None
    return f"{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"


def published(bootstrap: str) -> dict[str, list[int]]:
    """Every count committed to the output topic, per word, in order (read_committed)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    counts: dict[str, list[int]] = {}
    try:
        for partition in range(PARTITIONS):
            _, end = consumer.get_watermark_offsets(KafkaPartition(OUTPUT, partition), timeout=10)
            consumer.assign([KafkaPartition(OUTPUT, partition, 0)])
            position = 0
            while position < end:
                message = consumer.poll(1)
                if message is None:
                    break  # the rest up to the high watermark is markers or aborted records
                error = message.error()
                if error is not None:
                    raise RuntimeError(f"reading {OUTPUT}[{partition}]: {error}")
                key, value, offset = message.key(), message.value(), message.offset()
                assert key is not None and value is not None and offset is not None
                counts.setdefault(key.decode(), []).append(struct.unpack(">q", value)[0])
                position = offset + 1
    finally:
        consumer.close()
    return counts
