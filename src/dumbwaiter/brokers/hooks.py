"""The switch for the private hooks into client libraries.

A few engines reach past a client library's public API on their hot path,
always on objects dumbwaiter created (one connection, one channel, one
client), never on the library's classes or modules.  Each such hook has a
name, and ``DUMBWAITER_HOOKS_OFF`` turns hooks off, so the public path can be
compared with the hooked one (docs/benchmarks.md, "Private hooks: what each
buys"), or used when a hook is suspected of a bug:

* ``DUMBWAITER_HOOKS_OFF=1`` (or ``all``): every hook off;
* ``DUMBWAITER_HOOKS_OFF=publish,parser``: the named hooks off.

It is read when a connection is made, so a process sets it before its first
call.  It is a diagnostic: the hooks are on by default.
"""

from __future__ import annotations

import os

from ..errors import ConfigurationError

ENV = "DUMBWAITER_HOOKS_OFF"

#: every hook, by engine (docs/benchmarks.md says what each buys)
NAMES = frozenset({"publish", "inline", "direct", "parser", "send"})


def on(name: str) -> bool:
    """Whether the hook ``name`` (one of ``NAMES``) is on."""
    if name not in NAMES:
        raise ValueError(f"unknown hook {name!r}: one of {', '.join(sorted(NAMES))}")
    off = os.environ.get(ENV, "").strip().lower()
    if not off or off == "0":
        return True
    if off in ("1", "all", "true", "yes"):
        return False
    named = {part.strip() for part in off.split(",")} - {""}
    unknown = named - NAMES
    if unknown:
        raise ConfigurationError(
            f"{ENV}={os.environ[ENV]!r} names no hook {', '.join(sorted(unknown))}: "
            f"set it to 1 (every hook off) or to some of {', '.join(sorted(NAMES))}"
        )
    return name not in named
