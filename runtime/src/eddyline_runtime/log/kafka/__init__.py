"""The Kafka log (see ``log.py``): the only package that imports ``confluent_kafka``."""

from eddyline_runtime.log.kafka.connection import KafkaClients
from eddyline_runtime.log.kafka.log import KafkaLog
from eddyline_runtime.log.kafka.producer import KafkaTransactionalProducer

__all__ = ["KafkaClients", "KafkaLog", "KafkaTransactionalProducer"]
