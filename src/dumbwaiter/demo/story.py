"""The story ``dumbwaiter demo`` tells, one phase after the other.

1. setup: a fresh SQLite broker file, the shop's database, the partner's
   webhook endpoint (down at first) and N worker processes;
2. orders: the order endpoint saves each order and enqueues three jobs; a
   live table shows the queues until they are drained;
3. report: endpoint latency, jobs done, retried and dead-lettered;
4. fix and replay: the partner is healthy, the dead letters are replayed
   through the admin API and run;
5. check: every order has its receipt, its analytics event and its webhook;
   then the workers get SIGTERM and stop gracefully.

Import this module only after ``$DUMBWAITER_DEMO_DIR`` names the demo
directory (``dumbwaiter.demo`` builds its app from it).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.table import Table

from ..brokers.base import JobFilter, QueueStats
from ..state import State
from . import (
    DIR_ENV,
    QUEUES,
    TASKS,
    WEBHOOK_RETRY,
    WEBHOOKS,
    app,
    broker_url,
    create_shop,
    place_order,
    shop_connect,
    shop_path,
)
from .display import TaskOutcome, delivery_table, outcome_table, percentile, queue_table
from .partner import PartnerServer
from .workers import WorkerProcesses

#: seconds over which the orders arrive
ORDER_WINDOW = 5.0
#: the partner comes back once this share of the orders is in and some of its
#: jobs are dead-lettered (with the partner down, they all are, in the end)
REPAIR_AT = 0.4
#: longest a phase may wait for the queues before the demo gives up (plus
#: 10 ms per order)
WAIT_LIMIT = 40.0
#: seconds workers get to exit after SIGTERM before they are killed
STOP_TIMEOUT = 15.0
#: seconds between two looks at the queues (the live table's refresh)
POLL = 0.2

Stats = dict[str, QueueStats]


@dataclass(frozen=True, slots=True)
class Options:
    orders: int
    workers: int
    directory: Path
    concurrency: int = 16


class DemoFailed(Exception):
    """Something the demo cannot go on from (a worker died, a phase timed out)."""


def run(opts: Options, console: Console) -> int:
    """Tell the whole story; the exit code is 0 only if every job was delivered."""
    return asyncio.run(Story(opts, console).run())


class Story:
    def __init__(self, opts: Options, console: Console) -> None:
        self.opts = opts
        self.console = console
        self.shop = shop_path(opts.directory)
        self.partner = PartnerServer()
        self.workers = WorkerProcesses(opts.directory, opts.workers, opts.concurrency)
        self.logs_shown = False
        self.latencies: list[float] = []
        self.accepted = 0
        self.order_seconds = 0.0
        self.repaired_at: float | None = None
        self.stop_orders = threading.Event()
        self.started = time.monotonic()
        self.short = {q: t.name.rsplit(".", 1)[-1] for q, t in TASKS.items()}

    def say(self, text: str = "") -> None:
        self.console.print(text)

    def heading(self, text: str) -> None:
        self.console.print()
        self.console.print(f"[bold]{text}[/]")

    # -- the whole story ---------------------------------------------------------

    async def run(self) -> int:
        if app.url != broker_url(self.opts.directory):
            raise RuntimeError(
                f"dumbwaiter.demo was imported with {DIR_ENV} for another directory "
                f"({app.url}); set {DIR_ENV} before importing it"
            )
        delivered = stopped = False
        try:
            self.intro()
            await self.setup()
            await self.take_orders()
            await self.report()
            await self.fix_and_replay()
            delivered = await self.check()
        except DemoFailed as exc:
            self.console.print(f"\n[bold red]The demo failed:[/] {exc}")
            self.show_worker_logs()
        except asyncio.CancelledError:
            self.console.print("\n[bold]Interrupted.[/]")
            raise
        finally:
            self.stop_orders.set()
            stopped = await self.stop_workers()
            self.partner.stop()
            await app.aclose()
        self.say(f"\nTotal wall time {time.monotonic() - self.started:.1f} s.")
        return 0 if delivered and stopped else 1

    def intro(self) -> None:
        self.console.print("[bold]dumbwaiter demo[/]: an API that answers fast, and slow work that")
        self.say(
            "still gets done.\n\n"
            "An API must answer in milliseconds, so the order endpoint only saves the order\n"
            "and enqueues the slow work: a receipt e-mail, an analytics event, a webhook to\n"
            "a partner. Workers do it later. Failures are retried with backoff; what keeps\n"
            "failing goes to the dead-letter queue and is replayed once the fault is fixed.\n"
            "It all runs on embedded SQLite (one file, no server); the only network\n"
            "traffic is to 127.0.0.1."
        )

    # -- 1. setup ---------------------------------------------------------------

    async def setup(self) -> None:
        self.heading("1. Setup")
        create_shop(self.shop)
        await app.broker.open()  # creates the broker's tables before the workers start
        self.partner.start()
        await asyncio.to_thread(self.workers.start)
        pids = ", ".join(map(str, self.workers.pids))
        self.say(f"  broker    {app.url}")
        self.say(f"  shop      {self.shop}")
        self.say("            (orders, and the receipts and analytics events the jobs record)")
        self.say(f"  partner   {self.partner.url}")
        self.say("            down (HTTP 503) at first; the demo repairs it partway through")
        self.say(
            f"  workers   {self.opts.workers} processes (pids {pids}) on the same SQLite file,\n"
            f"            {self.opts.concurrency} jobs in flight each:\n"
            "            python -m dumbwaiter worker --app dumbwaiter.demo:app \\\n"
            f"              -q {','.join(QUEUES)} -c {self.opts.concurrency}"
        )

    # -- 2. orders ----------------------------------------------------------------

    async def take_orders(self) -> None:
        n = self.opts.orders
        self.heading("2. Orders")
        self.say(
            f"  {n} orders arrive over {ORDER_WINDOW:g} s. For each, the endpoint saves the\n"
            "  order and enqueues send_receipt (queue email, a sync task), track_order\n"
            "  (analytics, an async task) and notify_partner (webhooks: a POST to the\n"
            "  partner). While the partner is down its calls fail; they are retried 0.5 s\n"
            "  and 1 s later, and those still failing after 3 attempts go to the\n"
            "  dead-letter queue. Watching app.broker.stats() until the queues are drained:\n"
        )
        orders = asyncio.ensure_future(asyncio.to_thread(self.order_loop))

        def drained(stats: Stats) -> bool:
            self.maybe_repair(stats)
            if not orders.done():
                return False
            if exc := orders.exception():
                raise DemoFailed(f"the order endpoint failed: {exc!r}") from exc
            return all(_settled(stats, q, self.accepted) for q in QUEUES)

        try:
            await self.watch("Queues while orders come in", drained)
        finally:
            self.stop_orders.set()
            await asyncio.gather(orders, return_exceptions=True)

    def maybe_repair(self, stats: Stats) -> None:
        """The partner fixes its side partway through the orders: once some of its
        jobs are dead-lettered, so the story has dead letters to replay, while
        others are still inside their retry schedule, so some succeed on a retry."""
        if self.repaired_at is not None:
            return
        dead = (stats.get(WEBHOOKS) or QueueStats(queue=WEBHOOKS)).dead
        if dead and self.accepted >= REPAIR_AT * self.opts.orders:
            self.partner.fix()
            self.repaired_at = time.monotonic() - self.started
            self.say(
                f"  At {self.repaired_at:.1f} s the partner fixed its side: its endpoint is up."
            )

    def order_loop(self) -> None:
        """The order endpoint, called ``orders`` times at a steady rate (own thread)."""
        n = self.opts.orders
        rng = random.Random(7)
        interval = ORDER_WINDOW / n
        endpoint = self.partner.url
        with closing(shop_connect(self.shop)) as conn:
            start = time.perf_counter()
            for i in range(n):
                wait = start + i * interval - time.perf_counter()
                if self.stop_orders.wait(wait) if wait > 0 else self.stop_orders.is_set():
                    return
                order_id = f"o-{i + 1:05d}"
                t = time.perf_counter()
                email = f"customer{i + 1}@example.com"
                place_order(conn, order_id, email, rng.randint(500, 20000), endpoint)
                self.latencies.append(time.perf_counter() - t)
                self.accepted += 1
            self.order_seconds = time.perf_counter() - start

    async def watch(self, title: str, done: Callable[[Stats], bool]) -> Stats:
        """Refresh the live table until ``done(stats)``; give up after a time limit."""
        limit = WAIT_LIMIT + self.opts.orders / 100
        deadline = time.monotonic() + limit
        with Live(console=self.console, auto_refresh=False, transient=False) as live:
            while True:
                stats = {s.queue: s for s in await app.broker.stats()}
                live.update(self.table(title, stats), refresh=True)
                if done(stats):
                    break
                exited = self.workers.exited()
                if exited:
                    raise DemoFailed(exited)
                if time.monotonic() > deadline:
                    raise DemoFailed(f"{title}: the queues did not drain in {limit:.0f} s")
                await asyncio.sleep(POLL)
        self.say()
        return stats

    def table(self, title: str, stats: Stats) -> Table:
        caption = (
            f"orders accepted {self.accepted}/{self.opts.orders} | "
            f"partner {'UP' if self.partner.up else 'DOWN (503)'} | "
            f"{time.monotonic() - self.started:.1f} s"
        )
        return queue_table(title, stats, self.short, caption)

    # -- 3. report ----------------------------------------------------------------

    async def report(self) -> None:
        self.heading("3. Report")
        lat = sorted(self.latencies)
        secs = self.order_seconds
        rate = self.accepted / secs if secs else 0.0
        self.say(f"  orders accepted    {self.accepted} in {secs:.1f} s ({rate:.0f}/s)")
        self.say(
            f"  endpoint latency   p50 {percentile(lat, 50) * 1000:.1f} ms, "
            f"p99 {percentile(lat, 99) * 1000:.1f} ms\n"
            "                     (save the order + 3 durable enqueues, fsync included)"
        )
        stats = {s.queue: s for s in await app.broker.stats()}
        rows = []
        for queue, task in TASKS.items():
            s = stats.get(queue) or QueueStats(queue=queue)
            after_retry = await _count_retried(task.name)
            rows.append(TaskOutcome(self.short[queue], queue, s.succeeded, after_retry, s.dead))
        self.console.print(outcome_table(rows))
        backoff = ", ".join(f"{w:g}" for w in WEBHOOK_RETRY.backoff)
        self.say(
            f"  The partner refused {self.partner.refused} calls while it was down. notify_partner"
            " uses the\n  demo's short schedule,"
            f" dw.Retry(attempts={WEBHOOK_RETRY.attempts}, backoff=({backoff})), with jitter;\n"
            "  production keeps the default dw.Retry(): 4 attempts, waits of 5 s, 30 s and\n"
            "  5 min. Done inline, every order would have waited for the mail provider, the\n"
            "  analytics API and the partner, and failed while the partner was down."
        )

    # -- 4. fix and replay ---------------------------------------------------------

    async def fix_and_replay(self) -> None:
        self.heading("4. The fault is fixed: replay the dead letters")
        self.partner.fix()  # already up since maybe_repair; the replay needs it healthy
        since = f" since {self.repaired_at:.1f} s" if self.repaired_at is not None else ""
        page = await app.broker.list_jobs(JobFilter(state=State.DEAD), limit=1)
        self.say(
            f"  The partner has been healthy{since}, but dead letters do not come back\n"
            "  by themselves: they wait in the dead-letter queue, with every attempt's\n"
            "  error, until someone replays them (dumbwaiter dlq replay, the dashboard,\n"
            "  or the admin API, as here)."
        )
        if page.items:
            m = page.items[0].message
            last = m.errors[-1] if m.errors else None
            why = f"{last.type.rsplit('.', 1)[-1]}: {last.message}" if last else "?"
            self.say(
                f"  One of them: job {m.id}\n"
                f"    {m.name.rsplit('.', 1)[-1]}({m.args[0]!r}, ...), "
                f"{len(m.errors)} failed attempts, the last:\n    {why}"
            )
        n = await app.broker.replay(JobFilter(state=State.DEAD))
        self.say(
            "  await app.broker.replay(JobFilter(state=State.DEAD))\n"
            f"    -> {n} {'job' if n == 1 else 'jobs'} ready again, with fresh attempts\n"
        )
        if n:
            await self.watch(
                "Queues after the replay",
                lambda stats: all(_settled(stats, q, self.accepted) for q in QUEUES),
            )

    # -- 5. check -----------------------------------------------------------------

    async def check(self) -> bool:
        self.heading("5. Was every job delivered?")
        dead = sum(s.dead for s in await app.broker.stats())
        with closing(shop_connect(self.shop)) as conn:
            orders = {r[0] for r in conn.execute("SELECT id FROM orders")}
            receipts = {r[0] for r in conn.execute("SELECT order_id FROM receipts")}
            events = {r[0] for r in conn.execute("SELECT order_id FROM analytics_events")}
        notified = set(self.partner.orders)
        deliveries = self.partner.deliveries
        rows = [
            ("orders saved", len(orders), self.opts.orders - len(orders)),
            ("receipts sent", len(receipts & orders), len(orders - receipts)),
            ("analytics events", len(events & orders), len(orders - events)),
            ("orders the partner was told about", len(notified & orders), len(orders - notified)),
        ]
        self.console.print(delivery_table(rows))
        duplicates = deliveries - len(self.partner.by_job)
        self.say(
            f"  webhook deliveries          {deliveries}, {duplicates} of them duplicates\n"
            "                              (at-least-once: harmless, given the job id as\n"
            "                              Idempotency-Key)"
        )
        missing = sum(m for _, _, m in rows)
        self.say(f"  dead letters after replay   {dead}")
        self.say(f"  missing deliveries          {missing}")
        if missing == 0 and dead == 0:
            self.console.print(
                f"  [bold green]OK[/]: all {len(orders)} {_orders(len(orders))} delivered:"
                " each has its receipt, its analytics\n"
                "  event and its partner webhook; 0 dead, 0 missing."
            )
            return True
        self.console.print(f"  [bold red]FAILED[/]: {missing} missing, {dead} dead.")
        return False

    # -- shutdown -----------------------------------------------------------------

    async def stop_workers(self) -> bool:
        """SIGTERM every worker and wait; kill one that hangs.  True if all exited 0."""
        if not self.workers.procs:
            return True
        self.heading("Stopping the workers")
        t = time.monotonic()
        signalled, problems = await self.workers.stop(STOP_TIMEOUT)
        for problem in problems:
            self.console.print(f"  [red]{problem}[/]")
        if problems:
            self.show_worker_logs()
        elif signalled:
            self.say(
                "  SIGTERM: each worker stopped fetching, finished its running jobs and exited\n"
                f"  (code 0) in {time.monotonic() - t:.1f} s."
            )
        else:
            self.say("  The workers had already stopped.")
        return not problems

    def show_worker_logs(self) -> None:
        if self.logs_shown:
            return
        self.logs_shown = True
        for log, tail in self.workers.log_tails():
            self.say(f"  last lines of {log}:")
            for line in tail:
                self.console.print(f"    {line}", markup=False, highlight=False)


def _settled(stats: Mapping[str, QueueStats], queue: str, expected: int) -> bool:
    """Every job of ``queue`` is finished (succeeded or dead), none is pending."""
    s = stats.get(queue) or QueueStats(queue=queue)
    return (
        s.ready == s.scheduled == s.retrying == s.running == 0
        and s.succeeded + s.dead + s.cancelled == expected
    )


async def _count_retried(name: str) -> int:
    """Jobs of task ``name`` that succeeded after at least one failed attempt."""
    n = 0
    cursor = None
    while True:
        page = await app.broker.list_jobs(
            JobFilter(name=name, state=State.SUCCEEDED), cursor=cursor, limit=500
        )
        n += sum(1 for info in page.items if info.message.errors)
        cursor = page.cursor
        if cursor is None:
            return n


def _orders(n: int) -> str:
    return "order" if n == 1 else "orders"
