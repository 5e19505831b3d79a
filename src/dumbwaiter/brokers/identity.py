"""Which state store a process uses, told apart across processes and hosts.

An engine that keeps its job state apart from its transport (RabbitMQ's
``state=``) must make sure every process of one broker namespace uses the
same store: two stores split the truth (each sees half the records, locks,
limits and unique keys) without any error.  The transport announces the
identity of the store and refuses a process that brings another one
(``rabbitmq/announce.py``); this module says what that identity is.

A URL cannot be the identity: two URLs may name one store (a host name and
its address, a password that changed), and one URL may name two stores
(``redis://localhost`` on two hosts; a relative SQLite path in two working
directories).  So every store carries a random *store id*, written into the
store itself the first time (``kv_add``: the first writer wins, everyone
reads the same id), and the identity is that id.  For a store that only one
machine can share (``capabilities.multi_host`` False: a SQLite file, a
memory store), the identity adds the host's name: a copy of the file on
another machine (an image, a restored backup, a network share SQLite's
locks do not cover) is another store.

The default state store lives under a per-user state directory
(``state_dir``), so every process of one machine finds the same file
whatever its working directory.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

from .. import keys
from ..errors import ConfigurationError
from ..redact import mask_url
from .base import Broker

#: the kv key holding a store's id (no ttl; never rewritten once there)
STORE_ID_KEY = keys.STORE_ID


def state_dir() -> Path:
    """``$XDG_STATE_HOME/dumbwaiter`` (when set to an absolute path, as the
    XDG spec asks), else ``~/.local/state/dumbwaiter``: one per user and
    machine, the same from every working directory."""
    xdg = os.environ.get("XDG_STATE_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "dumbwaiter"
    try:
        home = Path.home()
    except RuntimeError:  # no $HOME and no passwd entry (a bare container)
        raise ConfigurationError(
            "no home directory for the default state store: set XDG_STATE_HOME, "
            "or name a state store (state=...)"
        ) from None
    return home / ".local" / "state" / "dumbwaiter"


def absolute_url(url: str) -> str:
    """``url`` with a relative SQLite path made absolute against the working
    directory now (``sqlite:///a.db`` -> ``sqlite:////srv/app/a.db``): the
    identity then names the file, and a later ``chdir`` does not move it.
    Any other URL is returned as it is."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite" or parts.netloc:
        return url
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not path or path == ":memory:" or os.path.isabs(path):
        return url
    query = f"?{parts.query}" if parts.query else ""
    return f"sqlite:///{os.path.abspath(path)}{query}"


async def store_id(store: Broker) -> str:
    """The store's id, written now if it has none (the first writer wins)."""
    await store.kv_add(STORE_ID_KEY, os.urandom(10).hex().encode())
    got = await store.kv_get([STORE_ID_KEY])
    value = got.get(STORE_ID_KEY)
    if not value:  # an expired or evicted key between the two calls: rare, try once more
        await store.kv_add(STORE_ID_KEY, os.urandom(10).hex().encode())
        value = (await store.kv_get([STORE_ID_KEY])).get(STORE_ID_KEY, b"")
    if not value:
        raise ConfigurationError(f"state store {mask_url(store.url)!r} does not keep its store id")
    return value.decode()


@dataclass(frozen=True, slots=True)
class Identity:
    """A state store as one process sees it.  ``key`` is what two processes
    compare; the rest describes it in messages (never with a password)."""

    key: str
    #: the store's URL, password masked (a SQLite path made absolute)
    store: str
    store_id: str
    #: the host of the process that announced it
    host: str
    #: whether other machines may share the store (else ``key`` holds ``host``)
    multi_host: bool

    def describe(self) -> str:
        where = f"store id {self.store_id}"
        if not self.multi_host:
            where = f"on host {self.host}, {where}"
        return f"{self.store} ({where})"

    def dump(self) -> bytes:
        return orjson.dumps(
            {
                "key": self.key,
                "store": self.store,
                "store_id": self.store_id,
                "host": self.host,
                "multi_host": self.multi_host,
            }
        )

    @classmethod
    def load(cls, raw: bytes) -> Identity | None:
        """An announced identity, or None when ``raw`` is not one."""
        try:
            d: Any = orjson.loads(raw)
            return cls(
                key=str(d["key"]),
                store=str(d["store"]),
                store_id=str(d["store_id"]),
                host=str(d["host"]),
                multi_host=bool(d["multi_host"]),
            )
        except (ValueError, TypeError, KeyError):
            return None


async def identity_of(store: Broker) -> Identity:
    """This process's identity of ``store`` (writes its store id if new)."""
    sid = await store_id(store)
    host = socket.gethostname()
    shared = store.capabilities.multi_host
    return Identity(
        key=sid if shared else f"{sid}@{host}",
        store=mask_url(store.url),
        store_id=sid,
        host=host,
        multi_host=shared,
    )
