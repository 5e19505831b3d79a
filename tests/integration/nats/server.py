"""The NATS server the tests use, and a fresh namespace per test.

``DW_TEST_NATS`` names the server (default: the local one, with JetStream).
Each test gets its own namespace (``t<run>x<n>``: streams ``DW_t<run>x<n>_*``
and ``KV_dw_t<run>x<n>``, subjects ``dw.t<run>x<n>.>`` and
``$KV.dw_t<run>x<n>.>``); the streams of a test are deleted when the
next test asks for a namespace, and whatever is left when the test process
exits.  Tests never touch a stream they did not make.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from dumbwaiter.brokers.nats.names import stream_names
from tests import atend
from tests.conftest import require_service

SERVER = os.environ.get("DW_TEST_NATS", "nats://127.0.0.1:4222")
#: one token per test process: its namespaces, and only they, are deleted
RUN = secrets.token_hex(3)

T = TypeVar("T")

_made: dict[Path, str] = {}
_live: list[str] = []
_counter = itertools.count()
_reachable: tuple[bool, str] | None = None


def run_sync(coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
    """Run ``coro`` on a loop of its own in a thread (callable from anywhere)."""
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = asyncio.run(asyncio.wait_for(coro, timeout))
        except BaseException as exc:
            out["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout + 5)
    if "error" in out:
        raise out["error"]
    return out["value"]  # type: ignore[no-any-return]


async def connect(server: str = SERVER) -> Any:
    import nats

    u = urlsplit(server)
    _, w = await asyncio.wait_for(asyncio.open_connection(u.hostname, u.port or 4222), 3)
    w.close()

    async def quiet(_e: Exception) -> None:
        pass

    return await nats.connect(server, connect_timeout=3, allow_reconnect=False, error_cb=quiet)


def _check() -> tuple[bool, str]:
    global _reachable
    if _reachable is None:
        try:
            import nats  # noqa: F401
        except ImportError as exc:
            _reachable = (False, f"nats-py is not installed ({exc}): pip install -e '.[dev]'")
            return _reachable

        async def probe() -> None:
            nc = await connect()
            try:
                await nc.jetstream().account_info()
            finally:
                await nc.close()

        try:
            run_sync(probe(), 10)
            _reachable = (True, "")
        except OSError as exc:
            _reachable = (False, f"{SERVER}: {exc!r}")
        except Exception as exc:
            _reachable = (False, f"{SERVER} (JetStream enabled?): {exc!r}")
    return _reachable


def new_namespace() -> str:
    ok, why = _check()
    require_service("NATS", ok, why)
    if not _live:
        atend.register(delete_all)
    else:
        delete(list(_live))  # the previous test's streams
    name = f"t{RUN}x{next(_counter)}"
    _live.append(name)
    return name


def url(namespace: str, server: str = SERVER, **options: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in {"prefix": namespace, **options}.items())
    return f"{server}?{query}"


def nats_url(tmp_path: Path) -> str:
    """The conformance suite's URL: one namespace per ``tmp_path`` (per test)."""
    ns = _made.get(tmp_path)
    if ns is None:
        ns = _made[tmp_path] = new_namespace()
    return url(ns)


def delete(namespaces: list[str], server: str = SERVER) -> None:
    """Delete the streams (and with them their consumers) of these namespaces."""

    async def go() -> None:
        from nats.js.errors import NotFoundError

        nc = await connect(server)
        try:
            js = nc.jetstream()
            for ns in namespaces:
                for s in stream_names(ns):
                    try:
                        await js.delete_stream(s)
                    except NotFoundError:
                        pass
        finally:
            await nc.close()

    try:
        run_sync(go())
    except Exception:  # the server went away: nothing more to do
        return
    for ns in namespaces:
        if ns in _live:
            _live.remove(ns)


def delete_all() -> None:
    if _live:
        delete(list(_live))
