"""Local stand-ins for the mail providers' HTTP APIs and for file servers:
a Starlette app served by uvicorn on a loopback port, in a thread.

A ``FakeProvider`` checks each request the way the provider documents it
(``check`` raises ``Bad`` with what is wrong, answered as a 400 the test
sees in the job's error) and records it; ``replies`` scripts the answers
(status, JSON body, headers) before the default success.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


class Bad(Exception):
    """The request does not have the shape the provider documents."""


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    json: Any


@dataclass
class Reply:
    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


class FakeProvider:
    def __init__(
        self, path: str, check: Callable[[Seen], None], success: Callable[[Seen], Reply]
    ) -> None:
        self.path = path
        self.check = check
        self.success = success
        self.seen: list[Seen] = []
        self.replies: list[Reply] = []
        self.lock = threading.Lock()

    async def endpoint(self, request: Request) -> Response:
        body = await request.body()
        try:
            parsed = await request.json()
        except ValueError:
            parsed = None
        seen = Seen(
            request.method, request.url.path, {k.lower(): v for k, v in request.headers.items()},
            body, parsed,
        )  # fmt: skip
        with self.lock:
            self.seen.append(seen)
            scripted = self.replies.pop(0) if self.replies else None
        try:
            self.check(seen)
        except Bad as exc:
            return JSONResponse({"fake": f"bad request shape: {exc}"}, status_code=400)
        reply = scripted or self.success(seen)
        return JSONResponse(reply.body, status_code=reply.status, headers=reply.headers)

    def app(self) -> Starlette:
        return Starlette(routes=[Route(self.path, self.endpoint, methods=["POST"])])


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """Serve an ASGI ``app`` on 127.0.0.1 (a free port) in a thread; yield its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def require(cond: object, what: str) -> None:
    if not cond:
        raise Bad(what)
