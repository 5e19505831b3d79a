"""Run the async broker API from sync code.

Sync callers (a Django view asking ``job.status()``, the CLI) need the async
admin calls.  The portal is one daemon thread with its own event loop,
started on first use (never on import), so a call costs one thread hop and no
new loop.  Enqueue does not come here when the broker has a sync path.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from _thread import allocate_lock as _allocate_lock
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Portal:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                started = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(started.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=run, name="dumbwaiter-portal", daemon=True)
                self._thread.start()
                started.wait()
                self._loop = loop
            return self._loop

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the portal loop and wait for its result.

        What ``asyncio.run_coroutine_threadsafe(coro, loop).result()`` does,
        for a fraction of its CPU: the caller waits on a bare lock the task's
        done callback releases, instead of a ``concurrent.futures.Future``
        chained to the task (its condition variable, state copying and
        callbacks on both threads).  A sync ``enqueue`` on a broker without a
        sync producer (NATS, RabbitMQ) pays this once per call (its share of
        the hop's CPU: docs/benchmarks.md, "Figures behind the core's choices").

        The coroutine runs in a copy of the caller's context, as
        ``asyncio.to_thread`` runs a function: what the caller set there (a
        producer call's deadline, brokers/deadline.py) holds in the call."""
        loop = self._loop or self._ensure()
        context = contextvars.copy_context()
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("Portal.call from the portal thread would deadlock")
        done = _allocate_lock()
        done.acquire()
        box: list[asyncio.Task[T]] = []

        def finished(task: asyncio.Task[T]) -> None:
            box.append(task)
            done.release()

        def start() -> None:
            try:
                task = loop.create_task(coro, context=context)
            except BaseException as exc:  # never leave the caller waiting
                failed: asyncio.Future[T] = loop.create_future()
                failed.set_exception(exc)
                finished(failed)  # type: ignore[arg-type]
                return
            task.add_done_callback(finished)

        try:
            loop.call_soon_threadsafe(start)
        except RuntimeError:  # the loop was closed under us
            coro.close()
            raise
        done.acquire()
        return box[0].result()

    @property
    def started(self) -> bool:
        """Whether a sync call ever started the portal's loop."""
        return self._loop is not None

    async def settle(self, timeout: float) -> None:
        """From another loop: wait (up to ``timeout`` s) for the tasks already
        on the portal loop to finish, before ``close`` stops it.

        A broker's ``close()`` awaits the caller's loop's connection but only
        asks the portal loop to close its own; stopping that loop at once
        would destroy the close half-way and leak the socket."""
        if self._loop is None:
            return
        await asyncio.to_thread(self.call, _settle(timeout))

    def close(self) -> None:
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)
            loop.close()


async def _settle(timeout: float) -> None:
    """On the portal loop: wait for the tasks already there (the connection
    closes a broker's ``close()`` handed it)."""
    me = asyncio.current_task()
    pending = [t for t in asyncio.all_tasks() if t is not me]
    if pending:
        await asyncio.wait(pending, timeout=timeout)
