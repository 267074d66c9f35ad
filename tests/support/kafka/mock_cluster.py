"""librdkafka's built-in mock cluster, for wiring tests and benchmarks (not product code).

:class:`MockCluster` starts one; :class:`MockControl` reaches into it (inject broker
errors, create topics).

Faithful for produce, fetch, watermarks and group offsets only: never use it
as evidence for exactly-once (a read_committed consumer sees aborted records,
a fenced producer can still commit). The contract suite runs on a real broker
(``broker.py``).
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import confluent_kafka
from confluent_kafka import Producer

logger = logging.getLogger(__name__)
_REQUEST_TIMEOUT_S = 30.0


class MockCluster:
    """librdkafka's built-in mock cluster, on local ports, for wiring tests and benchmarks.

    Faithful for produce, fetch, watermarks and group offsets; not for
    exactly-once (a read_committed consumer sees aborted records, a fenced
    producer can still commit) and its admin calls time out. Topics are
    created on first mention, with 4 partitions.
    """

    def __init__(self, brokers: int = 1) -> None:
        self._owner = Producer({"test.mock.num.brokers": brokers, "logger": logger})
        metadata = self._owner.list_topics(timeout=_REQUEST_TIMEOUT_S)
        self.bootstrap = ",".join(
            f"{broker.host}:{broker.port}" for broker in metadata.brokers.values()
        )

    @property
    def url(self) -> str:
        return f"kafka://{self.bootstrap}"

    def create_topic(self, name: str) -> None:
        self._owner.list_topics(topic=name, timeout=_REQUEST_TIMEOUT_S)

    def topic_names(self) -> set[str]:
        return set(self._owner.list_topics(timeout=_REQUEST_TIMEOUT_S).topics)

    def close(self) -> None:
        self._owner.flush(0)


# Kafka protocol API keys of the requests the tests fail.
PRODUCE, FETCH, INIT_PRODUCER_ID, ADD_OFFSETS_TO_TXN, END_TXN = 0, 1, 22, 25, 26
# The rd_kafka_t pointer follows PyObject_HEAD in confluent-kafka's Handle struct.
_HANDLE_OFFSET = 2 * ctypes.sizeof(ctypes.c_void_p)


def _library() -> ctypes.CDLL:
    libs = Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs"
    (path,) = libs.glob("librdkafka*.so*")
    library = ctypes.CDLL(str(path))
    library.rd_kafka_handle_mock_cluster.restype = ctypes.c_void_p
    library.rd_kafka_handle_mock_cluster.argtypes = [ctypes.c_void_p]
    library.rd_kafka_mock_push_request_errors_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int16,
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_int),
    ]
    library.rd_kafka_mock_topic_create.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_int,
    ]
    return library


class MockControl:
    """The mock cluster's C API (``rd_kafka_mock_*``), reached through ctypes: the
    librdkafka that confluent-kafka bundles exports it but does not wrap it in Python.
    Injected errors travel the real protocol, so the adapter sees them exactly as
    librdkafka reports a broker's refusal."""

    def __init__(self, cluster: MockCluster) -> None:
        self._library = _library()
        owner = cluster._owner
        rk = ctypes.c_void_p.from_address(id(owner) + _HANDLE_OFFSET).value
        self._mcluster = self._library.rd_kafka_handle_mock_cluster(rk)
        assert self._mcluster, "not a mock cluster's owner"

    def fail_next(self, api_key: int, *errors: int) -> None:
        """The next requests of ``api_key`` are answered with ``errors``, in order."""
        array = (ctypes.c_int * len(errors))(*errors)
        self._library.rd_kafka_mock_push_request_errors_array(
            self._mcluster, api_key, len(errors), array
        )

    def create_topic(self, name: str, partitions: int) -> None:
        self._library.rd_kafka_mock_topic_create(self._mcluster, name.encode(), partitions, 1)
