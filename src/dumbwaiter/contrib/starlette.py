"""FastAPI and Starlette: the App's connections live as long as the server.

    from fastapi import FastAPI
    from dumbwaiter.contrib.fastapi import lifespan, mount_dashboard

    api = FastAPI(lifespan=lifespan(app))
    mount_dashboard(api, app, "/ops/jobs")

    @api.post("/orders")
    async def create_order(order: Order) -> dict[str, str]:
        job = await send_receipt.aenqueue(order.id)
        return {"job": job.id}

Why a lifespan: the App connects lazily, so without one the first request
pays for the connection, and a broker that cannot be reached is found by a
customer instead of by the deploy.  Opening (and checking) it at start-up
makes the server fail to start instead; closing it at shutdown returns the
connections (and stops the sync bridge's thread) before the process exits,
instead of leaving them to the server's timeout.

Only Starlette is needed, so this works for a plain Starlette app and for
FastAPI (which is Starlette underneath); ``dumbwaiter.contrib.fastapi`` is
the same module under the name FastAPI users look for.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, TypeAlias

from ..errors import ConfigurationError, MissingDependency

try:
    from starlette.applications import Starlette
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise MissingDependency(
        "dumbwaiter.contrib.fastapi needs Starlette (FastAPI's core), which is not installed: "
        "pip install 'dumbwaiter[fastapi]'"
    ) from exc

if TYPE_CHECKING:
    from ..app import App
    from ..dashboard import Auth

__all__ = [
    "STATE_KEY",
    "Lifespan",
    "StateLifespan",
    "close",
    "lifespan",
    "mount_dashboard",
    "opened",
]

#: a Starlette lifespan: called with the ASGI app, entered for the server's life;
#: what it yields becomes the requests' state
Lifespan: TypeAlias = Callable[[Any], AbstractAsyncContextManager[Mapping[str, Any] | None]]
#: what ``lifespan`` returns (it always yields a state)
StateLifespan: TypeAlias = Callable[[Any], AbstractAsyncContextManager[Mapping[str, Any]]]

#: the key of the App in the lifespan state (``request.state.dumbwaiter``)
STATE_KEY = "dumbwaiter"
#: the key the start-up check reads (it is never written)
_CHECK_KEY = "dumbwaiter:lifespan-check"


@contextlib.asynccontextmanager
async def opened(app: App, *, check: bool = True) -> AsyncIterator[App]:
    """Open ``app``'s broker connection on this event loop, and close it (and
    whatever the App's sync calls opened) on the way out: for a lifespan of
    your own, ``async with opened(app): ...``.

    ``check`` makes one round trip to the broker first (a read of one key of
    its coordination store), so a broker that cannot be reached fails the
    start, not the first request; ``check=False`` starts without it."""
    try:
        await app.broker.open()
        if check:
            await app.broker.kv_get([_CHECK_KEY])
        yield app
    finally:
        await close(app)


async def close(app: App) -> None:
    """Close ``app`` from a running loop, with nothing left half-closed
    (``App.aclose``: this loop's connection, then the sync bridge's, which
    sync code in an endpoint such as ``job.status()`` opened)."""
    await app.aclose()


def lifespan(app: App, *, inner: Lifespan | None = None, check: bool = True) -> StateLifespan:
    """A lifespan for ``FastAPI(lifespan=...)`` or ``Starlette(lifespan=...)``
    that opens ``app`` at start-up and closes it at shutdown (``opened``).

    ``inner`` is your own lifespan, run inside (so it may enqueue at start-up
    and at shutdown); its state is merged with ``{"dumbwaiter": app}``, which
    handlers read as ``request.state.dumbwaiter``."""

    @contextlib.asynccontextmanager
    async def run(asgi_app: Any) -> AsyncIterator[Mapping[str, Any]]:
        async with opened(app, check=check):
            if inner is None:
                yield {STATE_KEY: app}
                return
            async with inner(asgi_app) as state:
                yield {STATE_KEY: app, **(state or {})}

    return run


def mount_dashboard(
    asgi_app: Starlette,
    app: App,
    path: str = "/dumbwaiter",
    *,
    auth: Auth | None = None,
    name: str = "dumbwaiter",
    **options: Any,
) -> Starlette:
    """Mount the dashboard of ``app`` at ``path`` of ``asgi_app`` (a FastAPI or
    Starlette app) and return it.

    Without ``auth`` it answers loopback clients only (see docs/dashboard.md);
    ``options`` go to ``dumbwaiter.dashboard.create_app``.  A mounted app gets
    no lifespan of its own: the dashboard samples its figures when a page is
    viewed, and shares ``app``'s connection, which ``lifespan`` closes."""
    from ..dashboard import create_app  # needs jinja2: imported only when asked for

    if not path.startswith("/") or path == "/":
        raise ConfigurationError(
            f"mount the dashboard under a path such as '/dumbwaiter', not {path!r}"
        )
    dashboard = create_app(app, auth=auth, **options)
    asgi_app.mount(path.rstrip("/"), dashboard, name=name)
    return dashboard
