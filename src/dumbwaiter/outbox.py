"""The transactional outbox: jobs and events written in the caller's own transaction.

    with db.begin() as conn:                     # sqlite3, psycopg (sync/async), SQLAlchemy
        conn.execute("INSERT INTO orders ...")
        app.outbox(conn).publish(OrderCreated(...))
        app.outbox(conn).enqueue(send_welcome, 42)

A rolled-back transaction sends nothing; a committed one is delivered, even if
the process dies right after the commit.  Two ways, chosen per connection:

* **Same database as the broker** (SQLite file or PostgreSQL database that
  holds the broker's tables): the job itself is inserted in the caller's
  transaction (``Broker.enqueue_with``); workers see it at commit.
* **Any other database**: the envelope goes into that database's
  ``dw_outbox`` table, in the caller's transaction; the relay
  (``dumbwaiter relay`` or ``dumbwaiter worker --with-relay``) moves committed
  rows to the broker in batches, in order, marks them and later prunes them.
  A re-sent row keeps its message id, so the broker and the consumers' inbox
  drop the copy: relays may die mid-batch (at-least-once, no loss).

``enqueue`` returns a ``Job`` as ``task.enqueue`` does, typed by the task.
Until the job reaches the broker (at commit on the same database, after the
relay otherwise) the broker does not know it: ``status()`` raises
``JobNotFound`` and ``cancel()`` finds nothing, while ``result()`` waits for
it to arrive (see ``OutboxJob``).
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

from .errors import ConfigurationError
from .event import Event, event_message
from .job import Job
from .message import Message, encode_checked
from .sqldb import Sql, adapt, ensure_table, ensure_table_sync
from .task import BoundTask
from .typevars import T

if TYPE_CHECKING:
    from .ports import Runtime
    from .task import Task

#: the task's parameters and the job's result, for ``enqueue``'s checks
_P = ParamSpec("_P")
_R = TypeVar("_R")

OUTBOX_DDL = {
    "sqlite": [
        "CREATE TABLE IF NOT EXISTS dw_outbox ("
        " seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL, kind TEXT NOT NULL,"
        " msg_key TEXT, body BLOB NOT NULL, created_at REAL NOT NULL, relayed_at REAL)",
        "CREATE INDEX IF NOT EXISTS dw_outbox_pending ON dw_outbox (seq) WHERE relayed_at IS NULL",
        "CREATE INDEX IF NOT EXISTS dw_outbox_relayed ON dw_outbox (relayed_at)"
        " WHERE relayed_at IS NOT NULL",
    ],
    "postgresql": [
        "CREATE TABLE IF NOT EXISTS dw_outbox ("
        " seq BIGSERIAL PRIMARY KEY, id TEXT NOT NULL, kind TEXT NOT NULL,"
        " msg_key TEXT, body BYTEA NOT NULL, created_at DOUBLE PRECISION NOT NULL,"
        " relayed_at DOUBLE PRECISION)",
        "CREATE INDEX IF NOT EXISTS dw_outbox_pending ON dw_outbox (seq) WHERE relayed_at IS NULL",
        "CREATE INDEX IF NOT EXISTS dw_outbox_relayed ON dw_outbox (relayed_at)"
        " WHERE relayed_at IS NOT NULL",
    ],
}
#: the channel the relay LISTENs on (PostgreSQL); the outbox insert NOTIFYs it
NOTIFY_CHANNEL = "dw_outbox"

_INSERT = (
    "INSERT INTO dw_outbox (id, kind, msg_key, body, created_at)"
    " VALUES (:id, :kind, :msg_key, :body, :created_at)"
)


class Outbox:
    """``app.outbox(conn)``: send within the transaction ``conn`` is in."""

    def __init__(self, app: Runtime, conn: Any) -> None:
        self.app = app
        self.sql: Sql = adapt(conn)
        self._same_db: bool | None = None

    # -- building ----------------------------------------------------------------

    def _task_message(
        self,
        task: Task[..., Any] | BoundTask[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Message:
        # ``task.options(eta=..., queue=...)`` goes through the outbox too
        if isinstance(task, BoundTask):
            self._check_app(task.task)
            return task.task.message(args, kwargs, task.opts)
        self._check_app(task)
        return task.message(args, kwargs)

    def _check_app(self, task: Task[..., Any]) -> None:
        if getattr(task, "app", None) is not self.app:
            raise ConfigurationError(f"{task!r} is not a task of this app")

    # -- sync connections ------------------------------------------------------

    # Typed as ``Task.enqueue``: the arguments are checked against the task's
    # parameters, and the job's result is what the function (or, for an async
    # function, its coroutine) returns.  ``task`` is positional-only, so a task
    # with a parameter named ``task`` can still take it by keyword.

    @overload
    def enqueue(
        self, task: Task[_P, Coroutine[Any, Any, _R]], /, *args: _P.args, **kwargs: _P.kwargs
    ) -> Job[_R]: ...
    @overload
    def enqueue(self, task: Task[_P, _R], /, *args: _P.args, **kwargs: _P.kwargs) -> Job[_R]: ...
    @overload
    def enqueue(
        self, task: BoundTask[_P, Coroutine[Any, Any, _R]], /, *args: _P.args, **kwargs: _P.kwargs
    ) -> Job[_R]: ...
    @overload
    def enqueue(
        self, task: BoundTask[_P, _R], /, *args: _P.args, **kwargs: _P.kwargs
    ) -> Job[_R]: ...
    def enqueue(
        self, task: Task[..., Any] | BoundTask[..., Any], /, *args: Any, **kwargs: Any
    ) -> Job[Any]:
        """Store a job of ``task`` in this transaction; returns its handle.

        ``task`` may carry per-call options: ``enqueue(send.options(eta=t), 42)``."""
        self._sync_only("enqueue")
        msg = self._task_message(task, args, kwargs)
        self._write_sync([msg])
        return OutboxJob(self.app, msg.id)

    def publish(
        self, event: Event, *, key: str | None = None, headers: dict[str, Any] | None = None
    ) -> str:
        """Publish ``event`` when this transaction commits; returns its id."""
        self._sync_only("publish")
        msg = event_message(event, key, headers)
        self._write_sync([msg])
        return msg.id

    def _sync_only(self, what: str) -> None:
        if self.sql.is_async:
            raise ConfigurationError(
                f"this is an async connection: await app.outbox(conn).a{what}(...)"
            )

    def _write_sync(self, msgs: list[Message]) -> None:
        mw = self.app.middleware
        for m in msgs:
            mw.call("before_enqueue", m)
        if self._same_db is None:
            self._same_db = self.app.broker.owns_connection_sync(self.sql)
        if self._same_db:
            self.app.broker.enqueue_with_sync(self.sql, msgs)
        else:
            ensure_outbox_sync(self.sql)
            self.sql.execute_many_sync(_INSERT, [self._row(m) for m in msgs])
            self.sql.notify_sync(NOTIFY_CHANNEL)
        for m in msgs:
            mw.call("after_enqueue", m, m.id)

    # -- async connections -----------------------------------------------------

    @overload
    async def aenqueue(
        self, task: Task[_P, Coroutine[Any, Any, _R]], /, *args: _P.args, **kwargs: _P.kwargs
    ) -> Job[_R]: ...
    @overload
    async def aenqueue(
        self, task: Task[_P, _R], /, *args: _P.args, **kwargs: _P.kwargs
    ) -> Job[_R]: ...
    @overload
    async def aenqueue(
        self, task: BoundTask[_P, Coroutine[Any, Any, _R]], /, *args: _P.args, **kwargs: _P.kwargs
    ) -> Job[_R]: ...
    @overload
    async def aenqueue(
        self, task: BoundTask[_P, _R], /, *args: _P.args, **kwargs: _P.kwargs
    ) -> Job[_R]: ...
    async def aenqueue(
        self, task: Task[..., Any] | BoundTask[..., Any], /, *args: Any, **kwargs: Any
    ) -> Job[Any]:
        """``enqueue`` for async connections."""
        self._async_only("enqueue")
        msg = self._task_message(task, args, kwargs)
        await self._write([msg])
        return OutboxJob(self.app, msg.id)

    async def apublish(
        self, event: Event, *, key: str | None = None, headers: dict[str, Any] | None = None
    ) -> str:
        self._async_only("publish")
        msg = event_message(event, key, headers)
        await self._write([msg])
        return msg.id

    def _async_only(self, what: str) -> None:
        if not self.sql.is_async:
            raise ConfigurationError(f"this is a sync connection: app.outbox(conn).{what}(...)")

    async def _write(self, msgs: list[Message]) -> None:
        mw = self.app.middleware
        for m in msgs:
            mw.call("before_enqueue", m)
        if self._same_db is None:
            self._same_db = await self.app.broker.owns_connection(self.sql)
        if self._same_db:
            await self.app.broker.enqueue_with(self.sql, msgs)
        else:
            await ensure_outbox(self.sql)
            await self.sql.execute_many(_INSERT, [self._row(m) for m in msgs])
            await self.sql.notify(NOTIFY_CHANNEL)
        for m in msgs:
            mw.call("after_enqueue", m, m.id)

    def _row(self, m: Message) -> dict[str, Any]:
        return {
            "id": m.id,
            "kind": m.kind,
            "msg_key": m.key,
            "body": encode_checked(m, self.app.max_message_size),
            "created_at": m.created_at,
        }


class OutboxJob(Job[T]):
    """The handle of a job sent through the outbox.

    A ``Job`` like any other once the broker has it.  Before that (the
    transaction has not committed, or the relay has not moved its row yet)
    the broker has no such job, so ``status()`` raises ``JobNotFound`` and
    ``cancel()`` returns False; ``result()`` alone waits for the job to
    arrive instead of raising, since a relay a few milliseconds behind is the
    normal case, not a lost job.
    """

    __slots__ = ()
    _arrives_later = True

    def _not_arrived(self, timeout: float | None) -> str:
        return (
            f"job {self.id} is not in the broker after {timeout} s: its transaction "
            "did not commit, or no relay has moved it yet (is `dumbwaiter relay` or "
            "`dumbwaiter worker --with-relay` running?)"
        )


def ensure_outbox_sync(sql: Sql) -> None:
    """Create the outbox table if missing, in the caller's transaction (its
    rollback takes the table too: see ``sqldb.ensure_table``)."""
    ensure_table_sync(sql, "dw_outbox", OUTBOX_DDL[sql.dialect])


async def ensure_outbox(sql: Sql) -> None:
    await ensure_table(sql, "dw_outbox", OUTBOX_DDL[sql.dialect])
