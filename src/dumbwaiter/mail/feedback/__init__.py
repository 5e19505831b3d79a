"""Bounce and complaint webhooks from mail providers, as ``mail.bounced`` /
``mail.complained`` events, feeding the suppression list.

Per provider, a parser (``ses.parse``, ``sendgrid.parse``,
``postmark.parse``, ``resend.parse``: body in, events out, nothing stored), a
receiver (``receive_ses``... : parse, suppress, publish) and a Starlette
route (``feedback_route``).
"""

from __future__ import annotations

from .base import FeedbackError, Parsed, SignatureError
from .receive import receive_postmark, receive_resend, receive_sendgrid, receive_ses, record
from .routes import feedback_route

__all__ = [
    "FeedbackError",
    "Parsed",
    "SignatureError",
    "feedback_route",
    "receive_postmark",
    "receive_resend",
    "receive_sendgrid",
    "receive_ses",
    "record",
]
