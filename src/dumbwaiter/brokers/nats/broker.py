"""``nats://HOST:PORT?prefix=NAME``: the JetStream broker.

How the seam maps onto JetStream (docs/nats.md has the full story):

* **enqueue** publishes one message per job: a *pointer* to the work
  stream (``dw.NS.w.QUEUE.PRIO``, de-duplicated by ``Nats-Msg-Id`` = job
  id), which is also how ``get`` finds a job nobody has touched yet (by that
  id; index entries ``dw.NS.j.e.ID`` are written later for jobs that wait:
  ``Core._index_fresh``).  A job with an ``eta`` goes to the delay subjects
  ``dw.NS.d.QUEUE.s`` instead, with its index entry.  An id enqueued again after
  the de-duplication window gets a second pointer, which its claim drops:
  the job still runs once.
* **fetch** pulls from one durable pull consumer per queue and priority
  level (higher levels first) and *claims* each delivery by creating the
  job's state record (``dw.NS.j.s.ID``) with a compare-and-set; the record's
  sequence is the delivery's fencing token (records.py).  An idle fetch
  parks a pull request with ``expires`` on every level it may take from.
* **ack / retry / dead / requeue** rewrite the record with a compare-and-set
  on the token (a late worker's settle is refused), then ``+ACK`` the
  pointer.  A retry, a requeue or a rescue publishes a new pointer (a delay
  entry while it waits) with a fresh generation; dead letters go to the DLQ
  stream with every error.
* **lease**: the record's ``lease_until``; **extend** rewrites it and sends
  ``+WPI`` so JetStream does not redeliver (AckWait is only the backstop).
  Each process lists its running jobs in its holder message (HOLD stream);
  **rescue** reads those and gives expired jobs back with a ``LeaseExpired``
  error.  A pointer that JetStream redelivers after AckWait is rescued by
  the fetch that gets it.
* **delays**: delay entries are held by JetStream itself with
  ``-NAK {"delay": ...}`` on the ``delay`` consumer and moved to the work
  subjects when due (the promoter, one per fetching process).

The broker serves several event loops (an App's sync calls run on its
portal loop, a worker on its own): each loop gets its own connection
(``LoopLink``).
"""

from __future__ import annotations

from typing import ClassVar

from ..types import Capabilities
from .admin import Admin
from .coordination import Coordination
from .enqueue import Enqueue
from .rescue import Rescue
from .transport import Transport


class NatsBroker(Enqueue, Transport, Rescue, Admin, Coordination):
    capabilities: ClassVar[Capabilities] = Capabilities(
        native_delay=True,
        priorities=True,
        blocking_fetch=True,
        # nats-py is asyncio-only: a sync producer goes through the App's
        # portal (one thread hop per call); see docs/nats.md
        sync_enqueue=False,
        multi_process=True,
        multi_host=True,
        results=True,
        # the server's default max_payload is 1 MiB; a state record carries the
        # envelope plus its errors, so envelopes get the rest
        max_message_size=1024 * 1024 - 128 * 1024,
        events=True,
        ordered_keys=False,
        limits=True,
    )
    schemes: ClassVar[tuple[str, ...]] = ("nats",)
