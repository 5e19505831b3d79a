"""The Lua scripts, one per state transition, loaded from ``scripts/*.lua``.

A script may start with ``--@include NAME`` lines; each is replaced by the
text of ``scripts/NAME.lua`` (shared helpers, as BullMQ's ``includes/``).
Scripts are called by SHA1 (``EVALSHA``), so only the 40-byte digest travels
per call; a server that does not know the script (first use, ``SCRIPT
FLUSH``, a restart) answers ``NOSCRIPT`` and the caller sends ``EVAL`` with
the text once, which also caches it on the server again.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources

_INCLUDE = "--@include "


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    source: bytes
    sha: bytes


def _text(name: str) -> str:
    return resources.files(__package__).joinpath("scripts", f"{name}.lua").read_text()


def _expand(name: str, seen: tuple[str, ...] = ()) -> str:
    if name in seen:
        raise ValueError(f"script {name}.lua includes itself through {' -> '.join(seen)}")
    out = []
    for line in _text(name).splitlines():
        if line.startswith(_INCLUDE):
            out.append(_expand(line[len(_INCLUDE) :].strip(), (*seen, name)))
        else:
            out.append(line)
    return "\n".join(out)


def load(name: str) -> Script:
    source = _expand(name).encode()
    return Script(name, source, hashlib.sha1(source).hexdigest().encode())


NAMES = (
    "enqueue",
    "enqueue_one",
    "commit",
    "unstage",
    "fetch",
    "ack",
    "retry",
    "dead",
    "requeue",
    "extend",
    "rescue",
    "cancel",
    "reschedule",
    "list",
    "list_fin",
    "replay",
    "purge",
    "stats",
    "pause",
    "declare",
    "publish",
    "list_events",
    "acquire",
    "renew",
    "release",
    "kv_get",
    "kv_set",
    "kv_cas",
    "kv_add",
    "kv_incr",
    "kv_delete",
    "kv_scan",
    "rate_limit",
    "slots",
)


class Scripts:
    """Every script, read once per process."""

    def __init__(self) -> None:
        for name in NAMES:
            setattr(self, name, load(name))

    enqueue: Script
    enqueue_one: Script
    commit: Script
    unstage: Script
    fetch: Script
    ack: Script
    retry: Script
    dead: Script
    requeue: Script
    extend: Script
    rescue: Script
    cancel: Script
    reschedule: Script
    list: Script
    list_fin: Script
    replay: Script
    purge: Script
    stats: Script
    pause: Script
    declare: Script
    publish: Script
    list_events: Script
    acquire: Script
    renew: Script
    release: Script
    kv_get: Script
    kv_set: Script
    kv_cas: Script
    kv_add: Script
    kv_incr: Script
    kv_delete: Script
    kv_scan: Script
    rate_limit: Script
    slots: Script


_scripts: Scripts | None = None


def scripts() -> Scripts:
    global _scripts
    if _scripts is None:
        _scripts = Scripts()
    return _scripts
