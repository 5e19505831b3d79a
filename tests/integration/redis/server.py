"""The Redis server the tests use, and a fresh key prefix per test.

``DW_TEST_REDIS`` names the server and database (default: db 15 of the local
server; tests never touch another db and never flush one).  Each test gets
its own prefix (``t<run>-<n>``, so its keys are ``{dw:t<run>-<n>}:...``);
the keys of every prefix this process made are deleted when it exits, by a
SCAN over this run's pattern only.
"""

from __future__ import annotations

import itertools
import os
import secrets
from pathlib import Path

from tests import atend
from tests.conftest import require_service

SERVER = os.environ.get("DW_TEST_REDIS", "redis://127.0.0.1:6379/15")
#: one token per test process: its prefixes, and only they, are cleaned at exit
RUN = secrets.token_hex(3)

_made: dict[Path, str] = {}
_counter = itertools.count()
_reachable: tuple[bool, str] | None = None


def _check() -> tuple[bool, str]:
    global _reachable
    if _reachable is None:
        try:
            import redis

            client = redis.Redis.from_url(SERVER, socket_connect_timeout=3)
            try:
                client.ping()
            finally:
                client.close()
            _reachable = (True, "")
        except ImportError as exc:
            _reachable = (False, f"redis-py is not installed ({exc}): pip install -e '.[dev]'")
        except Exception as exc:
            _reachable = (False, f"{SERVER}: {exc}")
    return _reachable


def new_prefix() -> str:
    ok, why = _check()
    require_service("Redis", ok, why)
    if not _made:
        atend.register(delete_keys)
    name = f"t{RUN}-{next(_counter)}"
    _made[Path(f"/prefix/{name}")] = name
    return name


def url(prefix: str, **options: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in {"prefix": prefix, **options}.items())
    return f"{SERVER}?{query}"


def redis_url(tmp_path: Path) -> str:
    """The conformance suite's URL: one prefix per ``tmp_path`` (per test)."""
    prefix = _made.get(tmp_path)
    if prefix is None:
        prefix = _made[tmp_path] = new_prefix()
    return url(prefix)


def delete_keys() -> None:
    """Delete the keys of every prefix this process made (at exit)."""
    if not _made:
        return
    _made.clear()
    try:
        import redis

        client = redis.Redis.from_url(SERVER, socket_connect_timeout=3)
        try:
            batch = []
            for key in client.scan_iter(match=f"{{dw:t{RUN}-*", count=1000):
                batch.append(key)
                if len(batch) >= 1000:
                    client.unlink(*batch)
                    batch = []
            if batch:
                client.unlink(*batch)
        finally:
            client.close()
    except Exception:  # the server went away: nothing more to do at exit
        pass
