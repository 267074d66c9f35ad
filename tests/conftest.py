"""Fixtures shared by every test, registered once here (they live in ``tests/support``)."""

pytest_plugins = [
    "tests.support.stores",
    "tests.support.logs",
    # Real Kafka brokers (kafka_broker, kafka_cluster3, kafka_bootstrap): started only when
    # a test asks for one, once per run (tests/support/kafka/).
    "tests.support.kafka.plugin",
    # The real control plane (tests/support/control_plane): its session-scoped
    # `control_plane` fixture, for any test that requests it.
    "tests.support.control_plane.fixture",
    # The project's images on the test-only stand-in bases (tests/support/images.py): built
    # once per run by the session-scoped `images` fixture, for the container tests.
    "tests.support.images",
    # Real kubelets on containerd (tests/support/realnode): the `real_cluster` fixture of the
    # `realnode` tier, started only when a test requests it.
    "tests.support.realnode.fixture",
]
