"""``kafka://``: Apache Kafka (or any Kafka-protocol cluster) as the transport,
with job records and coordination in a shared state store (``state=``)."""

from .broker import KafkaBroker

__all__ = ["KafkaBroker"]
