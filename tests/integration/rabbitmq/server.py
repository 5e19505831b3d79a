"""The RabbitMQ server the tests use, a vhost of this run, a prefix per test.

``DW_TEST_AMQP`` names the server (default: guest on the local server).  The
test process makes a vhost of its own (``dw-test-<run>``, with
``rabbitmqctl``, which needs the node's Erlang cookie: root on the CI and
development machines) and deletes it, with everything in it, when it exits;
without ``rabbitmqctl`` it uses the URL's vhost (where the delay cascade
``dw.delay.*`` then stays).  Either way each conformance test's queues are
deleted when the next test starts (``rabbitmq_url``).  Each test's state
store is a SQLite file in its ``tmp_path`` (shared by every process of the
test).
"""

from __future__ import annotations

import atexit
import itertools
import os
import secrets
import shutil
import subprocess
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from tests.conftest import require_service

SERVER = os.environ.get("DW_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/")
RUN = secrets.token_hex(3)
VHOST = f"dw-test-{RUN}"

_made: dict[Path, str] = {}
_counter = itertools.count()
_state: tuple[bool, str, str] | None = None  # reachable, why, vhost


def _ctl(*args: str) -> bool:
    exe = shutil.which("rabbitmqctl") or (
        "/usr/sbin/rabbitmqctl" if os.path.exists("/usr/sbin/rabbitmqctl") else None
    )
    if exe is None:
        return False
    try:
        r = subprocess.run([exe, "-q", *args], capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def _probe(url: str) -> None:
    """Open and close one AMQP connection, on a thread of its own (the caller
    may be inside a running event loop: an async fixture)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    import aiormq

    async def go() -> None:
        conn = await asyncio.wait_for(aiormq.connect(url), 5)
        await conn.close()

    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, go()).result()


def _check() -> tuple[bool, str, str]:
    global _state
    if _state is None:
        try:
            _probe(SERVER)
        except ImportError as exc:
            _state = (False, f"aiormq is not installed ({exc}): pip install -e '.[dev]'", "")
            return _state
        except Exception as exc:
            _state = (False, f"{SERVER}: {exc!r}", "")
            return _state
        user = urlsplit(SERVER).username or "guest"
        perms = ("set_permissions", "-p", VHOST, user, ".*", ".*", ".*")
        if _ctl("add_vhost", VHOST) and _ctl(*perms):
            atexit.register(_ctl, "delete_vhost", VHOST)
            _state = (True, "", VHOST)
        else:
            _state = (True, "", urlsplit(SERVER).path.lstrip("/") or "/")
    return _state


def amqp_base() -> str:
    """The AMQP URL of this run's vhost (skips or fails without a server)."""
    ok, why, vhost = _check()
    require_service("RabbitMQ", ok, why)
    parts = urlsplit(SERVER)
    return urlunsplit(parts._replace(path="/" + quote(vhost, safe=""), query=""))


def new_prefix() -> str:
    return f"t{RUN}-{next(_counter)}"


def url(prefix: str, state: str, **options: str) -> str:
    query = "&".join(
        f"{k}={quote(v, safe='')}" for k, v in {"prefix": prefix, "state": state, **options}.items()
    )
    return f"{amqp_base()}?{query}"


def rabbitmq_url(tmp_path: Path) -> str:
    """The conformance suite's URL: one prefix and one state file per test.

    A new test's first call deletes the queues of the tests before it (they
    have ended: tests run one after the other), so a run never holds more
    than a few tests' quorum queues: each holds file handles of the shared
    server, and a few hundred exhaust its default limit."""
    prefix = _made.get(tmp_path)
    if prefix is None:
        amqp_base()  # skip before making anything
        for old_path, old_prefix in list(_made.items()):
            _delete_queues(old_prefix, _state_of(old_path))
            del _made[old_path]
        prefix = _made[tmp_path] = new_prefix()
    return url(prefix, _state_of(tmp_path))


def _state_of(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/rabbitmq-state.db"


def _delete_queues(prefix: str, state: str) -> None:
    """Delete the queues and exchanges the state store of ``prefix`` lists."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    async def go() -> None:
        import aiormq

        from dumbwaiter.brokers import from_url
        from dumbwaiter.brokers.rabbitmq.ledger import Keys
        from dumbwaiter.brokers.rabbitmq.topology import LANES, Names

        keys, names = Keys(prefix), Names(prefix, "dw.delay")
        store = from_url(state)
        try:
            queues = {k[len(keys.queue) :] for k in await store.kv_scan(keys.queue)}
            dlqs = {k[len(keys.dlq) :] for k in await store.kv_scan(keys.dlq)}
        finally:
            await store.close()
        conn = await aiormq.connect(amqp_base())
        try:
            ch = await conn.channel()
            for q in queues:
                for lane in LANES:
                    await ch.queue_delete(names.lane(q, lane), if_unused=False, if_empty=False)
            for q in dlqs:
                await ch.queue_delete(names.dlq(q), if_unused=False, if_empty=False)
            for x in (names.dlx, names.events):
                await ch.exchange_delete(x)
        finally:
            await conn.close()

    try:
        with ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, go()).result(timeout=60)
    except Exception:  # the vhost is deleted at exit anyway
        pass
