"""What the feedback parsers share: their result, their error, small readers."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..errors import MailError
from ..events import MailBounced, MailComplained

Feedback = MailBounced | MailComplained


class FeedbackError(MailError, ValueError):
    """A webhook body that is not what the provider sends (the route answers 400)."""


class SignatureError(MailError, PermissionError):
    """A webhook whose signature or credentials do not check out (the route answers 401)."""


@dataclass(slots=True)
class Parsed:
    """What one webhook request said."""

    events: list[Feedback] = field(default_factory=list)
    #: SNS: the URL that confirms a new subscription (``SubscriptionConfirmation``)
    subscribe_url: str | None = None
    #: SNS: the topic the message came from
    topic_arn: str | None = None


def load_json(body: bytes | str, provider: str) -> Any:
    try:
        return json.loads(body)
    except ValueError as exc:
        raise FeedbackError(f"{provider} webhook: the body is not JSON ({exc})") from None


def when(value: Any) -> datetime | None:
    """A timestamp as providers write them (ISO 8601 text or epoch seconds), or None."""
    if value is None or value == "":
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.fromtimestamp(float(value), UTC)
    if isinstance(value, str):
        text = value.strip()
        if text.endswith("Z"):
            text = text[:-1] + "+00:00"
        try:
            return datetime.fromisoformat(text)
        except ValueError:
            return None
    return None


def text(value: Any) -> str:
    return "" if value is None else str(value)


def obj(value: Any, what: str, provider: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise FeedbackError(f"{provider} webhook: {what} is not an object")
    return value
