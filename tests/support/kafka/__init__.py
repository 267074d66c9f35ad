"""Kafka for the tests, every stand-in in one place: real brokers (broker.py, plugin.py),
librdkafka's mock cluster and its C-API hooks (mock_cluster.py), and fake confluent-kafka
clients at the adapter's boundary (fake_clients.py)."""
