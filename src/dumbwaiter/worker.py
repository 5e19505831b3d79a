"""The worker: one asyncio loop that fetches, runs and settles jobs.

* It fetches in batches, never more than its free slots plus a short-job
  prefetch of at most twice its concurrency (bounded in-flight work is the
  back-pressure), and an idle fetch blocks on the broker.
* A slot whose job ended starts the next buffered job in the same task, with
  no turn of the loop in between (see ``Worker._run_slot``).
* Async handlers run on the loop; sync handlers in a thread pool.
* Every fetched job holds a lease; one heartbeat per worker extends all of
  them in one call, so a killed worker's jobs come back within one lease.
* Each job's attempt runs through its middleware (attempt.py); outcomes are
  settled in batches: while one batch is being written, the next collects
  (group commit, settle.py), so a busy worker makes few broker calls and an
  idle one adds no delay.
* On ``stop()`` (SIGTERM/SIGINT) it stops fetching, lets in-flight jobs finish
  within the grace period, then gives the rest back without charging an
  attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from . import keys, logs
from .attempt import Attempt
from .cancel import Cancels
from .context import Context
from .errors import BrokerUnavailable
from .loop import loop_name
from .message import TASK, Message, dumps
from .settle import ACK, CANCEL, DEAD, REQUEUE, RETRY, Settler, inbox_key

# part of the worker's API: its settings and its view of the app
from .worker_config import WorkerApp as WorkerApp
from .worker_config import WorkerConfig as WorkerConfig

if TYPE_CHECKING:
    from .brokers.types import DeadLetter, Delivery

log = logging.getLogger("dumbwaiter.worker")


#: a side service: ``await service(worker)`` runs until cancelled
Service = Callable[["Worker"], Awaitable[None]]

#: kv key prefix under which live workers announce themselves (see Worker._announce)
WORKER_KEY = keys.WORKER

#: seconds of work a worker may hold beyond its free slots (see Worker._prefetch)
PREFETCH_HORIZON = 0.05
#: the most a worker holds beyond its free slots, in multiples of its concurrency
PREFETCH_SLOTS = 2


class Worker(Attempt):
    def __init__(
        self,
        app: WorkerApp,
        config: WorkerConfig | None = None,
        *,
        services: Sequence[Service] = (),
        **kw: Any,
    ) -> None:
        self.app = app
        self.config = config or WorkerConfig(**kw)
        #: side services started with the worker and stopped with it (the
        #: scheduler, the outbox relay...): ``await service(worker)`` runs one
        #: until it is cancelled.
        self.services = list(services)
        self.id = self.config.worker_id
        self.queues: tuple[str, ...] = self.config.queues or tuple(app.queues())
        self.broker = app.broker
        self._inflight: dict[str, Delivery] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        #: every slot task until it ends: ``_tasks`` lets go of a job's task
        #: when the job's handler returns, and the slot still awaits its
        #: settle hooks after that; asyncio holds tasks weakly
        self._slots: set[asyncio.Task[None]] = set()
        self._slot = asyncio.Event()
        self._stopping = False
        self._stopped = asyncio.Event()
        self._immediate = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._stuck = 0  # threads of timed-out sync jobs that still run
        self._buffer: deque[Delivery] = deque()  # fetched, not started (prefetch)
        self._batch = 1
        self._round = 0
        #: the fetches in flight (``stop()`` cancels the idle ones)
        self._fetches: set[asyncio.Future[list[Delivery]]] = set()
        #: the jobs those fetches may bring: room the claim loops reserved
        self._claiming = 0
        self._loops = 1  # the claim loops running (``_fetch_loop``)
        self._dry = True  # the last claim found nothing: the others wait
        self._idle_loops = 0  # claim loops waiting for room (``_slot``)
        #: the rescue pass under way: the stop lets it end (``_rescue``)
        self._rescuing: asyncio.Task[None] | None = None
        self._job_time = 0.0  # moving averages (seconds) that size the prefetch
        self._fetch_time = 0.0
        self.counts = {"succeeded": 0, "retried": 0, "dead": 0, "requeued": 0, "duplicates": 0}
        self.counts["rescued"] = 0  # jobs of other (dead) workers this one gave back
        self.counts["throttled"] = 0  # jobs held back by a rate or concurrency limit
        self.counts["cancelled"] = 0  # jobs stopped on request (dumbwaiter.cancel)
        self._settler = Settler(app, self.counts)
        self._cancels = Cancels()
        self._task_time: dict[str, float] = {}  # per task: moving average run time
        #: per queue: moving average run time, announced for the scaling signal
        #: (``scaling.py``: how many workers a queue needs)
        self._queue_time: dict[str, float] = {}
        #: the context of each job ``_dead`` decided dead, for ``on_dead``
        self._dying: dict[str, Context | None] = {}
        self.started_at = time.time()

    # -- control ---------------------------------------------------------------

    def stop(self, immediate: bool = False) -> None:
        """Ask the worker to stop (thread- and signal-safe).  ``immediate``
        skips the grace period: running jobs are given back at once."""
        loop = self._loop
        if loop is None:
            self._stopping = True
            self._immediate = self._immediate or immediate
            return
        loop.call_soon_threadsafe(self._request_stop, immediate)

    def _request_stop(self, immediate: bool) -> None:
        if self._stopping and not immediate:
            return
        self._stopping = True
        self._immediate = self._immediate or immediate
        self._slot.set()
        for f in self._fetches:
            f.cancel()
        if immediate:
            self._stopped.set()

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    # -- main loop ---------------------------------------------------------------

    async def run(self) -> None:
        """Work until ``stop()``; returns after in-flight work is settled."""
        self._loop = asyncio.get_running_loop()
        cfg = self.config
        installed = logs.install(cfg.log_format) if cfg.log_format is not None else None
        try:
            await self._run()
        finally:
            if installed is not None:
                installed.remove()

    async def _run(self) -> None:
        cfg = self.config
        self._pool = ThreadPoolExecutor(cfg.concurrency, thread_name_prefix="dumbwaiter-job")
        if not await self._connect():  # stopped before the broker came up
            self._pool.shutdown(wait=False)
            return
        try:
            await self._announce()
        except Exception:
            log.exception("could not announce the worker; carrying on")
        self.app.middleware.call("on_worker_start", self)
        services = [
            asyncio.create_task(self._settler.run(), name="dumbwaiter-settler"),
            asyncio.create_task(self._service(self._heartbeat, cfg.heartbeat), name="heartbeat"),
            asyncio.create_task(self._service(self._rescue, cfg.rescue_interval), name="rescuer"),
            *(
                asyncio.create_task(self._guard(s), name=getattr(s, "__name__", "service"))
                for s in self.services
            ),
        ]
        log.info(
            "worker %s started: queues %s, concurrency %d, %s loop",
            self.id,
            ",".join(self.queues),
            cfg.concurrency,
            loop_name(),
            extra={"action": "worker_start"},
        )
        try:
            await self._fetch_loop()
            await self._drain()
        finally:
            for s in services[1:]:
                s.cancel()
            await asyncio.gather(*services[1:], return_exceptions=True)
            await self._end_rescue()
            await self._settler.close()
            await asyncio.gather(services[0], return_exceptions=True)
            with contextlib.suppress(Exception):
                await self.broker.kv_delete([WORKER_KEY + self.id])
            self.app.middleware.call("on_worker_stop", self)
            self._pool.shutdown(wait=False, cancel_futures=True)
            log.info("worker %s stopped: %s", self.id, self.counts, extra={"action": "worker_stop"})

    async def _connect(self) -> bool:
        """Open the broker and declare this worker's queues, waiting for a
        broker that is not up yet (a worker started before its server, or
        during its restart) as its loops wait later: with backoff, up to 5 s
        between tries.  False if ``stop()`` came first.  A broker that
        refuses the URL for good (credentials, a missing database or vhost)
        fails the start."""
        backoff = 0.05
        while not self._stopping:
            try:
                await self.broker.open()
                bindings = self.app.bindings() if self.broker.capabilities.events else []
                await self.broker.declare(list(self.queues), bindings)
                return True
            except BrokerUnavailable as exc:
                log.warning("%s; trying again in %.2f s", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
        return False

    async def _fetch_loop(self) -> None:
        """Claim jobs until ``stop()``: as many claim loops as the broker
        allows fetches in flight (``Capabilities.concurrent_fetches``).  With
        one, a busy worker waits a round trip between claims; a second claim
        sent while the first is on its way keeps the slots fed when that
        round trip is long because the server is busy (serving another
        process, say).  The loops share one bound: together they never
        claim more than the free slots and the prefetch, each at most its
        share of it, so one claim lands while another is on its way."""
        cfg = self.config
        # Fetch in batches: with work in flight, wait until a quarter of the
        # slots are free, so a busy worker makes few large claims.
        self._batch = max(1, min(cfg.concurrency // 4, 32))
        loops = self._loops = max(1, self.broker.capabilities.concurrent_fetches)
        if loops == 1:
            await self._claim_loop()
            return
        try:
            async with asyncio.TaskGroup() as group:
                for i in range(loops):
                    group.create_task(self._claim_loop(), name=f"dumbwaiter-claim-{i}")
        except BaseExceptionGroup as failed:
            # the first loop's error, as one loop would raise it (the group
            # cancelled the others because of it)
            raise failed.exceptions[0] from None

    async def _claim_loop(self) -> None:
        cfg = self.config
        batch = self._batch
        backoff = 0.05
        while not self._stopping:
            held = self._held()
            room = self._room(held)
            # the queues ran dry: one claim waits on the broker, not one a loop
            if (
                room <= 0
                or ((held or self._claiming) and room < batch)
                or (self._claiming and self._dry)
            ):
                self._slot.clear()
                self._idle_loops += 1
                try:
                    await self._slot.wait()
                finally:
                    self._idle_loops -= 1
                continue
            started = time.monotonic()
            # Start each fetch at the next queue, so a busy queue cannot starve
            # the others; priority orders jobs within a queue.
            k = self._round % len(self.queues)
            self._round += 1
            queues = self.queues[k:] + self.queues[:k]
            fetching = asyncio.ensure_future(
                self.broker.fetch(queues, room, cfg.lease, cfg.fetch_wait, self.id)
            )
            self._fetches.add(fetching)
            self._claiming += room
            try:
                ds = await fetching
            except asyncio.CancelledError:
                if fetching.cancelled() and self.stopping:
                    break  # stop() interrupted an idle fetch; nothing was leased
                raise
            except Exception:
                log.exception("fetch failed; retrying in %.2f s", backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            finally:
                self._fetches.discard(fetching)
                self._claiming -= room
                self._slot.set()  # what this claim did not bring is room for another
            backoff = 0.05
            self._dry = not ds
            if self.stopping:  # stop() came while we waited: give the batch back
                await self.broker.requeue(ds)
                break
            if ds and held:
                # a busy worker's fetch returns at once; cap it in case it waited
                took = min(time.monotonic() - started, 0.05)
                self._fetch_time += (took - self._fetch_time) * 0.2
            await self._check_inbox(ds)
            self._buffer.extend(ds)
            self._fill()

    async def _check_inbox(self, ds: list[Delivery]) -> None:
        """Mark event deliveries this group already handled (the broker-side
        inbox), so a redelivered or replayed duplicate is acked, not run."""
        keys: dict[str, Delivery] = {}
        for d in ds:
            k = d.inbox = inbox_key(d)
            if k is not None:
                keys[k] = d
        if not keys:
            return
        try:
            seen = await self.broker.kv_get(list(keys))
        except Exception:
            log.exception("inbox check failed; running the events (at-least-once)")
            return
        for k in seen:
            keys[k].duplicate = True

    def _held(self) -> int:
        """The jobs this worker holds: running, buffered, and the slots of
        stuck threads."""
        return len(self._inflight) + len(self._buffer) + self._stuck

    def _room(self, held: int) -> int:
        """How many jobs a claim may ask for now: the slots and the prefetch,
        less what the worker holds (``held``) and what its claims under way
        may bring; each claim loop at most its share of that bound, so one
        claim lands while another is still on its way."""
        most = self.config.concurrency + self._prefetch()
        return min(most - held - self._claiming, max(self._batch, most // self._loops))

    def _prefetch(self) -> int:
        """How many jobs to hold beyond the free slots.

        The jobs this worker will finish within ``PREFETCH_HORIZON`` (or two
        fetch round trips, if longer): running x horizon / job time.  Short
        jobs then never wait for a round trip (even when a whole batch ends at
        once), while a worker never holds more than a few tens of
        milliseconds of work that an idle worker could have started: for
        jobs of a second or more it holds none (Celery's prefetch starvation).

        At most ``PREFETCH_SLOTS`` x concurrency: equal short jobs end in
        waves of up to every slot at once, and each freed slot takes its next
        job from the buffer before the fetch loop runs again (``_run_slot``),
        so a buffer of one wave (concurrency) is empty after a full wave and
        the next wave's jobs, which end while the refill is on its way,
        find nothing and their slots idle for a claim's round trip (measured
        on W4: docs/benchmarks.md, "W4: a freed slot starts at once").  Twice
        the slots keeps a wave in reserve.
        """
        if self._job_time <= 0.0:
            return 0
        horizon = max(PREFETCH_HORIZON, 2 * self._fetch_time)
        n = int(len(self._inflight) * horizon / self._job_time + 0.5)
        return min(PREFETCH_SLOTS * self.config.concurrency, n)

    def _fill(self) -> None:
        """Start buffered jobs while slots are free."""
        limit = self.config.concurrency - self._stuck
        while self._buffer and len(self._inflight) < limit:
            d = self._buffer.popleft()
            self._inflight[d.id] = d
            slot = self._tasks[d.id] = asyncio.create_task(self._run_slot(d))
            self._slots.add(slot)
            slot.add_done_callback(self._slots.discard)

    async def _run_slot(self, d: Delivery) -> None:
        """Run ``d``, then buffered jobs one after another while the slot is free.

        The next job starts in this task, right after the previous one is
        settled, without a turn of the loop: a new task per job would only
        start after every other callback already queued, and when a wave of
        timers fires together (jobs that slept alike), that is every other
        job of the wave ending first: slots idle between jobs (measured on
        W4: docs/benchmarks.md, "W4: a freed slot starts at once").
        Contextvars are as before: a
        task made here copied the ending job's context anyway.  The run is
        bounded by the buffer, which only a fetch (a turn of the loop) fills.
        """
        me = asyncio.current_task()
        assert me is not None
        while True:
            await self._process(d)
            if self._stopping or me.cancelling():
                break  # shutdown: _drain gives the buffer back
            if not self._buffer or len(self._inflight) >= self.config.concurrency - self._stuck:
                break
            d = self._buffer.popleft()
            self._inflight[d.id] = d
            self._tasks[d.id] = me
            self._fill()  # more slots may be free (a stuck thread returned)
            if self._idle_loops and self._room(self._held()) >= self._batch:  # a claim is due
                self._slot.set()
                if self._loops > 1:
                    # let a claim loop send it before this job runs, so it
                    # is on its way while the buffer's jobs run (a slot whose
                    # jobs do not wait runs the whole buffer first, and the
                    # claim would leave only once the slots are empty)
                    await asyncio.sleep(0)
        self._slot.set()

    async def _drain(self) -> None:
        """After stop: wait for in-flight jobs (grace period), then give back the rest."""
        if self._tasks and not self._immediate:
            log.info(
                "stopping: waiting up to %.0f s for %d running job(s)",
                self.config.grace,
                len(self._tasks),
            )
            waiter = asyncio.ensure_future(asyncio.wait(list(self._tasks.values())))
            await self._within_grace(waiter)
            waiter.cancel()
        buffered = list(self._buffer)
        self._buffer.clear()
        for d in buffered:
            self._settler.add(REQUEUE, d)
        left = [self._inflight[i] for i in list(self._tasks) if i in self._inflight]
        for t in list(self._tasks.values()):
            t.cancel()
        if left:
            log.warning("giving back %d unfinished job(s) without charging an attempt", len(left))
            for d in left:
                self._inflight.pop(d.id, None)
                self._settler.add(REQUEUE, d)
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    # -- side services -----------------------------------------------------------

    async def _service(self, fn: Callable[[], Awaitable[None]], every: float) -> None:
        while True:
            await asyncio.sleep(every)
            try:
                await fn()
            except Exception:
                log.exception("%s failed; will try again", getattr(fn, "__name__", fn))

    async def _guard(self, service: Service) -> None:
        """Run a side service; if it crashes, log it and stop the worker, so a
        replica without its scheduler or relay does not look healthy."""
        try:
            await service(self)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("service %s crashed; stopping the worker", service)
            self._request_stop(False)

    async def _heartbeat(self) -> None:
        ds = [*self._inflight.values(), *self._buffer]
        holds = [h for d in self._inflight.values() for h in d.holds]
        if holds:
            await self.broker.slot_extend(holds, self.config.lease)
        if ds:
            lost = await self.broker.extend(ds, self.config.lease)
            if lost and self._buffer:
                gone = {d.id for d in lost}
                self._buffer = deque(d for d in self._buffer if d.id not in gone)
            for d in lost:
                log.warning(
                    "lost the lease of job %s (it may run again elsewhere)",
                    d.id,
                    extra={"action": "lease_lost", "job_id": d.id},
                )
        await self._announce()  # after the leases: they matter more
        await self._poll_cancels()

    async def _poll_cancels(self) -> None:
        """Read the cancel requests (``dumbwaiter.cancel``): a running job's
        ``ctx.cancelled`` turns True; a fetched job not started yet ends now."""
        asked = await self._cancels.poll(
            self.broker, [*self._inflight, *(d.id for d in self._buffer)]
        )
        held = [d for d in self._buffer if d.id in asked]
        if held:
            self._buffer = deque(d for d in self._buffer if d.id not in asked)
            for d in held:
                kind = self._cancels.end(d.id, REQUEUE, ACK, CANCEL)[0]
                if kind == CANCEL:
                    await self._cancelled(d, None)
                self._settler.add(kind, d)

    async def _announce(self) -> None:
        """Publish this worker's liveness under ``worker:ID`` in the broker's kv
        store (expiring after two leases), for ``stats``, alerts and the
        dashboard: a worker that stops heartbeating disappears by itself."""
        info = {
            "id": self.id,
            "queues": list(self.queues),
            "concurrency": self.config.concurrency,
            "inflight": len(self._inflight),
            "buffered": len(self._buffer),
            "prefetched": self._prefetched_by_queue(),
            "job_seconds": dict(self._queue_time),
            "started_at": self.started_at,
            "heartbeat_at": time.time(),
            "counts": dict(self.counts),
            "stopping": self._stopping,
        }
        await self.broker.kv_set({WORKER_KEY + self.id: dumps(info)}, ttl=2 * self.config.lease)

    def _prefetched_by_queue(self) -> dict[str, int]:
        """The buffered jobs per queue, for ``stats`` to tell them from
        running ones (the broker sees both as leased)."""
        out: dict[str, int] = {}
        for d in self._buffer:
            q = d.queue or (d.message.queue if d.message is not None else "")
            out[q] = out.get(q, 0) + 1
        return out

    async def _rescue(self) -> None:
        """One rescue pass, shielded from the stop that cancels the side
        services: once the broker has buried a job in it, only this pass
        can report it (``on_dead``, the log line), and nothing would call
        the hooks for it again; ``_end_rescue`` waits for it."""
        self._rescuing = asyncio.ensure_future(self._rescue_pass())
        await asyncio.shield(self._rescuing)

    async def _within_grace(self, fut: asyncio.Future[Any]) -> None:
        """Wait for ``fut`` within the grace period, or until an immediate
        stop; ``fut`` is left running (the caller cancels what it must)."""
        stop = asyncio.ensure_future(self._stopped.wait())
        await asyncio.wait(
            {fut, stop}, timeout=self.config.grace, return_when=asyncio.FIRST_COMPLETED
        )
        stop.cancel()

    async def _end_rescue(self) -> None:
        """At stop, after the side services are cancelled: let a rescue
        pass under way end, within the grace period (an immediate stop
        does not wait), so the jobs it buried are reported."""
        task = self._rescuing
        if task is None or task.done():
            return
        await self._within_grace(task)
        task.cancel()
        [ended] = await asyncio.gather(task, return_exceptions=True)
        if isinstance(ended, Exception):
            log.error("the last rescue pass failed: %r", ended)

    async def _rescue_pass(self) -> None:
        rescued = await self.broker.rescue()
        n = int(rescued)
        if n:
            self.counts["rescued"] += n
            self.app.middleware.call("on_rescued", self, n)
            log.warning(
                "rescued %d job(s) whose worker stopped heartbeating",
                n,
                extra={"action": "rescue"},
            )
        for dl in rescued.dead:
            await self._rescued_dead(dl)

    async def _rescued_dead(self, dl: DeadLetter) -> None:
        """Report a job the broker dead-lettered for a lost lease (no worker
        settled it) as ``_dead`` reports the ones this worker dead-letters:
        ``on_dead`` (so the dead-letter metric and user middleware see it) and
        a log line.  ``ctx.message`` is the job's stored envelope (its real
        arguments and headers, every error) as the broker reports it; only a
        body that does not decode leaves a stub of id, name, queue, attempt
        and the ``LeaseExpired`` error."""
        msg = dl.message
        if msg is None:
            msg = Message(
                id=dl.id,
                kind=TASK,
                name=dl.name,
                queue=dl.queue,
                attempt=dl.error.attempt,
                max_attempts=dl.error.attempt,
                errors=[dl.error],
            )
        ctx = Context(message=msg, app=self.app, worker_id=self.id)
        await self.app.middleware.acall("on_dead", ctx, dl.error)
        log.warning(
            "job %s (%s) dead-lettered after attempt %d of %d (its worker was lost): %s: %s",
            dl.id,
            dl.name,
            dl.error.attempt,
            msg.max_attempts,
            dl.error.type,
            dl.error.message,
            extra={
                "event": logs.JOB_FINISHED,
                "action": logs.DEAD,
                "task": dl.name,
                "job_id": dl.id,
                "queue": dl.queue,
                "attempt": dl.error.attempt,
                "max_attempts": msg.max_attempts,
                "duration_ms": None,
                "outcome": logs.DEAD,
                "retry_in_s": None,
                "error_type": dl.error.type,
                "error": dl.error.message,
            },
        )

    # -- one job -----------------------------------------------------------------

    async def _process(self, d: Delivery) -> None:
        started = time.monotonic()
        try:
            kind = await self._execute(d)
        except asyncio.CancelledError:
            kind = REQUEUE  # only shutdown cancels jobs: give them back uncharged
        finally:
            self._tasks.pop(d.id, None)
        # ctx: the handler's, if it got that far
        kind, ctx = self._cancels.end(d.id, kind, ACK, CANCEL)
        took = time.monotonic() - started
        self._job_time += (took - self._job_time) * 0.1
        queue = d.queue or (d.message.queue if d.message is not None else "")
        prev = self._queue_time.get(queue, took)
        self._queue_time[queue] = prev + (took - prev) * 0.2
        if d.holds and d.message is not None:  # a limited task: keep its run time
            prev = self._task_time.get(d.message.name, took)
            self._task_time[d.message.name] = prev + (took - prev) * 0.2
        if d.id in self._dying:  # decided dead (and maybe cancelled since)
            assert d.error is not None
            await self.app.middleware.acall("on_dead", self._dying.pop(d.id), d.error)
        if kind == CANCEL:
            await self._cancelled(d, ctx)
        if kind != REQUEUE and not d.duplicate:
            # the line of a finished job: built only if it will be written
            level = logging.WARNING if kind == DEAD else logging.INFO
            if log.isEnabledFor(level):
                self._finished(d, kind, took, level)
        if self._inflight.pop(d.id, None) is not None:
            self._settler.add(kind, d)

    def _finished(self, d: Delivery, kind: str, took: float, level: int) -> None:
        """Log one line for a finished attempt: succeeded (INFO), retrying
        (INFO) or dead-lettered (WARNING), with its facts as the record's
        extra fields (``logs.JOB_FIELDS``) for a JSON formatter."""
        msg = d.message
        name = msg.name if msg is not None else "undecodable"
        attempt = msg.attempt if msg is not None else 0
        most = msg.max_attempts if msg is not None else 0
        ms = took * 1000.0
        err = d.error
        etype = err.type if err is not None else None
        etext = err.message if err is not None else None
        retry_in = None
        args: tuple[object, ...]
        if kind == ACK:
            outcome = logs.SUCCEEDED
            text, args = "job %s (%s) succeeded in %.1f ms", (d.id, name, ms)
        elif kind == RETRY:
            outcome = logs.RETRYING
            retry_in = round(max(0.0, d.retry_at - time.time()), 3)
            text = "job %s (%s) retrying in %.1f s: attempt %d of %d failed in %.1f ms: %s: %s"
            args = (d.id, name, retry_in, attempt, most, ms, etype, etext)
        else:
            outcome = logs.DEAD
            text = "job %s (%s) dead-lettered after attempt %d of %d (%.1f ms): %s: %s"
            args = (d.id, name, attempt, most, ms, etype, etext)
        log.log(
            level,
            text,
            *args,
            extra={
                "event": logs.JOB_FINISHED,
                "action": outcome,
                "task": name,
                "job_id": d.id,
                "queue": d.queue or (msg.queue if msg is not None else ""),
                "attempt": attempt,
                "max_attempts": most,
                "duration_ms": round(ms, 3),
                "outcome": outcome,
                "retry_in_s": retry_in,
                "error_type": etype,
                "error": etext,
            },
        )

    async def _cancelled(self, d: Delivery, ctx: Context | None) -> None:
        """``on_cancelled`` for a job stopped on request (``ctx``: its handler's,
        None for one fetched and not started)."""
        mw = self.app.middleware
        if d.message is None or not mw.runs("on_cancelled", d.message):
            return
        if ctx is None:
            ctx = Context(message=d.message, app=self.app, worker_id=self.id)
        await mw.acall("on_cancelled", ctx)
