"""Outgoing webhooks as jobs: signed per Standard Webhooks, retried per
endpoint, never lost (docs/webhooks.md).

* ``sign`` / ``verify``: the ``webhook-signature`` scheme, for senders and
  for receivers (``verify`` needs only the ``standardwebhooks`` package).
* ``app.webhooks``: endpoints in the broker's kv store, ``send``,
  ``forward`` (fan-out of published events), attempts, health, dead
  deliveries and replay (``service.Webhooks``).

Modules: ``signing`` (the scheme), ``endpoints`` (the registry), ``delivery``
(the task), ``breaker`` (per-endpoint circuit breaker), ``ssrf`` (the
address guard and the client's transport), ``attempts`` (the attempt log),
``service`` (``app.webhooks``).  The HTTP client is httpx: ``pip install
'dumbwaiter[webhooks]'``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import MissingDependency

try:
    from .signing import (
        DEFAULT_TOLERANCE,
        WebhookVerificationError,
        check_secret,
        new_secret,
        sign,
        verify,
    )
except ImportError as exc:  # pragma: no cover - depends on the install
    raise MissingDependency(
        f"dumbwaiter.webhooks needs the standardwebhooks package ({exc}); "
        "pip install 'dumbwaiter[webhooks]'"
    ) from exc

if TYPE_CHECKING:
    from .attempts import Attempt
    from .breaker import BreakerPolicy
    from .delivery import DeliveryFailed
    from .endpoints import Endpoint, EndpointDisabled, EndpointNotFound
    from .service import Sent, Webhooks
    from .settings import SPEC_RETRY, SPEC_SCHEDULE, Settings
    from .ssrf import AddressPolicy, UnsafeTarget

_LAZY = {
    "Attempt": "attempts",
    "BreakerPolicy": "breaker",
    "DeliveryFailed": "delivery",
    "Endpoint": "endpoints",
    "EndpointDisabled": "endpoints",
    "EndpointNotFound": "endpoints",
    "SPEC_RETRY": "settings",
    "SPEC_SCHEDULE": "settings",
    "Sent": "service",
    "Settings": "settings",
    "Webhooks": "service",
    "AddressPolicy": "ssrf",
    "UnsafeTarget": "ssrf",
}


def __getattr__(name: str) -> Any:
    """The sending side on first use: it needs httpx, which a receiver that
    only verifies does not install."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dumbwaiter.webhooks' has no attribute {name!r}")
    import importlib

    try:
        mod = importlib.import_module(f".{module}", __name__)
    except ImportError as exc:
        raise MissingDependency(
            f"sending webhooks needs httpx ({exc}); pip install 'dumbwaiter[webhooks]'"
        ) from exc
    return getattr(mod, name)


__all__ = [
    "DEFAULT_TOLERANCE",
    "SPEC_RETRY",
    "SPEC_SCHEDULE",
    "AddressPolicy",
    "Attempt",
    "BreakerPolicy",
    "DeliveryFailed",
    "Endpoint",
    "EndpointDisabled",
    "EndpointNotFound",
    "Sent",
    "Settings",
    "UnsafeTarget",
    "WebhookVerificationError",
    "Webhooks",
    "check_secret",
    "new_secret",
    "sign",
    "verify",
]
