"""``dumbwaiter doctor``: check an app against the anti-patterns, and its broker.

Each finding has a level:

* a *fault* is something that does not work: the broker cannot be reached
  or is not ready (a PostgreSQL schema not migrated).  The command exits 1.
* a *warning* is a configuration that works but can hurt: retries that
  hammer, dead letters nobody hears of, a queue nobody watches, nothing
  running the jobs right now.  The command still exits 0, so the README's
  quick start passes; CI that wants them gone reads ``--json``.
* a *note* is advice.

Every finding says what to change.  The configuration checks look at the
app's registry (tasks, subscriptions, queues) and its alert configuration
(``dumbwaiter.alerts.configure``) only, so ``check`` runs in CI before
anything ships; ``check_broker`` asks the broker.

* DW001 (warning): retries without backoff; a failing dependency is hammered
  and every attempt is spent within seconds.
* DW002 (warning): no dead-letter alert; jobs that failed for good go unseen.
* DW003 (warning): a subscriber group with its inbox disabled; redelivered
  events run twice.
* DW004 (warning): a task retried (attempts > 1) with no idempotency hint; a
  retry may repeat a side effect.
* DW005 (warning): a queue with no depth alert; it can grow without bound.
* DW006 (note): retries without jitter; jobs that failed together retry together.
* DW007 (note): no timeout; a hung call holds its worker slot for ever.
* DW101 (fault): the broker cannot be reached (or does not answer in time).
* DW102 (fault): the broker answers but is not ready (e.g. its schema is
  not migrated).
* DW103 (warning): no worker is running right now; jobs wait until one starts.
* DW104 (warning or note): the broker is single-host (``capabilities.multi_host``
  False).  A warning where the transport is shared by every host but the job
  state is not (RabbitMQ on a SQLite or memory state store): the deployment
  looks ready for several machines and is not (a process on another host
  refuses to start).  A note for an embedded broker (SQLite, memory), whose
  single machine is plain.
* DW105 (warning): workers announce themselves from several hosts on a
  single-host broker (a SQLite file on a network share, say).

Mark a task as safe to run twice with ``@dumbwaiter.doctor.idempotent`` (under
``@app.task``), or with a ``key`` (uniqueness) option a middleware declares as
``idempotent``; silence a check for one task with ``@doctor.ignore("DW004")``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from . import keys
from .errors import ConfigurationError, DumbwaiterError
from .redact import mask_url

if TYPE_CHECKING:
    from .app import App
    from .retry import Retry

F = TypeVar("F", bound=Callable[..., Any])

#: the key prefix a running worker announces itself under (``worker.WORKER_KEY``)
WORKER_KEY = keys.WORKER

FAULT, WARNING, NOTE = "fault", "warning", "note"
#: the order findings are listed in
LEVELS = (FAULT, WARNING, NOTE)

_IDEMPOTENT = "__dumbwaiter_idempotent__"
_IGNORE = "__dumbwaiter_doctor_ignore__"


def idempotent(fn: F) -> F:
    """Declare that running ``fn`` twice for one job does no harm (it checks
    before it acts, uses an upsert, an idempotency key, or ``ctx.inbox``)."""
    setattr(fn, _IDEMPOTENT, True)
    return fn


def ignore(*codes: str) -> Callable[[F], F]:
    """Silence the doctor's checks ``codes`` for one task or handler."""

    def mark(fn: F) -> F:
        setattr(fn, _IGNORE, frozenset(codes) | getattr(fn, _IGNORE, frozenset()))
        return fn

    return mark


@dataclass(frozen=True, slots=True)
class Finding:
    code: str
    level: str
    subject: str
    message: str
    fix: str

    def to_dict(self) -> dict[str, str]:
        return {
            "code": self.code,
            "level": self.level,
            "subject": self.subject,
            "message": self.message,
            "fix": self.fix,
        }


def _ignored(fn: Any, code: str) -> bool:
    return code in getattr(fn, _IGNORE, frozenset())


def _handlers(app: App) -> list[tuple[str, str, Any, Retry, float | None, Any]]:
    """(kind, name, fn, retry, timeout, handler) of every task and subscription."""
    out: list[tuple[str, str, Any, Retry, float | None, Any]] = [
        ("task", t.name, t.fn, t.retry, t.timeout, t) for t in app.tasks.values()
    ]
    out += [("handler", s.name, s.fn, s.retry, s.timeout, s) for s in app.subscriptions.values()]
    return out


def host_scope(app: App) -> str:
    """One line on where the app's processes may run (its broker's
    ``multi_host``), for the doctor and the dashboard."""
    broker = app.broker
    caps = broker.capabilities
    if caps.multi_host:
        return "multi-host: processes on every machine share one truth"
    if broker.state_url is not None:
        return (
            f"single-host: the job state lives in {mask_url(broker.state_url)}, on one "
            "machine; a process on another host refuses to start"
        )
    if not caps.multi_process:
        return "single-process: everything lives in this process's memory"
    return "single-host: every process must run on this machine"


def _single_host(app: App) -> list[Finding]:
    """DW104: the broker is single-host (see the module docstring)."""
    if app.broker.capabilities.multi_host:
        return []
    where = f"broker {app.url.split('://', 1)[0]}://"
    if app.broker.state_url is not None:
        return [
            Finding(
                "DW104",
                WARNING,
                where,
                f"is {host_scope(app)}: the broker carries jobs for any machine, its "
                "state (records, locks, limits, unique keys) does not",
                "to run processes on several machines, name a state store every host "
                "reaches (state=postgresql://... or state=redis://..., docs/rabbitmq.md); "
                "on one machine, ignore this",
            )
        ]
    return [
        Finding(
            "DW104",
            NOTE,
            where,
            f"is {host_scope(app)}",
            "to scale out to other machines, move to a broker every host shares: "
            "postgresql://, redis://, nats:// (docs/guarantees.md)",
        )
    ]


def check(app: App) -> list[Finding]:
    """Every configuration finding for ``app``, warnings first."""
    from .alerts import DeadLetters, QueueDepth, config_of

    found: list[Finding] = _single_host(app)
    for kind, name, fn, retry, timeout, handler in _handlers(app):
        retried = retry.attempts > 1
        if retried and max(retry.backoff) == 0 and not _ignored(fn, "DW001"):
            found.append(
                Finding(
                    "DW001",
                    WARNING,
                    f"{kind} {name}",
                    f"retries {retry.attempts - 1} time(s) with no wait between attempts",
                    "give it a backoff: retry=dw.Retry(attempts=4, backoff=(5, 30, 300)) "
                    "(or drop the retry= to get that default)",
                )
            )
        elif retried and retry.jitter == 0 and not _ignored(fn, "DW006"):
            found.append(
                Finding(
                    "DW006",
                    NOTE,
                    f"{kind} {name}",
                    "retries without jitter: jobs that failed together retry together",
                    "add jitter: dw.Retry(..., jitter=0.2)",
                )
            )
        if timeout is None and not _ignored(fn, "DW007"):
            found.append(
                Finding(
                    "DW007",
                    NOTE,
                    f"{kind} {name}",
                    "has no timeout: a hung call holds a worker slot until the worker stops",
                    (
                        "@app.task(timeout=...)"
                        if kind == "task"
                        else "@app.subscribe(..., timeout=...)"
                    )
                    + " or App(timeout=...) for every task",
                )
            )
        if kind == "handler" and getattr(handler, "inbox", True) is False:
            if not _ignored(fn, "DW003"):
                found.append(
                    Finding(
                        "DW003",
                        WARNING,
                        f"group {handler.group}",
                        f"{name} has its inbox disabled: a redelivered or replayed event "
                        "runs its handler again",
                        "keep the group's inbox on (the default), or make the handler "
                        "idempotent with ctx.inbox(conn) in its own transaction",
                    )
                )
        if kind == "task" and retried and not _hinted(handler) and not _ignored(fn, "DW004"):
            found.append(
                Finding(
                    "DW004",
                    WARNING,
                    f"task {name}",
                    f"may run {retry.attempts} times (at-least-once, retries) and nothing "
                    "says a second run is harmless",
                    "make it idempotent (check before acting, upsert, an idempotency key to "
                    "the partner's API) and mark it @dumbwaiter.doctor.idempotent; or "
                    "retry=dw.Retry.never() if it must not run twice",
                )
            )
    cfg = config_of(app)
    if cfg is None or cfg.rule(DeadLetters.name) is None:
        found.append(
            Finding(
                "DW002",
                WARNING,
                "app",
                "no dead-letter alert is configured: jobs that fail for good go unseen",
                "dumbwaiter.alerts.configure(app, webhooks=['https://...']) and run workers "
                "with --alerts (or the dashboard with --alerts), or load "
                "`dumbwaiter alerts rules --prometheus` into Prometheus",
            )
        )
    elif not cfg.webhooks:
        found.append(
            Finding(
                "DW002",
                NOTE,
                "app",
                "alerts go to the log only",
                "add a webhook: dumbwaiter.alerts.configure(app, webhooks=['https://...'])",
            )
        )
    depth = cfg.rule(QueueDepth.name) if cfg is not None else None
    for queue in app.queues():
        if depth is None or not depth.enabled_for(queue):
            found.append(
                Finding(
                    "DW005",
                    WARNING,
                    f"queue {queue}",
                    "is unbounded and no depth alert watches it: it can grow for days unseen",
                    "configure alerts with the queue_depth rule (a default), e.g. "
                    "dumbwaiter.alerts.configure(app) and --alerts",
                )
            )
    return ordered(found)


def ordered(findings: list[Finding]) -> list[Finding]:
    """Faults first, then warnings, then notes; by code and subject within each."""
    return sorted(findings, key=lambda f: (LEVELS.index(f.level), f.code, f.subject))


def _hinted(task: Any) -> bool:
    """An idempotency hint: ``@doctor.idempotent`` on the function, or a
    task option ``idempotent=True`` (declared by a middleware)."""
    if getattr(task.fn, _IDEMPOTENT, False):
        return True
    extra = getattr(task, "extra", None) or {}
    return bool(extra.get("idempotent"))


def faults(findings: list[Finding]) -> list[Finding]:
    """The findings that make ``dumbwaiter doctor`` fail."""
    return [f for f in findings if f.level == FAULT]


async def check_broker(app: App, timeout: float) -> list[Finding]:
    """Ask the app's broker what a worker would need: an answer (DW101), a
    ready store (DW102), and a running worker (DW103, a warning: none may be
    meant to run yet).  ``timeout`` bounds the whole check, so a broker that
    keeps reconnecting is a fault here rather than a hang."""
    import asyncio

    where = f"broker {app.url.split('://', 1)[0]}://"
    try:
        async with asyncio.timeout(timeout):
            await app.broker.open()  # the transport: some brokers' admin reads do not use it
            await app.broker.stats()
            workers = await app.broker.kv_scan(WORKER_KEY)
    except TimeoutError:
        return [_unreachable(where, f"no answer within {timeout:g} s")]
    except ConfigurationError as exc:  # it answered: the store is not ready for us
        return [
            Finding(
                "DW102",
                FAULT,
                where,
                f"is not ready: {exc}",
                "do what the message says (for PostgreSQL: dumbwaiter migrate --app ...)",
            )
        ]
    except DumbwaiterError as exc:  # BrokerError: its message names the cause
        return [_unreachable(where, str(exc))]
    except Exception as exc:  # a client's own error: its type is part of the cause
        return [_unreachable(where, f"{type(exc).__name__}: {exc}")]
    if workers:
        return _hosts(app, where, workers)
    return [
        Finding(
            "DW103",
            WARNING,
            where,
            "no worker is running right now: jobs wait (they are not lost) until one starts",
            "dumbwaiter worker --app MODULE:ATTR (or ignore this where workers run elsewhere "
            "and are only stopped for now)",
        )
    ]


def _hosts(app: App, where: str, workers: dict[str, bytes]) -> list[Finding]:
    """DW105: workers of several hosts on a single-host broker.  A worker's
    default id names its host first (``HOST:PID:RANDOM``); ids given by hand
    say nothing about it and are left out."""
    ids = [k[len(WORKER_KEY) :].split(":") for k in workers]
    hosts = sorted({p[0] for p in ids if len(p) == 3 and p[1].isdigit()})
    if app.broker.capabilities.multi_host or len(hosts) < 2:
        return []
    return [
        Finding(
            "DW105",
            WARNING,
            where,
            f"is single-host, but workers run on {len(hosts)} hosts ({', '.join(hosts)}): "
            "they share one file through something its locks may not cover (a network "
            "share), unless these names are containers of one machine",
            "run every worker on one machine, or move to a broker every host shares: "
            "postgresql://, redis://, nats:// (docs/guarantees.md)",
        )
    ]


def _unreachable(where: str, why: str) -> Finding:
    return Finding(
        "DW101",
        FAULT,
        where,
        f"cannot be reached: {why}",
        "check the URL (host, port, credentials, database) and that the server is running",
    )
