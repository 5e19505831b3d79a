"""``DumbwaiterBackend``: Django's Tasks framework, run by dumbwaiter workers.

    TASKS = {
        "default": {
            "BACKEND": "dumbwaiter.contrib.django.DumbwaiterBackend",
            "QUEUES": ["default", "email"],
            "OPTIONS": {"url": "redis://127.0.0.1:6379/0"},
        }
    }

Each Django ``@task`` becomes a dumbwaiter task named by its module path
(``shop.tasks.send_receipt``), so the CLI, the dashboard and the metrics
show it by name; its ``queue_name``, ``priority`` and ``run_after`` become
the job's queue, priority and eta.

**Transactions.**  A task enqueued inside ``transaction.atomic()`` (or any
open transaction on the backend's database) is written through the
transactional outbox on Django's own connection: the job is part of the
transaction, so it is sent if and only if the transaction commits, even if
the process dies right after the commit.  ``transaction.on_commit`` could
not promise that: a crash between the commit and the callback loses the job
without a trace.  Outside a transaction the job goes straight to the broker.
When Django's database is the broker's own (the same SQLite file or
PostgreSQL database) the job row itself is inserted by the transaction;
otherwise the envelope goes to that database's ``dw_outbox`` table and the
relay moves it (``manage.py dumbwaiter_worker`` runs one for Django's
database).

**Results.**  Results are kept (``keep_result``, a day by default), so
``TaskResult.refresh()``, ``task.get_result(id)`` and ``return_value`` work
from any process.  A failed attempt is retried by the App's retry policy
(``OPTIONS["retry"]``); the result is ``FAILED`` once the job is dead.
"""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import import_module
from typing import Any, TypeVar, cast
from urllib.parse import quote

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import close_old_connections, connections, transaction
from django.utils import timezone
from django.utils.module_loading import autodiscover_modules, import_string

from ...app import App
from ...brokers.types import JobInfo
from ...context import Context
from ...message import ErrorRecord, Message, decode, loads
from ...retry import Retry
from ...sqldb import adapt
from ...state import FINAL_STATES, State
from ...task import Task as DwTask
from ._compat import (
    BaseTaskBackend,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
    task_finished,
    task_started,
)

__all__ = ["OPTIONS", "DumbwaiterBackend"]

T = TypeVar("T")

#: the keys ``TASKS[alias]["OPTIONS"]`` takes (case does not matter)
OPTIONS = {
    "url": "broker URL (default: $DUMBWAITER_URL, else sqlite:///dumbwaiter.db)",
    "app": "a dumbwaiter App, or the dotted path to one, instead of url",
    "database": "the Django database whose transactions the outbox joins (default 'default')",
    "keep_result": "seconds results are kept, True for a day (default), False for none",
    "retry": "a dumbwaiter.Retry for the backend's tasks (default: the App's)",
    "modules": "modules to import, besides every installed app's tasks module, to find tasks",
}

# (members by value: the enum is a Django ``TextChoices``, which a type
# checker without Django's stubs reads as tuples)
READY, RUNNING = TaskResultStatus("READY"), TaskResultStatus("RUNNING")
SUCCESSFUL, FAILED = TaskResultStatus("SUCCESSFUL"), TaskResultStatus("FAILED")

_STATUS = {
    State.SCHEDULED: READY,
    State.READY: READY,
    State.RETRYING: READY,
    State.RUNNING: RUNNING,
    State.SUCCEEDED: SUCCESSFUL,
    State.DEAD: FAILED,
    State.CANCELLED: FAILED,
}

_PENDING_ROW = "SELECT body FROM dw_outbox WHERE id = %s AND relayed_at IS NULL"


@dataclass
class _Shared:
    """What every thread's instance of one backend shares.

    Django makes a backend instance per thread (its connection handler is
    thread-local); one App per configuration keeps one set of broker
    connections and one task registry for all of them."""

    app: App
    #: Django task module path -> (the Django task, its dumbwaiter task)
    tasks: dict[str, tuple[Task[Any, Any], DwTask[..., Any]]] = field(default_factory=dict)


_lock = threading.Lock()
_shared: dict[tuple[str, str], _Shared] = {}


def _options(alias: str, raw: Mapping[str, Any]) -> dict[str, Any]:
    options = {str(k).lower(): v for k, v in raw.items()}
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ImproperlyConfigured(
            f"TASKS[{alias!r}]['OPTIONS']: unknown option(s) {unknown}; known: {sorted(OPTIONS)}"
        )
    if "url" in options and "app" in options:
        raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS']: give 'url' or 'app', not both")
    retry = options.get("retry")
    if retry is not None and not isinstance(retry, Retry):
        raise ImproperlyConfigured(
            f"TASKS[{alias!r}]['OPTIONS']['retry'] must be a dumbwaiter.Retry, got {retry!r}"
        )
    return options


def _make_app(alias: str, options: Mapping[str, Any]) -> App:
    given = options.get("app")
    if given is None:
        return App(options.get("url"))
    if isinstance(given, str):
        try:
            given = import_string(given.replace(":", "."))
        except ImportError as exc:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']['app']: cannot import {options['app']!r}: {exc}"
            ) from exc
    if not isinstance(given, App):
        raise ImproperlyConfigured(
            f"TASKS[{alias!r}]['OPTIONS']['app'] is {type(given).__name__}, not a dumbwaiter App"
        )
    return given


def _shared_for(alias: str, options: Mapping[str, Any]) -> _Shared:
    key = (alias, repr(sorted(options.items())))
    with _lock:
        found = _shared.get(key)
        if found is None:
            found = _shared[key] = _Shared(_make_app(alias, options))
        return found


class DumbwaiterBackend(BaseTaskBackend):
    """A Django Tasks backend whose tasks dumbwaiter workers run
    (``manage.py dumbwaiter_worker``); see the module's docstring."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        options = _options(alias, self.options)
        self.database: str = str(options.get("database", "default"))
        self.modules: tuple[str, ...] = tuple(options.get("modules", ()))
        self.keep_result: bool | float = options.get("keep_result", True)
        self.retry: Retry | None = options.get("retry")
        self._shared = _shared_for(alias, options)

    @property
    def app(self) -> App:
        """The dumbwaiter App this backend enqueues with (and its worker runs)."""
        return self._shared.app

    # -- tasks -------------------------------------------------------------------

    def validate_task(self, task: Task[Any, Any]) -> None:
        """Django's checks, then register the task with the App: every
        ``@task`` is validated when it is defined, so importing a module of
        tasks is all a worker needs to know them."""
        super().validate_task(task)
        self.dumbwaiter_task(task)

    def dumbwaiter_task(self, task: Task[Any, Any]) -> DwTask[..., Any]:
        """The dumbwaiter task that runs ``task`` (registered on first use)."""
        name = task.module_path
        found = self._shared.tasks.get(name)
        if found is not None and found[0].func is task.func:
            return found[1]
        with _lock:
            dw_task = self.app.task(
                name=name,
                queue=task.queue_name,
                retry=self.retry,
                keep_result=self.keep_result,
            )(_runner(task, self.alias))
            self._shared.tasks[name] = (task, dw_task)
        return dw_task

    def discover(self, modules: Iterable[str] = ()) -> list[str]:
        """Import every installed app's ``tasks`` module, the ``modules``
        option's and ``modules``: a worker then knows every task.  Returns the
        names of the tasks this backend knows."""
        autodiscover_modules("tasks")
        for module in (*self.modules, *modules):
            import_module(module)
        return sorted(self._shared.tasks)

    def worker_queues(self) -> list[str]:
        """The queues a worker of this backend serves by default: the
        ``QUEUES`` setting and every known task's queue."""
        return sorted(set(self.queues) | {t.queue for _, t in self._shared.tasks.values()})

    # -- enqueue -------------------------------------------------------------------

    def enqueue(
        self,
        task: Task[Any, T],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
    ) -> TaskResult[T]:
        """Store a job of ``task``: through the outbox on the backend's database
        when a transaction is open there (sent iff it commits), else straight
        to the broker.  Returns a ``READY`` result whose id is the job's id."""
        self.validate_task(task)
        dw_task = self.dumbwaiter_task(task)
        run_after = task.run_after
        if run_after is not None and timezone.is_naive(run_after):  # USE_TZ = False
            run_after = timezone.make_aware(run_after)
        opts: dict[str, Any] = {"queue": task.queue_name, "priority": task.priority}
        opts["eta"] = run_after
        conn = connections[self.database]
        result: TaskResult[T]
        if conn.in_atomic_block or (conn.connection is not None and not conn.get_autocommit()):
            job = self.app.outbox(conn.connection).enqueue(dw_task.options(**opts), *args, **kwargs)
            result = self._ready(task, job.id, args, kwargs)
            transaction.on_commit(
                lambda: task_enqueued.send(type(self), task_result=result), using=self.database
            )
            return result
        job = dw_task.options(**opts).enqueue(*args, **kwargs)
        result = self._ready(task, job.id, args, kwargs)
        task_enqueued.send(type(self), task_result=result)
        return result

    def _ready(
        self, task: Task[Any, T], id: str, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> TaskResult[T]:
        return TaskResult(
            task=task,
            id=id,
            status=READY,
            enqueued_at=timezone.now(),
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=list(args),
            kwargs=dict(kwargs),
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )

    # -- results -------------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult[Any]:
        """The job's state as a ``TaskResult``; a job still in this database's
        outbox (committed, not relayed yet; or written by this transaction)
        is ``READY``.  ``TaskResultDoesNotExist`` for an unknown id, a job
        of a rolled-back transaction, or one pruned after its retention."""
        info = self.app.job(result_id).info()
        if info is None:
            msg = self._in_outbox(result_id)
            if msg is None:
                raise TaskResultDoesNotExist(result_id)
            return self._result(msg, State.READY, None)
        return self._result(info.message, info.state, info)

    def _in_outbox(self, id: str) -> Message | None:
        conn = connections[self.database]
        if "dw_outbox" not in conn.introspection.table_names():
            return None
        with conn.cursor() as cur:
            cur.execute(_PENDING_ROW, [id])
            row = cur.fetchone()
        return decode(bytes(row[0])) if row else None

    def _result(self, msg: Message, state: State, info: JobInfo | None) -> TaskResult[Any]:
        task = self._task_named(msg)
        worker_ids = [e.worker for e in msg.errors]
        updated = _when(info.updated_at) if info is not None else None
        if info is not None and info.worker and state in (State.RUNNING, State.SUCCEEDED):
            worker_ids.append(info.worker)
        last_error = _when(msg.errors[-1].time) if msg.errors else None
        result: TaskResult[Any] = TaskResult(
            task=task,
            id=msg.id,
            status=_STATUS[state],
            enqueued_at=_when(msg.created_at),
            started_at=updated if state is State.RUNNING else None,
            finished_at=updated if state in FINAL_STATES else None,
            last_attempted_at=updated if state is State.RUNNING else last_error,
            args=list(msg.args),
            kwargs=dict(msg.kwargs),
            backend=self.alias,
            errors=[_task_error(e) for e in msg.errors],
            worker_ids=worker_ids,
        )
        if state is State.SUCCEEDED and info is not None and info.result is not None:
            stored = loads(info.result)  # {"value": v}, or {"error": why it was not kept}
            if isinstance(stored, dict) and "value" in stored:
                object.__setattr__(result, "_return_value", stored["value"])
        return result

    def _task_named(self, msg: Message) -> Task[Any, Any]:
        found = self._shared.tasks.get(msg.name)
        if found is not None:
            return found[0]
        try:  # a task this process has not imported yet
            obj = import_string(msg.name)
        except ImportError:
            obj = None
        if not isinstance(obj, Task):
            raise TaskResultDoesNotExist(f"{msg.id} is a job of {msg.name}, not a Django task")
        return obj

    # -- the worker's side ---------------------------------------------------------

    def outbox_url(self) -> str | None:
        """The URL the relay reads the outbox from: the backend's database,
        unless it is the broker's own (then transactions store the jobs
        themselves) or a kind the outbox does not support."""
        conn = connections[self.database]
        conn.ensure_connection()
        if conn.vendor not in ("sqlite", "postgresql"):
            return None
        if self.app.broker.owns_connection_sync(adapt(conn.connection)):
            return None
        return database_url(conn.settings_dict, conn.vendor)

    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:
        """``manage.py check``: the outbox needs SQLite or PostgreSQL."""
        messages = list(super().check(**kwargs))
        if self.database not in connections.settings:
            messages.append(
                checks.Error(
                    f"TASKS[{self.alias!r}]['OPTIONS']['database'] is {self.database!r}, "
                    "which is not in DATABASES",
                    id="dumbwaiter.E001",
                )
            )
        elif connections[self.database].vendor not in ("sqlite", "postgresql"):
            messages.append(
                checks.Warning(
                    f"database {self.database!r} is {connections[self.database].vendor}: "
                    "tasks enqueued inside a transaction need the outbox, which supports "
                    "SQLite and PostgreSQL",
                    id="dumbwaiter.W001",
                )
            )
        return messages


def database_url(settings: Mapping[str, Any], vendor: str) -> str | None:
    """A Django ``DATABASES`` entry as the relay's ``sqlite:///`` or
    ``postgresql://`` URL (None for an in-memory SQLite database, which no
    other connection can read)."""
    name = str(settings.get("NAME") or "")
    if vendor == "sqlite":
        if not name or name == ":memory:" or "mode=memory" in name:
            return None
        return f"sqlite:///{os.path.abspath(name)}"
    user = quote(str(settings.get("USER") or ""), safe="")
    password = quote(str(settings.get("PASSWORD") or ""), safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = str(settings.get("HOST") or "")
    if host.startswith("/"):  # a socket directory
        port = f"&port={settings['PORT']}" if settings.get("PORT") else ""
        return f"postgresql://{auth}/{quote(name)}?host={quote(host, safe='')}{port}"
    port = f":{settings['PORT']}" if settings.get("PORT") else ""
    return f"postgresql://{auth}{host or 'localhost'}{port}/{quote(name)}"


# -- running a Django task inside a dumbwaiter job -----------------------------------------


def _runner(task: Task[Any, Any], alias: str) -> Callable[..., Any]:
    """The function the dumbwaiter task runs: the Django task's function, with
    its signature (less the ``context`` parameter a ``takes_context`` task
    gets), so arguments are checked at enqueue as for any dumbwaiter task.

    It sends Django's ``task_started`` / ``task_finished`` signals (whose
    receivers log as every Django Tasks backend does), gives a
    ``takes_context`` task its ``TaskContext``, and, for a sync function
    (run in a worker thread), closes the thread's stale database
    connections before and after, as Django does around a request."""
    func = task.func
    signature = inspect.signature(func)
    params = list(signature.parameters.values())
    if task.takes_context:
        params = params[1:]

    def call(result: TaskResult[Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if task.takes_context:
            return func(TaskContext(task_result=result), *args, **kwargs)
        return func(*args, **kwargs)

    if inspect.iscoroutinefunction(func):

        async def run_async(*args: Any, **kwargs: Any) -> Any:
            result = _started(task, alias, args, kwargs)
            try:
                value = await call(result, args, kwargs)
            except BaseException:
                _failed(result)
                raise
            _finished(result, value)
            return value

        runner: Callable[..., Any] = run_async
    else:

        def run_sync(*args: Any, **kwargs: Any) -> Any:
            close_old_connections()
            try:
                result = _started(task, alias, args, kwargs)
                try:
                    value = call(result, args, kwargs)
                except BaseException:
                    _failed(result)
                    raise
                _finished(result, value)
                return value
            finally:
                close_old_connections()

        runner = run_sync
    fn = cast(Any, runner)
    fn.__signature__ = signature.replace(parameters=params)
    fn.__name__ = func.__name__
    fn.__qualname__ = func.__qualname__
    fn.__module__ = func.__module__
    fn.__doc__ = func.__doc__
    return runner


def _started(
    task: Task[Any, Any], alias: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> TaskResult[Any]:
    ctx = Context.current()
    now = timezone.now()
    msg = ctx.message if ctx is not None else None
    errors = msg.errors if msg is not None else []
    result: TaskResult[Any] = TaskResult(
        task=task,
        id=msg.id if msg is not None else "",
        status=RUNNING,
        enqueued_at=_when(msg.created_at) if msg is not None else None,
        started_at=now,
        finished_at=None,
        last_attempted_at=now,
        args=list(args),
        kwargs=dict(kwargs),
        backend=alias,
        errors=[_task_error(e) for e in errors],
        worker_ids=[*(e.worker for e in errors), ctx.worker_id if ctx is not None else ""],
    )
    task_started.send(sender=DumbwaiterBackend, task_result=result)
    return result


def _finished(result: TaskResult[Any], value: Any) -> None:
    object.__setattr__(result, "_return_value", value)
    object.__setattr__(result, "finished_at", timezone.now())
    object.__setattr__(result, "status", SUCCESSFUL)
    task_finished.send(sender=DumbwaiterBackend, task_result=result)


def _failed(result: TaskResult[Any]) -> None:
    """A failed attempt is ``FAILED`` (and ``task_finished``) only when it was
    the last one; otherwise the job is retried and stays unfinished."""
    ctx = Context.current()
    if ctx is not None and not ctx.is_last_attempt:
        return
    object.__setattr__(result, "finished_at", timezone.now())
    object.__setattr__(result, "status", FAILED)
    task_finished.send(sender=DumbwaiterBackend, task_result=result)


def _task_error(e: ErrorRecord) -> TaskError:
    """Django names an exception class by its import path; dumbwaiter records
    built-ins by their bare name."""
    path = e.type if "." in e.type else f"builtins.{e.type}"
    return TaskError(exception_class_path=path, traceback=e.traceback or f"{e.type}: {e.message}")


def _when(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC)
