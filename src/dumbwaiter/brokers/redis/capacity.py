"""Bounded queues on Redis: the check inside the enqueue script.

``enqueue.lua`` in mode ``bound`` counts each bounded queue's waiting jobs
(its ready set and its scheduled set, retries included) and stores the
batch only if every count plus the batch's share stays within its limit:
one script, so atomic against every producer on every host with no lock.
A batch that does not fit in one script call (more than ``bulk.CHUNK``
jobs: a bulk enqueue is staged over several calls) and a broker that waits
for replicas (``wait_replicas``) take the seam's default, a lock per queue
around the count (brokers/capacity.py).

A lost reply is not sent again here: the jobs may be stored, and a second
try would count them and raise ``QueueFull`` for a batch that went in.  The
producer gets ``BrokerUnavailable``, as for any enqueue whose outcome is
unknown (docs/guarantees.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from redis.exceptions import RedisError, ResponseError

from ...errors import QueueFull
from ...message import Message
from .. import capacity
from ..base import Broker
from .bulk import CHUNK, encode, ids_of
from .connection import Connection

#: the error reply of a full queue (enqueue.lua)
_FULL = "QUEUEFULL "


class RedisCapacity(Broker):
    """``enqueue_bounded`` (mixed into ``RedisBroker``)."""

    conn: Connection

    async def enqueue_bounded(
        self, msgs: Sequence[Message], max_ready: Mapping[str, int]
    ) -> list[str]:
        adding = capacity.per_queue(msgs, max_ready)
        conn = self.conn
        if not adding:
            return await self.enqueue(msgs)
        if len(msgs) > CHUNK or conn.wait_replicas:
            return await super().enqueue_bounded(msgs, max_ready)
        await conn.read_clock()
        [chunk] = encode(msgs, self.max_message_size, conn.clock)
        bounds = "".join(f"{q}\n{max_ready[q]}\n" for q in sorted(adding))
        args = [repr(conn.clock.now()), b"bound", bounds, "", *chunk.args]
        try:
            reply = await conn.links.get().script(conn.lua.enqueue, conn.keys.scripts, args)
        except ResponseError as exc:
            text = str(exc)
            if not text.startswith(_FULL):
                raise conn.failure(exc, "enqueue") from exc
            have, queue = text[len(_FULL) :].split(" ", 1)
            raise QueueFull(queue, max_ready[queue], int(have), adding[queue]) from None
        except RedisError as exc:
            raise conn.failure(exc, "enqueue") from exc
        return ids_of(reply, chunk.ids)
