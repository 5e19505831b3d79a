"""What the real-browser tests and the screenshot script share: a dashboard
served by uvicorn on 127.0.0.1, a worker in a thread, Debian's Chromium."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

import dumbwaiter as dw
from dumbwaiter.dashboard import Auth, create_app

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu"]


def have_chromium() -> bool:
    return os.access(CHROMIUM, os.X_OK)


@contextmanager
def serve(app: dw.App, auth: Auth | None = None) -> Iterator[str]:
    """Serve ``app``'s dashboard on 127.0.0.1 (a free port) in a thread; yield its URL.

    The socket listens before the server thread starts, so the browser can
    connect at once (the kernel queues the connection until uvicorn accepts
    it): no waiting for a "started" flag.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        create_app(app, auth=auth, refresh=0.5),
        log_level="warning",
        access_log=False,
        lifespan="on",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@contextmanager
def worker_thread(app: dw.App, **config: Any) -> Iterator[dw.Worker]:
    """A real worker on its own event loop in a thread (as another process would be)."""
    config.setdefault("fetch_wait", 0.2)
    config.setdefault("heartbeat", 0.5)
    config.setdefault("lease", 5.0)
    w = dw.Worker(app, **config)

    async def run() -> None:
        try:
            await w.run()
        finally:  # the worker leaves the pooled webhook client of its loop open
            if "webhooks" in app.__dict__:
                await app.webhooks.aclose()

    thread = threading.Thread(target=lambda: asyncio.run(run()), daemon=True)
    thread.start()
    try:
        yield w
    finally:
        w.stop()
        thread.join(timeout=30)


def launch(playwright: Any) -> Any:
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
