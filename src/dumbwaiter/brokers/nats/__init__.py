"""``nats://``: the NATS JetStream broker (docs/nats.md)."""

from .broker import NatsBroker

__all__ = ["NatsBroker"]
