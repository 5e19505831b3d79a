"""``manage.py dumbwaiter_worker``: run the tasks of a dumbwaiter Tasks backend."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from dumbwaiter.cli.common import setup_logging
from dumbwaiter.loop import run

from ..._compat import task_backends
from ...backend import DumbwaiterBackend
from ...worker import drain, serve


class Command(BaseCommand):  # type: ignore[misc]  # Django is untyped
    help = (
        "Run a dumbwaiter worker for the tasks of a Django Tasks backend, and relay "
        "the outbox of its database (tasks enqueued inside transactions)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--backend", default="default", help="the TASKS alias to run [default: default]"
        )
        parser.add_argument(
            "-q",
            "--queues",
            default="",
            help="comma-separated queues [default: the backend's QUEUES and its tasks' queues]",
        )
        parser.add_argument("-c", "--concurrency", type=int, default=32, help="jobs at once")
        parser.add_argument(
            "--lease", type=float, default=15.0, help="seconds a job stays ours unheard"
        )
        parser.add_argument(
            "--grace", type=float, default=25.0, help="seconds jobs get to finish on SIGTERM"
        )
        parser.add_argument(
            "--import",
            dest="imports",
            action="append",
            default=[],
            metavar="MODULE",
            help="a module of tasks to import besides every app's tasks module (repeatable)",
        )
        parser.add_argument(
            "--relay-url",
            default=None,
            help="relay this database's outbox [default: the backend's database, unless it "
            "is the broker's own]",
        )
        parser.add_argument(
            "--no-relay", action="store_true", help="run no relay (another process does)"
        )
        parser.add_argument(
            "--with-scheduler", action="store_true", help="also run the App's periodic tasks"
        )
        parser.add_argument(
            "--drain",
            action="store_true",
            help="relay the outbox, run what is ready until nothing is left, then exit",
        )
        parser.add_argument(
            "--drain-timeout", type=float, default=60.0, help="seconds --drain may take"
        )
        parser.add_argument(
            "--log-level",
            default="INFO",
            choices=["DEBUG", "INFO", "WARNING", "ERROR"],
            type=str.upper,
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            backend = task_backends[opts["backend"]]
        except Exception as exc:
            raise CommandError(f"TASKS has no backend {opts['backend']!r}: {exc}") from exc
        if not isinstance(backend, DumbwaiterBackend):
            raise CommandError(
                f"TASKS[{opts['backend']!r}] is {type(backend).__name__}, not "
                "dumbwaiter.contrib.django.DumbwaiterBackend"
            )
        setup_logging(opts["log_level"])
        tasks = backend.discover(opts["imports"])
        queues = [q.strip() for q in opts["queues"].split(",") if q.strip()]
        queues = queues or backend.worker_queues()
        relay_url = None if opts["no_relay"] else (opts["relay_url"] or backend.outbox_url())
        self.stdout.write(
            f"dumbwaiter worker for TASKS[{opts['backend']!r}] on {backend.app!r}: "
            f"{len(tasks)} task(s), queues {', '.join(queues)}; "
            + (f"relaying the outbox of database {backend.database!r}" if relay_url else "no relay")
        )
        if opts["drain"]:
            worker = run(
                drain(backend, queues=queues, relay_url=relay_url, timeout=opts["drain_timeout"])
            )
            c = worker.counts
            self.stdout.write(
                f"drained: {c['succeeded']} succeeded, {c['retried']} retried, {c['dead']} dead"
            )
            return
        run(
            serve(
                backend,
                queues=queues,
                concurrency=opts["concurrency"],
                lease=opts["lease"],
                grace=opts["grace"],
                relay_url=relay_url,
                with_scheduler=opts["with_scheduler"],
            )
        )
