"""Brokers, chosen by URL scheme and imported only when used.

A scheme whose broker needs an optional dependency that is missing raises
``MissingDependency`` naming the ``pip install`` line; an unknown scheme
raises ``InvalidURL`` naming the schemes this version supports.
"""

from __future__ import annotations

import importlib
from urllib.parse import urlsplit

from ..errors import InvalidURL, MissingDependency
from ..redact import mask_url
from .base import Broker
from .types import (
    Binding,
    Capabilities,
    DeadLetter,
    Delivery,
    JobFilter,
    JobInfo,
    Page,
    QueueStats,
    Rescued,
)

#: scheme -> (module, class, pip extra or None)
REGISTRY: dict[str, tuple[str, str, str | None]] = {
    "memory": ("dumbwaiter.brokers.memory", "MemoryBroker", None),
    "sqlite": ("dumbwaiter.brokers.sqlite", "SQLiteBroker", None),
    "redis": ("dumbwaiter.brokers.redis", "RedisBroker", "redis"),
    "rediss": ("dumbwaiter.brokers.redis", "RedisBroker", "redis"),
    "postgresql": ("dumbwaiter.brokers.postgres", "PostgresBroker", "postgres"),
    "postgres": ("dumbwaiter.brokers.postgres", "PostgresBroker", "postgres"),
    "nats": ("dumbwaiter.brokers.nats", "NatsBroker", "nats"),
    "amqp": ("dumbwaiter.brokers.rabbitmq", "RabbitMQBroker", "rabbitmq"),
    "amqps": ("dumbwaiter.brokers.rabbitmq", "RabbitMQBroker", "rabbitmq"),
    "kafka": ("dumbwaiter.brokers.kafka", "KafkaBroker", "kafka"),
}

DEFAULT_URL = "sqlite:///dumbwaiter.db"


def from_url(url: str) -> Broker:
    """The broker a URL names, e.g. ``sqlite:///jobs.db`` or ``memory://``."""
    if not isinstance(url, str) or "://" not in url:
        raise InvalidURL(
            f"broker URL {mask_url(url) if isinstance(url, str) else url!r} has no scheme; "
            "expected one of: " + ", ".join(f"{s}://" for s in sorted(REGISTRY))
        )
    scheme = urlsplit(url).scheme.lower()
    entry = REGISTRY.get(scheme)
    if entry is None:
        raise InvalidURL(
            f"unsupported broker URL scheme {scheme!r} in {mask_url(url)!r}; supported: "
            + ", ".join(f"{s}://" for s in sorted(REGISTRY))
        )
    module_name, class_name, extra = entry
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if extra is None or (exc.name or "").startswith("dumbwaiter"):
            raise
        package = (exc.name or "").partition(".")[0]
        raise MissingDependency(
            f"the {scheme}:// broker needs {package!r}, which is not installed: "
            f"pip install 'dumbwaiter[{extra}]'"
        ) from exc
    cls: type[Broker] = getattr(module, class_name)
    return cls(url)


__all__ = [
    "DEFAULT_URL",
    "REGISTRY",
    "Binding",
    "Broker",
    "Capabilities",
    "DeadLetter",
    "Delivery",
    "JobFilter",
    "JobInfo",
    "Page",
    "QueueStats",
    "Rescued",
    "from_url",
]
