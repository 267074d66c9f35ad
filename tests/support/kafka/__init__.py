"""Kafka for the tests: real brokers (broker.py, plugin.py) and librdkafka's mock cluster."""
