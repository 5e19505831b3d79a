"""The RabbitMQ server the tests use, a vhost of this run, a prefix per test.

``DW_TEST_AMQP`` names the server (default: guest on the local server).  The
test process makes a vhost of its own (``dw-test-<run>``, with
``rabbitmqctl``, which needs the node's Erlang cookie: root on the CI and
development machines) and deletes it, with everything in it, when it exits;
without ``rabbitmqctl`` it uses the URL's vhost (where the delay cascade
``dw.delay.*`` then stays).  Either way each conformance test's queues are
deleted when the next test starts (``rabbitmq_url``).  Each test's state
store is a SQLite file in its ``tmp_path`` (shared by every process of the
test), or the store a caller names (``rabbitmq_url(tmp_path, state=...)``).
"""

from __future__ import annotations

import itertools
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from tests import atend
from tests.conftest import require_service

SERVER = os.environ.get("DW_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/")
RUN = secrets.token_hex(3)
VHOST = f"dw-test-{RUN}"

_made: dict[Path, tuple[str, str]] = {}  # tmp_path -> (prefix, state store)
_counter = itertools.count()
_state: tuple[bool, str, str] | None = None  # reachable, why, vhost


def _ctl(*args: str) -> bool:
    return _ctl_out(*args) is not None


def _ctl_out(*args: str) -> str | None:
    """``rabbitmqctl -q ARGS``'s output, or None when it failed or is missing."""
    exe = shutil.which("rabbitmqctl") or (
        "/usr/sbin/rabbitmqctl" if os.path.exists("/usr/sbin/rabbitmqctl") else None
    )
    if exe is None:
        return None
    try:
        r = subprocess.run([exe, "-q", *args], capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.decode(errors="replace") if r.returncode == 0 else None


#: seconds one probe may take to connect: a loaded 2-core machine (a test
#: suite beside RabbitMQ's Erlang VM) can take several seconds for the
#: handshake, and a failed probe skips (fails, in CI) every RabbitMQ test
PROBE_TIMEOUT = 30.0
#: probes before the server counts as unreachable (only a probe that timed
#: out is tried again: a refused connection is final at once)
PROBES = 2


def _probe(url: str) -> None:
    """Open and close one AMQP connection, on a thread of its own (the caller
    may be inside a running event loop: an async fixture)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    import aiormq

    async def go() -> None:
        for attempt in range(1, PROBES + 1):
            try:
                conn = await asyncio.wait_for(aiormq.connect(url), PROBE_TIMEOUT)
            except TimeoutError:
                if attempt == PROBES:
                    raise
                continue
            await conn.close()
            return

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
            atend.register(_delete_vhost, VHOST)
            _state = (True, "", VHOST)
        else:
            _state = (True, "", urlsplit(SERVER).path.lstrip("/") or "/")
    return _state


def _delete_vhost(vhost: str) -> None:
    """Delete this run's vhost, at exit: after every test, and so after every
    broker the tests closed.  A connection still open in it then belongs to
    a broker a test did not close (an App whose portal thread still runs, a
    process a test did not wait for): deleting the vhost closes it forcibly
    (its aiormq logs "Unexpected connection close ... vhost is deleted"), so
    say whose it is, by its name (``dumbwaiter <prefix> <instance>``: the
    prefix is ``t<run>-<n>``, the n-th test's namespace)."""
    left = _connections(vhost)
    if left:
        print(
            f"tests/integration/rabbitmq/server.py: {len(left)} connection(s) still open in "
            f"{vhost} at exit (a test did not close its broker): {sorted(left)}",
            file=sys.stderr,
        )
    _ctl("delete_vhost", vhost)


def _connections(vhost: str) -> list[str]:
    """The names the clients gave their connections to ``vhost`` (their
    addresses when unnamed)."""
    import json

    out = _ctl_out("list_connections", "--formatter", "json", "vhost", "name", "client_properties")
    try:
        rows = json.loads(out or "[]")
    except ValueError:
        return []
    names = []
    for row in rows:
        if row.get("vhost") == vhost:
            props = {p[0]: p[2] for p in row.get("client_properties") or [] if len(p) == 3}
            names.append(str(props.get("connection_name") or row.get("name")))
    return names


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


def rabbitmq_url(tmp_path: Path, state: str | None = None) -> str:
    """The conformance suite's URL: one prefix and one state store per test
    (a SQLite file in ``tmp_path`` unless ``state`` names another).

    A new test's first call deletes the queues of the tests before it (they
    have ended: tests run one after the other), so a run never holds more
    than a few tests' quorum queues: each holds file handles of the shared
    server, and a few hundred exhaust its default limit."""
    made = _made.get(tmp_path)
    if made is None:
        amqp_base()  # skip before making anything
        for old_path, (old_prefix, old_state) in list(_made.items()):
            _delete_queues(old_prefix, old_state)
            del _made[old_path]
        made = _made[tmp_path] = (new_prefix(), state or _state_of(tmp_path))
    return url(*made)


def _state_of(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/rabbitmq-state.db"


def _delete_queues(prefix: str, state: str) -> None:
    """Delete the queues and exchanges the state store of ``prefix`` lists."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    async def go() -> None:
        import aiormq

        from dumbwaiter.brokers import from_url
        from dumbwaiter.brokers.rabbitmq import announce
        from dumbwaiter.brokers.rabbitmq.topology import LANES, Keys, Topology

        keys, names = Keys(prefix), Topology(prefix, "dw.delay")
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
            # the state-store announcement: a quorum queue and an exchange per prefix
            await ch.queue_delete(announce.name(prefix), if_unused=False, if_empty=False)
            await ch.exchange_delete(announce.name(prefix))
        finally:
            await conn.close()

    try:
        with ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, go()).result(timeout=60)
    except Exception:  # the vhost is deleted at exit anyway
        pass
