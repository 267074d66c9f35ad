"""pytest fixtures for real Kafka brokers (registered by tests/conftest.py).

``kafka_broker`` starts one combined broker/controller the first time a test
asks for it and stops it when the run ends; ``kafka_cluster3`` starts three
nodes for a module whose tests need replication or leader changes, and stops
them after that module.
``EDDYLINE_TEST_KAFKA_BOOTSTRAP`` points ``kafka_bootstrap`` at an outside
broker instead. When a test that used a broker fails, its report ends with
the tail of each node's log and where the whole log is.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.kafka.broker import KafkaCluster, KafkaSetupError, environment_bootstrap

_USED = pytest.StashKey[list[KafkaCluster]]()


def _start(tmp_path_factory: pytest.TempPathFactory, size: int) -> Iterator[KafkaCluster]:
    cluster = KafkaCluster(tmp_path_factory.mktemp(f"kafka-{size}"), size)
    try:
        cluster.start()
    except KafkaSetupError:
        cluster.stop()
        raise
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """One KRaft node (broker and controller) for the whole run."""
    yield from _start(tmp_path_factory, 1)


@pytest.fixture(scope="module")
def kafka_broker_of_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """A one-node broker of the module's own, for a module whose topics the session's broker
    must not hold afterwards: ``test_operator_kafka.py`` requires that the word count's input
    does not exist yet, and a module that runs the same example before it would leave it."""
    yield from _start(tmp_path_factory, 1)


# Module scope: one module uses it (test_kafka_cluster_faults.py), and three idle
# nodes kept to the session's end took about a tenth of a core for the rest of the suite.
@pytest.fixture(scope="module")
def kafka_cluster3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """Three KRaft nodes, for replication, leader changes and broker restarts; started
    per module that asks (each start takes ~20 s)."""
    yield from _start(tmp_path_factory, 3)


def use_cluster(request: pytest.FixtureRequest, cluster: KafkaCluster) -> KafkaCluster:
    """Note that the running test uses ``cluster``, so a failure prints its logs."""
    request.node.stash.setdefault(_USED, []).append(cluster)
    return cluster


@pytest.fixture
def kafka_bootstrap(request: pytest.FixtureRequest) -> str:
    """``host:port`` of the broker this test runs against (the project's, or an outside one)."""
    outside = environment_bootstrap()
    if outside is not None:
        return outside
    cluster: KafkaCluster = request.getfixturevalue("kafka_broker")
    return use_cluster(request, cluster).bootstrap


@pytest.fixture
def kafka3(request: pytest.FixtureRequest) -> KafkaCluster:
    """The three-node cluster, its logs printed if this test fails."""
    cluster: KafkaCluster = request.getfixturevalue("kafka_cluster3")
    return use_cluster(request, cluster)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.failed:
        for cluster in item.stash.get(_USED, []):
            report.sections.append((f"Kafka {cluster.version} broker logs", cluster.describe()))
