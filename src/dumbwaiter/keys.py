"""Every key namespace dumbwaiter keeps in a broker's key-value and
coordination parts, named in one place.

Why one module: the kv store is shared by the worker, the scheduler, the
workflows, the dashboard, the webhooks and the engines themselves; a prefix
chosen twice (or a scan of ``worker:`` that also finds ``workers:...``)
would mix their records.  Reading this list is how a new feature picks a
free prefix, and how an operator knows what a key in Redis or in the
``dw_kv`` table belongs to.  Values are plain strings: build a key as
``keys.WORKER + worker_id``.
"""

from __future__ import annotations

# -- the worker ------------------------------------------------------------------

#: ``worker:ID``: a live worker's announcement (JSON), refreshed every heartbeat
WORKER = "worker:"
#: ``inbox:QUEUE:EVENT_ID``: the event was handled by the group of QUEUE
INBOX = "inbox:"
#: ``ckpt:JOB_ID``: a job's last ``ctx.checkpoint`` state
CHECKPOINT = "ckpt:"
#: ``cancel:JOB_ID``: someone asked the job to stop (``dumbwaiter.cancel``)
CANCEL = "cancel:"

# -- flow control (coordination: slots, rate windows, unique keys) ---------------

#: ``conc:TASK:LIMIT_KEY``: a task's concurrency slots
CONCURRENCY = "conc:"
#: ``rate:TASK:LIMIT_KEY``: a task's rate-limit window
RATE = "rate:"
#: ``unique:TASK:DIGEST``: the job key of a ``unique=`` task's call
UNIQUE = "unique:"
#: ``debounce:TASK:DIGEST``: the job key of a ``debounce=`` task's call
DEBOUNCE = "debounce:"

# -- workflows and batches ---------------------------------------------------------

#: ``wf:ID`` a chain's plan; ``wf:ID:r:STEP`` results, ``wf:ID:done:STEP`` a
#: chord's finished members, ``wf:ID:result`` the last result, ``wf:ID:dead`` the
#: hint that a step died
WORKFLOW = "wf:"
#: ``batches:ID``: a batch's record
BATCH_RECORD = "batches:"
#: ``batch:ID:ok`` / ``batch:ID:failed``: the indexes of its finished shards
BATCH_SHARDS = "batch:"
#: durable workflows (``dumbwaiter.durable.store``): a run's record, its step
#: checkpoints, step attempts, pending events, event waiters, event shapes
RUN = "wfrun:"
RUN_CHECKPOINT = "wfck:"
RUN_TRIES = "wftry:"
RUN_PENDING = "wfpend:"
RUN_WAITER = "wfwait:"
RUN_SHAPE = "wfshape:"
#: the task-name prefix of a durable workflow's runner jobs (a name, not a key,
#: kept here because the dashboard and CLI tell those jobs apart by it)
RUN_TASK = "dw.wf:"

# -- the scheduler -------------------------------------------------------------------

#: the leader lease (coordination lock)
SCHEDULER_LOCK = "dumbwaiter:scheduler"
#: ``dumbwaiter:schedule:NAME``: a schedule's last tick and its leader
SCHEDULE = "dumbwaiter:schedule:"
#: ``dumbwaiter:schedule-paused:NAME``
SCHEDULE_PAUSED = "dumbwaiter:schedule-paused:"
#: ``dumbwaiter:schedule-trigger:NAME``: a tick asked for by hand
SCHEDULE_TRIGGER = "dumbwaiter:schedule-trigger:"
#: ``periodic:NAME:TICK``: the job key of one tick (unique across replicas)
PERIODIC = "periodic:"

# -- the outbox relay ------------------------------------------------------------------

#: ``relay:SOURCE``: the lock one relay per outbox table holds
RELAY_LOCK = "relay:"

# -- bounded queues -------------------------------------------------------------------

#: ``capacity:QUEUE``: the lock producers of a bounded queue take around the
#: count and the enqueue, on engines without a native bound (brokers/capacity.py)
CAPACITY_LOCK = "capacity:"

# -- observability ------------------------------------------------------------------

#: ``dumbwaiter:throughput:MINUTE``: one sample of the workers' counts
THROUGHPUT = "dumbwaiter:throughput:"
#: alert state: ``ALERT + "pending:"`` ... (see ``dumbwaiter.alerts``)
ALERT = "dumbwaiter:alert:"

# -- webhooks and mail -------------------------------------------------------------

#: ``webhooks:ep:ID``: an endpoint
WEBHOOK_ENDPOINT = "webhooks:ep:"
#: ``webhooks:breaker:HOST``: a host's circuit breaker
WEBHOOK_BREAKER = "webhooks:breaker:"
#: ``webhooks:log:ENDPOINT:...`` attempts, ``webhooks:stat:ENDPOINT:MINUTE:OK`` counts
WEBHOOK_LOG = "webhooks:log:"
WEBHOOK_STAT = "webhooks:stat:"
#: ``mail:sent:ID`` / ``mail:suppressed:ADDRESS``
MAIL_SENT = "mail:sent:"
MAIL_SUPPRESSED = "mail:suppressed:"

# -- the engines -----------------------------------------------------------------------

#: the id of a broker's state store (``brokers.identity``; no ttl)
STORE_ID = "_dw:store-id"
#: PostgreSQL's maintenance lock (pruning, one process at a time)
MAINTENANCE_LOCK = "dumbwaiter:maintenance"


def checkpoint(job_id: str) -> str:
    return CHECKPOINT + job_id


def inbox(queue: str, event_id: str) -> str:
    """The key that marks event ``event_id`` handled by the group of ``queue``."""
    return f"{INBOX}{queue}:{event_id}"
