"""The app's own middleware: workflows and batches move on through the
lifecycle hooks any middleware has (``after_success``, ``on_dead``,
``on_cancelled``), so the worker knows nothing of them.  The App puts these
after the user's middleware (innermost): a step's successor is enqueued
before any user ``after_success`` runs.

Each says the header of its jobs (``only_with_header``): the worker calls
their hooks only for a job that carries it, so a plain job pays for neither.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING

from .batch import shard_done
from .middleware import Middleware
from .workflow import advance, mark_dead

if TYPE_CHECKING:
    from .context import Context
    from .message import ErrorRecord


class WorkflowSteps(Middleware):
    """Moves workflows on from inside the worker: a step that succeeded
    enqueues what comes next (before its ack); a step that died leaves its
    waiters the ``wf:ID:dead`` hint."""

    only_with_header = "wf"

    def after_success(self, ctx: Context) -> Awaitable[None]:
        return advance(ctx.app, ctx.message, ctx.state.get("result"))

    def on_dead(self, ctx: Context | None, error: ErrorRecord) -> Awaitable[None] | None:
        if ctx is None:
            return None
        return mark_dead(ctx.app, [ctx.message])


class BatchShards(Middleware):
    """Counts each shard of a batch as it ends (see ``dumbwaiter.batch``)."""

    only_with_header = "batch"

    def after_success(self, ctx: Context) -> Awaitable[None]:
        return shard_done(ctx.app, ctx.message, ok=True)

    def on_dead(self, ctx: Context | None, error: ErrorRecord) -> Awaitable[None] | None:
        if ctx is None:
            return None
        return shard_done(ctx.app, ctx.message, ok=False)

    def on_cancelled(self, ctx: Context) -> Awaitable[None]:
        return shard_done(ctx.app, ctx.message, ok=False)
