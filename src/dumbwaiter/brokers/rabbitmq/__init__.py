"""``amqp://`` and ``amqps://``: RabbitMQ carries the jobs, a companion state
store keeps the job index and the coordination (see docs/rabbitmq.md)."""

from .broker import RabbitMQBroker

__all__ = ["RabbitMQBroker"]
