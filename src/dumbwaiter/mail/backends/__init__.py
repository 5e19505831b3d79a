"""Delivery backends: SMTP and the providers' HTTP APIs.

Each lives in its own module and imports its client library (aiosmtplib,
httpx) only when it is used."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import Backend, Sent
from .memory import Memory

if TYPE_CHECKING:
    from .postmark import Postmark
    from .resend import Resend
    from .sendgrid import SendGrid
    from .ses import SES
    from .smtp import SMTP

_LAZY = {
    "SMTP": ".smtp",
    "SES": ".ses",
    "SendGrid": ".sendgrid",
    "Postmark": ".postmark",
    "Resend": ".resend",
}

__all__ = ["SES", "SMTP", "Backend", "Memory", "Postmark", "Resend", "SendGrid", "Sent"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module, __name__), name)
