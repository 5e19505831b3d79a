"""Real HTTP receivers for the webhook tests: uvicorn on a free loopback port.

``Receiver`` is a small ASGI app that records every request (path,
headers, body) and answers by path, so one server plays every kind of
partner a sender meets:

* ``/ok``: 200;
* ``/fail``: 500 with a long body (the attempt log keeps 1 KB of it);
* ``/slow``: answers after 5 s (longer than the tests' timeouts);
* ``/throttle``: 429 with ``Retry-After: 1`` the first time a webhook-id
  arrives, 200 after;
* ``/gone``: 410;
* ``/flaky/N``: 500 the first N times a webhook-id arrives, 200 after;
* ``/hold``: 200 after 50 ms, counting how many requests are in at once.

Only loopback addresses are ever served or sent to.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn

from tests.waiting import wait_until


@dataclass(frozen=True)
class Request:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float

    @property
    def webhook_id(self) -> str:
        return self.headers.get("webhook-id", "")


class Receiver:
    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.seen: Counter[tuple[str, str]] = Counter()
        self.inflight = 0
        self.max_inflight = 0
        self._lock = threading.Lock()

    def on(self, path: str) -> list[Request]:
        return [r for r in self.requests if r.path == path]

    async def __call__(
        self,
        scope: dict[str, Any],
        receive: Callable[[], Any],
        send: Callable[[dict[str, Any]], Any],
    ) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the sender went away mid-request (a killed worker): not received
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        path = scope["path"]
        req = Request(path, headers, body, time.time())
        with self._lock:
            self.requests.append(req)
            self.seen[(path, req.webhook_id)] += 1
            n = self.seen[(path, req.webhook_id)]
        status, extra, answer = 200, [], b"ok"
        if path == "/fail":
            status, answer = 500, b"boom " * 500
        elif path == "/slow":
            await asyncio.sleep(5)
        elif path == "/throttle" and n == 1:
            status, extra, answer = 429, [(b"retry-after", b"1")], b"slow down"
        elif path == "/gone":
            status, answer = 410, b"gone"
        elif path.startswith("/flaky/") and n <= int(path.rsplit("/", 1)[1]):
            status, answer = 500, b"not yet"
        elif path == "/hold":
            with self._lock:
                self.inflight += 1
                self.max_inflight = max(self.max_inflight, self.inflight)
            await asyncio.sleep(0.05)
            with self._lock:
                self.inflight -= 1
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"text/plain"), *extra],
            }
        )
        await send({"type": "http.response.body", "body": answer})


@contextlib.contextmanager
def serve(app: Any) -> Iterator[str]:
    """Run ``app`` on uvicorn in a thread, on a free port of 127.0.0.1; yield its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        loop="asyncio",
        http="h11",
        ws="none",
        lifespan="off",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, "the receiver to start", 10)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()
