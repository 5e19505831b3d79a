"""The story ``dumbwaiter demo`` tells, one phase after the other.

1. setup: a fresh SQLite broker file, the shop's database, the partner's
   webhook receiver (down at first) registered as an endpoint, and N worker
   processes;
2. orders: the order endpoint saves each order and enqueues three jobs (a
   mail, an analytics event, a webhook); a live table shows the queues and
   the partner's circuit breaker until they are drained;
3. report: endpoint latency, jobs done, retried, deferred and dead-lettered;
4. fix and replay: the partner updates its catalog, its dead deliveries
   are replayed with ``app.webhooks.replay`` and arrive;
5. check: every order has its receipt (an .eml file), its analytics event and
   its signed webhook; then the workers get SIGTERM and stop gracefully.

Import this module only after ``$DUMBWAITER_DEMO_DIR`` names the demo
directory (``dumbwaiter.demo`` builds its app from it).
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.table import Table

from ..brokers.types import JobFilter, JobInfo, QueueStats
from ..state import State
from . import (
    BREAKER_THRESHOLD,
    DIR_ENV,
    LABELS,
    PARTNER,
    QUEUES,
    TASKS,
    WEBHOOK_RETRY,
    WEBHOOKS,
    app,
    broker_url,
    create_shop,
    mail_path,
    place_order,
    receipt_id,
    register_partner,
    shop_connect,
    shop_path,
)
from .display import TaskOutcome, delivery_table, outcome_table, percentile, queue_table
from .mailbox import file_name
from .partner import NEW_PRODUCT, PartnerServer
from .workers import WorkerProcesses

#: seconds over which the orders arrive
ORDER_WINDOW = 5.0
#: the partner comes back once this share of the orders is in and its
#: circuit breaker has been open for REPAIR_AFTER seconds
REPAIR_AT = 0.4
REPAIR_AFTER = 1.5
#: every EVERY_NEW-th order is of the product the partner does not know yet
EVERY_NEW = 10
PRODUCTS = ("mug", "t-shirt", "poster", "notebook")
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
        self.mail = mail_path(opts.directory)
        self.partner = PartnerServer()
        self.workers = WorkerProcesses(opts.directory, opts.workers, opts.concurrency)
        self.logs_shown = False
        self.latencies: list[float] = []
        self.accepted = 0
        self.order_seconds = 0.0
        self.repaired_at: float | None = None
        #: when the live table first saw the partner's breaker open
        self.breaker_opened_at: float | None = None
        self.breaker = "closed"
        self.dead_deliveries = 0
        self.stop_orders = threading.Event()
        self.started = time.monotonic()

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
            "and enqueues the slow work: a receipt e-mail (dumbwaiter.mail), an analytics\n"
            "event, and a signed webhook to a partner (dumbwaiter.webhooks). Workers do it\n"
            "later. Failures are retried with backoff, a partner that is down trips its\n"
            "circuit breaker, and what keeps failing goes to the dead-letter queue and is\n"
            "replayed once the fault is fixed. It all runs on embedded SQLite (one file, no\n"
            "server); the only network traffic is to 127.0.0.1."
        )

    # -- 1. setup ---------------------------------------------------------------

    async def setup(self) -> None:
        self.heading("1. Setup")
        create_shop(self.shop)
        shutil.rmtree(self.mail, ignore_errors=True)  # a fresh mail folder each run
        await app.broker.open()  # creates the broker's tables before the workers start
        self.partner.start()
        self.partner.secret = await register_partner(self.partner.url)
        await asyncio.to_thread(self.workers.start)
        pids = ", ".join(map(str, self.workers.pids))
        self.say(f"  broker    {app.url}")
        self.say(f"  shop      {self.shop}")
        self.say("            (orders, and the analytics events the jobs record)")
        self.say(f"  mail      {self.mail}/")
        self.say("            the receipts, one .eml file each (a dumbwaiter.mail backend)")
        self.say(f"  partner   {self.partner.url}")
        self.say(
            "            registered as webhook endpoint"
            f" {PARTNER!r}:\n"
            "            app.webhooks.add_endpoint(url, id=..., event_types=['order.created'])\n"
            "            It verifies every signature with dumbwaiter.webhooks.verify. It is\n"
            "            down at first (HTTP 503, Retry-After: 1) and comes back partway;\n"
            f"            its catalog lacks {NEW_PRODUCT!r} (HTTP 422) until it is updated."
        )
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
            "  order and enqueues a receipt (mailer.send, queue email), track_order\n"
            "  (analytics, an async task) and a webhook (app.webhooks.send: one signed\n"
            "  POST to the partner, queue webhooks). While the partner is down its calls\n"
            "  fail and are retried after its Retry-After. After"
            f" {BREAKER_THRESHOLD} failures in a row the\n"
            "  partner's circuit breaker opens: its deliveries wait, without using an\n"
            "  attempt or holding a worker, and one probe per cool-down tries the partner.\n"
            "  Once it is back, it answers 422 to every"
            f" {EVERY_NEW}th order ({NEW_PRODUCT!r}, not in its\n"
            "  catalog yet): an answer from a partner that is up, so the breaker stays\n"
            "  closed, and those deliveries fail 3 attempts and go to the dead-letter\n"
            "  queue. A deferred delivery's job ends and a new one (same webhook-id) takes\n"
            "  over, so the webhooks row counts more jobs than orders.\n"
            "  Watching app.broker.stats() and app.webhooks.health() until the queues are\n"
            "  drained:\n"
        )
        orders = asyncio.ensure_future(asyncio.to_thread(self.order_loop))

        def drained(stats: Stats) -> bool:
            self.maybe_repair(stats)
            if not orders.done():
                return False
            if exc := orders.exception():
                raise DemoFailed(f"the order endpoint failed: {exc!r}") from exc
            return self.settled(stats)

        try:
            await self.watch("Queues while orders come in", drained)
        finally:
            self.stop_orders.set()
            await asyncio.gather(orders, return_exceptions=True)

    def settled(self, stats: Stats) -> bool:
        """Every order's mail and analytics job ran, and every webhook was
        delivered or is dead (deferrals make more webhook jobs than orders)."""
        if not all(_settled(stats, q, self.accepted) for q in QUEUES if q != WEBHOOKS):
            return False
        s = stats.get(WEBHOOKS) or QueueStats(queue=WEBHOOKS)
        idle = s.ready == s.scheduled == s.retrying == s.running == 0
        return idle and len(self.partner.by_webhook) + self.dead_deliveries == self.accepted

    def maybe_repair(self, stats: Stats) -> None:
        """The partner's endpoint comes back partway through the orders, once
        its breaker has been open a while (so deliveries were deferred, and
        arrive once a probe finds the partner up)."""
        if self.repaired_at is not None or self.breaker_opened_at is None:
            return
        opened_for = time.monotonic() - self.breaker_opened_at
        if opened_for >= REPAIR_AFTER and self.accepted >= REPAIR_AT * self.opts.orders:
            self.partner.come_back()
            self.repaired_at = time.monotonic() - self.started
            self.say(f"  At {self.repaired_at:.1f} s the partner's endpoint is up again.")

    def order_loop(self) -> None:
        """The order endpoint, called ``orders`` times at a steady rate (own thread)."""
        n = self.opts.orders
        rng = random.Random(7)
        interval = ORDER_WINDOW / n
        with closing(shop_connect(self.shop)) as conn:
            start = time.perf_counter()
            for i in range(n):
                wait = start + i * interval - time.perf_counter()
                if self.stop_orders.wait(wait) if wait > 0 else self.stop_orders.is_set():
                    return
                order_id = f"o-{i + 1:05d}"
                t = time.perf_counter()
                email = f"customer{i + 1}@example.com"
                new = (i + 1) % EVERY_NEW == 0
                product = NEW_PRODUCT if new else rng.choice(PRODUCTS)
                place_order(conn, order_id, email, product, rng.randint(500, 20000))
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
                await self.look_at_partner()
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

    async def look_at_partner(self) -> None:
        """The partner's endpoint as ``app.webhooks.health`` sees it."""
        [health] = await app.webhooks.ahealth(PARTNER)
        self.breaker = str(health["breaker"])
        self.dead_deliveries = int(health["dead"])
        if self.breaker != "closed" and self.breaker_opened_at is None:
            self.breaker_opened_at = time.monotonic()

    def table(self, title: str, stats: Stats) -> Table:
        caption = (
            f"orders accepted {self.accepted}/{self.opts.orders} | "
            f"partner {'UP' if self.partner.up else 'DOWN (503)'}, "
            f"breaker {self.breaker.replace('_', '-')} | "
            f"{time.monotonic() - self.started:.1f} s"
        )
        return queue_table(title, stats, LABELS, caption)

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
        for queue in (q for q in QUEUES if q != WEBHOOKS):
            s = stats.get(queue) or QueueStats(queue=queue)
            after_retry = await _count_retried(TASKS[queue].name)
            rows.append(TaskOutcome(LABELS[queue], queue, s.succeeded, after_retry, s.dead))
        await self.look_at_partner()
        delivered = len(self.partner.by_webhook)
        rows.append(
            TaskOutcome(
                LABELS[WEBHOOKS],
                WEBHOOKS,
                delivered,
                self.partner.after_refusal(),
                self.dead_deliveries,
            )
        )
        self.console.print(outcome_table(rows))
        backoff = ", ".join(f"{w:g}" for w in WEBHOOK_RETRY.backoff)
        deferred = await _count_deferred()
        self.say(
            f"  The partner refused {self.partner.refused_calls()} calls while it was down;"
            " its breaker\n"
            f"  deferred deliveries {deferred} times (nothing sent, no attempt used). Up"
            " again, it\n"
            f"  answered 422 to {self.partner.unknown_product} calls for {NEW_PRODUCT!r}."
            " The demo's short schedule is\n"
            f"  dw.Retry(attempts={WEBHOOK_RETRY.attempts}, backoff=({backoff})), with a"
            " 0.5 s cool-down;\n"
            "  production keeps the Standard Webhooks schedule (10 attempts, about 3 days)\n"
            "  and 30 s. Done inline, every order would have waited for the mail server,\n"
            "  the analytics API and the partner, and failed while the partner was down.\n"
        )

    # -- 4. fix and replay ---------------------------------------------------------

    async def fix_and_replay(self) -> None:
        self.heading("4. The partner updates its catalog: replay the dead deliveries")
        self.partner.come_back()  # already up since maybe_repair
        self.partner.update_catalog()
        since = f" since {self.repaired_at:.1f} s" if self.repaired_at is not None else ""
        dead = await app.webhooks.adead(PARTNER)
        self.say(
            f"  The partner has been up{since}: a probe found it up, its breaker closed\n"
            "  and the deferred deliveries followed. Now its catalog has"
            f" {NEW_PRODUCT!r} too.\n"
            "  Dead deliveries do not come back by themselves: they wait in the dead-letter\n"
            "  queue, with their attempt log, until someone replays them (the dashboard's\n"
            "  Webhooks page, dumbwaiter dlq replay, or app.webhooks.replay, as here)."
        )
        if dead:
            m = dead[0].message
            webhook_id = str(m.args[1])
            self.say(f"  One of them: webhook-id {webhook_id}, its attempt log:")
            for a in await app.webhooks.aattempts(PARTNER, webhook_id):
                if a.outcome == "deferred":
                    what = "the breaker was open: nothing sent"
                elif a.status is not None:
                    what = f"HTTP {a.status} {a.response}".rstrip()
                else:
                    what = a.error
                took = f", {a.latency_ms:.0f} ms" if a.latency_ms is not None else ""
                line = f"    attempt {a.attempt}: {a.outcome:<9} "
                line += what[: 79 - len(line) - len(took)] + took
                self.console.print(line, markup=False, highlight=False)
        else:
            self.say("  None died this time.")
        n = await app.webhooks.areplay(PARTNER)
        self.say(
            f"  await app.webhooks.replay({PARTNER!r})\n"
            f"    -> {n} {'delivery' if n == 1 else 'deliveries'} ready again, with fresh"
            " attempts and the same webhook-id\n"
        )
        if n:
            self.dead_deliveries = 0
            await self.watch("Queues after the replay", self.settled)

    # -- 5. check -----------------------------------------------------------------

    async def check(self) -> bool:
        self.heading("5. Was every job delivered?")
        dead = sum(s.dead for s in await app.broker.stats())
        with closing(shop_connect(self.shop)) as conn:
            orders = {r[0] for r in conn.execute("SELECT id FROM orders")}
            events = {r[0] for r in conn.execute("SELECT order_id FROM analytics_events")}
        files = {p.name for p in self.mail.glob("*.eml")} if self.mail.is_dir() else set()
        receipts = {o for o in orders if file_name(receipt_id(o)) in files}
        notified = set(self.partner.orders)
        deliveries = self.partner.deliveries
        rows = [
            ("orders saved", len(orders), self.opts.orders - len(orders)),
            ("receipts written (mail/*.eml)", len(receipts), len(orders - receipts)),
            ("analytics events", len(events & orders), len(orders - events)),
            ("orders the partner was told about", len(notified & orders), len(orders - notified)),
        ]
        self.console.print(delivery_table(rows))
        self.show_samples(sorted(receipts))
        duplicates = deliveries - len(self.partner.by_webhook)
        self.say(
            f"  webhook deliveries          {deliveries}, {duplicates} of them duplicates\n"
            "                              (at-least-once: harmless, the partner\n"
            "                              de-duplicates on webhook-id)"
        )
        self.say(f"  bad signatures              {self.partner.bad_signatures}")
        missing = sum(m for _, _, m in rows)
        self.say(f"  dead letters after replay   {dead}")
        self.say(f"  missing deliveries          {missing}")
        if missing == 0 and dead == 0 and self.partner.bad_signatures == 0:
            self.console.print(
                f"  [bold green]OK[/]: all {len(orders)} {_orders(len(orders))} delivered:"
                " each has its receipt, its analytics\n"
                "  event and its signed partner webhook; 0 dead, 0 missing."
            )
            return True
        self.console.print(f"  [bold red]FAILED[/]: {missing} missing, {dead} dead.")
        return False

    def show_samples(self, receipts: list[str]) -> None:
        """One receipt as written, and one webhook as the partner verified it."""
        if receipts:
            path = self.mail / file_name(receipt_id(receipts[0]))
            head = path.read_bytes().split(b"\r\n\r\n", 1)[0].decode(errors="replace")
            wanted = ("From:", "To:", "Subject:", "Message-ID:")
            self.say(f"  {path.name}:")
            for line in head.splitlines():
                if line.startswith(wanted):
                    self.console.print(f"    {line}", markup=False, highlight=False)
        sample = self.partner.sample
        if sample is not None:
            headers, body = sample
            self.say("  a webhook the partner received (signature verified):")
            for name in ("webhook-id", "webhook-timestamp", "webhook-signature"):
                self.console.print(f"    {name}: {headers.get(name, '')}", markup=False)
            payload = json.loads(body)
            for name in ("type", "timestamp"):
                self.console.print(f"    {name}: {payload[name]}", markup=False)
            self.console.print(f"    data: {json.dumps(payload['data'])}", markup=False)

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
    return await _count_jobs(
        JobFilter(name=name, state=State.SUCCEEDED),
        # a compact record (brokers/finished.py) keeps the attempt, not the errors
        lambda info: info.message.attempt > 1 or bool(info.message.errors),
    )


async def _count_deferred() -> int:
    """Times the breaker deferred a delivery: each deferral made one continuation job."""
    return await _count_jobs(
        JobFilter(name=TASKS[WEBHOOKS].name),
        lambda info: "webhook_deferred_from" in info.message.headers,
    )


async def _count_jobs(f: JobFilter, match: Callable[[JobInfo], bool]) -> int:
    n = 0
    cursor = None
    while True:
        page = await app.broker.list_jobs(f, cursor=cursor, limit=500)
        n += sum(1 for info in page.items if match(info))
        cursor = page.cursor
        if cursor is None:
            return n


def _orders(n: int) -> str:
    return "order" if n == 1 else "orders"
