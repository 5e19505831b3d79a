"""Run the async broker API from sync code.

Sync callers (a Django view asking ``job.status()``, the CLI) need the async
admin calls.  The portal is one daemon thread with its own event loop,
started on first use (never on import), so a call costs one thread hop and no
new loop.  Enqueue does not come here when the broker has a sync path.
"""

from __future__ import annotations

import asyncio
import threading
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
        """Run ``coro`` on the portal loop and wait for its result."""
        loop = self._ensure()
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("Portal.call from the portal thread would deadlock")
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def close(self) -> None:
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)
            loop.close()
