"""The record of sent messages, by Message-ID: what makes a retried job not
send twice where it can know.

After the server or provider accepted a message, its Message-ID is written
here (``mail:sent:<digest>``) before the job is acknowledged.  A job that
runs again with that Message-ID (a redelivery after its worker died between
the send and the ack, a replay, a second job composed with the same
``message_id``) finds the record and ends without sending.

What it cannot know: a crash after the server accepted the message but
before the record was written (or an SMTP connection lost before the
server's ``250`` arrived) sends the message again on the retry, with the
same Message-ID.  The record lives in the broker's key-value store, shared
by every worker, for ``ttl`` seconds.
"""

from __future__ import annotations

import hashlib
import time
from typing import TYPE_CHECKING, Any

from .. import keys
from ..message import dumps, loads

if TYPE_CHECKING:
    from ..brokers.base import Broker

PREFIX = keys.MAIL_SENT
#: how long a sent Message-ID is remembered (seconds): 30 days, longer than
#: any retry schedule and the time a dead letter usually waits for replay
DEFAULT_TTL = 30 * 86400.0


def key(message_id: str) -> str:
    """The record's key: a digest, since a Message-ID may hold any printable text."""
    return PREFIX + hashlib.sha256(message_id.encode()).hexdigest()[:40]


class Ledger:
    def __init__(self, broker: Broker, ttl: float = DEFAULT_TTL) -> None:
        self.broker = broker
        self.ttl = ttl

    async def get(self, message_id: str) -> dict[str, Any] | None:
        raw = (await self.broker.kv_get([key(message_id)])).get(key(message_id))
        if raw is None:
            return None
        try:
            found = loads(raw)
        except ValueError:
            return {}
        return found if isinstance(found, dict) else {}

    async def record(self, message_id: str, **facts: Any) -> None:
        entry = {"message_id": message_id, "at": time.time(), **facts}
        await self.broker.kv_set({key(message_id): dumps(entry)}, ttl=self.ttl)
