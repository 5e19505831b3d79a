"""What a crash test says when its jobs never all finish.

A wait for ``succeeded == N`` that times out says only that some job never
finished; the failure is then unexplainable after the fact (the state
store and the queues are gone with the test's tmp dir and vhost).  So the
test asks this module, once its worker is stopped, for the jobs that did
not succeed: their stored state, attempts, errors and how often they
started, and, on RabbitMQ, their records as stored (version, token,
enqueue token) and every copy of them still queued anywhere (the lanes
and the delay cascade), with the headers its admission judges.  A job
that is ``ready`` with no copy is a lost job; one with copies tells which
rule kept them from running.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import orjson

import dumbwaiter as dw
from dumbwaiter.brokers.types import JobFilter
from dumbwaiter.state import State

#: jobs described in full (the rest are counted)
LIMIT = 20
_UNFINISHED = (
    State.READY,
    State.SCHEDULED,
    State.RETRYING,
    State.RUNNING,
    State.DEAD,
    State.CANCELLED,
)


async def unfinished(app: dw.App, started: list[str]) -> str:
    """A report of every job of ``app`` that did not succeed; ``started``:
    the lines of the test's start log (``id pid attempt``)."""
    broker = app.broker
    now = time.time()
    starts = Counter(line.split()[0] for line in started)
    infos = []
    for state in _UNFINISHED:
        cursor = None
        while True:
            page = await broker.list_jobs(JobFilter(state=state), cursor, 500)
            infos += page.items
            if page.cursor is None:
                break
            cursor = page.cursor
    # the ones that ran or were rescued first: a job never started is
    # usually just behind a stuck one in the queue
    infos.sort(key=lambda i: (not (starts[i.message.id] or i.message.errors), i.message.id))
    lines = [f"{len(infos)} jobs did not succeed (stats: {await broker.stats()})"]
    for info in infos[:LIMIT]:
        m = info.message
        errs = "; ".join(f"{e.type.rsplit('.', 1)[-1]}: {e.message}" for e in m.errors)
        lines.append(
            f"  {m.id} {info.state.value} attempt={m.attempt} started={starts[m.id]}"
            f" worker={info.worker} run_at={_ago(info.run_at, now)}"
            f" lease_until={_ago(info.lease_until, now)} errors=[{errs}]"
        )
    from dumbwaiter.brokers.rabbitmq import RabbitMQBroker

    if isinstance(broker, RabbitMQBroker) and infos:
        lines += await _rabbitmq(broker, {i.message.id for i in infos[:LIMIT]})
    return "\n".join(lines)


def _ago(at: float | None, now: float) -> str:
    return "-" if at is None else f"now{at - now:+.2f}s"


async def _rabbitmq(broker: Any, ids: set[str]) -> list[str]:
    """The records of ``ids`` as stored, and every queued copy of them: read
    with ``basic.get`` on a channel of our own, put back when it closes."""
    import aiormq
    from pamqp import commands as spec

    from dumbwaiter.brokers.rabbitmq import topology

    k = broker.keys
    got = await broker.state.kv_get([k.job + i for i in sorted(ids)])
    lines = ["  records:"]
    for i in sorted(ids):
        raw = got.get(k.job + i)
        d = orjson.loads(raw) if raw is not None else None
        lines.append(
            f"    {i} "
            + (
                "none"
                if d is None
                else f"s={d['s']} v={d['v']} t={d['t']} e={d.get('e')} w={d.get('w')}"
            )
        )
    names = broker.names
    queues = {q[len(k.queue) :] for q in await broker.state.kv_scan(k.queue)}
    where = [lq for q in sorted(queues) for lq in names.lanes(q)]
    where += [names.level_queue(n) for n in range(topology.LEVELS)]
    lines.append("  queued copies of them (lanes and the delay cascade):")
    found = 0
    conn = await aiormq.connect(broker.amqp_url)
    try:
        ch = await conn.channel()
        for name in where:
            try:
                await ch.queue_declare(name, passive=True)
            except aiormq.exceptions.ChannelClosed:  # never made (a priority lane)
                ch = await conn.channel()
                continue
            while True:
                m = await ch.basic_get(name, no_ack=False)
                if not isinstance(m.delivery, spec.Basic.GetOk):
                    break
                props = m.header.properties
                if (props.message_id or "") in ids:
                    found += 1
                    h = {a: b for a, b in (props.headers or {}).items() if a.startswith("dw-")}
                    lines.append(
                        f"    {props.message_id} in {name} redelivered={m.delivery.redelivered} {h}"
                    )
    finally:
        await conn.close()  # every copy read goes back to its queue
    if not found:
        lines.append("    none")
    return lines
