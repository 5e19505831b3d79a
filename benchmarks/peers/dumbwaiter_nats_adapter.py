"""dumbwaiter on its NATS JetStream broker in the peers harness, next to
taskiq-nats on the same server (the harness' ``NATS_URL``).

Everything lives in the namespace ``bench``: streams ``DW_bench_*`` and the
KV bucket ``dw_bench`` (file storage, the server's defaults otherwise);
``reset`` deletes those streams (and with them their consumers), as the
taskiq-nats adapter deletes its stream.

The producer is async (``await task.aenqueue(i)``), like the taskiq-nats
adapter and the harness' bare-client anchor (``await js.publish``): nats-py
is asyncio-only, so a sync ``task.enqueue`` reaches the broker through the
App's portal thread, one thread hop per call (``benchmarks/nats_enqueue.py``
measures that path too).  Each enqueue is one round trip carrying two
JetStream publishes (the job's pointer and its index entry), both
acknowledged (PubAck) before it returns.

Worker side: ``dumbwaiter worker --app dumbwaiter_nats_adapter:nats_app``.
"""

from __future__ import annotations

import json

from dumbwaiter_adapter import AsyncDumbwaiterAdapter, _app
from peers.adapters.base import Adapter
from peers.common import NATS_URL, nats_connect, nats_delete_streams, run_sync

from dumbwaiter.brokers.nats.names import stream_names

PREFIX = "bench"
NATS_APP_URL = f"{NATS_URL}?prefix={PREFIX}"
STREAMS = stream_names(PREFIX)

# Creating an App opens no connection until first use.
nats_app, NATS_TASKS = _app(NATS_APP_URL)


class DumbwaiterNatsAdapter(AsyncDumbwaiterAdapter):
    """Pull consumers per queue; a job index with compare-and-set records."""

    dists = ("dumbwaiter", "orjson", "nats-py")
    bulk_api = "await task.aenqueue_many(ids) (pipelined: every publish sent, then every PubAck)"
    notes = (
        "NATS JetStream (nats-py connection, dumbwaiter's own protocol fast path), namespace "
        "bench, file storage; async producer, each enqueue = pointer + index entry publishes in "
        "one round trip, both acknowledged; worker claims by compare-and-set on the job's record, "
        "acks after the job; finished records kept 1 h (JOBS max_age) as in production."
    )

    def __init__(self) -> None:
        super().__init__("dumbwaiter-nats", "nats", NATS_APP_URL, "nats_app")

    def reset(self) -> None:
        nats_delete_streams(*STREAMS)

    def pending(self) -> int | None:
        """Pointers waiting in the work stream (``default`` queue, priority 0)."""

        async def go() -> int | None:
            nc = await nats_connect()
            try:
                subject = f"dw.{PREFIX}.w.default.p0"
                r = await nc.request(
                    f"$JS.API.STREAM.INFO.{STREAMS[0]}",
                    json.dumps({"subjects_filter": subject}).encode(),
                )
                d = json.loads(r.data)
                if "error" in d:
                    return None
                return int((d.get("state") or {}).get("subjects", {}).get(subject, 0))
            finally:
                await nc.close()

        return run_sync(go)


ADAPTERS: list[Adapter] = [DumbwaiterNatsAdapter()]
