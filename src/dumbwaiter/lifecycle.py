"""The app's own middleware: workflows and batches move on through the
awaited lifecycle hooks any middleware has (``after_success``, ``on_dead``,
``on_cancelled``), so the worker knows nothing of them.  The App
puts these after the user's middleware (innermost): a step's successor is
enqueued before any user ``after_success`` runs.
"""

from __future__ import annotations

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

    async def after_success(self, ctx: Context) -> None:
        if "wf" in ctx.message.headers:
            await advance(ctx.app, ctx.message, ctx.state.get("result"))

    async def on_dead(self, ctx: Context | None, error: ErrorRecord) -> None:
        if ctx is not None and "wf" in ctx.message.headers:
            await mark_dead(ctx.app, [ctx.message])


class BatchShards(Middleware):
    """Counts each shard of a batch as it ends (see the module docstring)."""

    async def after_success(self, ctx: Context) -> None:
        if "batch" in ctx.message.headers:
            await shard_done(ctx.app, ctx.message, ok=True)

    async def on_dead(self, ctx: Context | None, error: ErrorRecord) -> None:
        if ctx is not None and "batch" in ctx.message.headers:
            await shard_done(ctx.app, ctx.message, ok=False)

    async def on_cancelled(self, ctx: Context) -> None:
        if "batch" in ctx.message.headers:
            await shard_done(ctx.app, ctx.message, ok=False)
