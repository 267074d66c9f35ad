"""Reach into librdkafka's mock cluster through ctypes: inject broker errors, create topics.

The mock cluster (``MockCluster``) runs inside the process's librdkafka; its
C API (``rd_kafka_mock_*``) is exported by the librdkafka that confluent-kafka
bundles but not wrapped in Python. Injected errors travel the real protocol,
so the adapter sees them exactly as librdkafka reports a broker's refusal.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import confluent_kafka

from tests.support.kafka.mock_cluster import MockCluster

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
