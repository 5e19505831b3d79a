"""A backend that keeps what it is given, for unit tests (Django's
``locmem``): ``backend.outbox`` is every e-mail sent, in order."""

from __future__ import annotations

from ..message import Email
from .base import Backend, Sent


class Memory(Backend):
    """Accepts every e-mail and appends it to ``outbox`` (this process only)."""

    name = "memory"

    def __init__(self) -> None:
        self.outbox: list[Email] = []

    async def send(self, email: Email) -> Sent:
        self.outbox.append(email)
        return Sent(provider_id=email.message_id)
