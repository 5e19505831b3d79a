"""FastAPI: ``lifespan``, ``opened`` and ``mount_dashboard``.

FastAPI is Starlette underneath and needs nothing of its own here, so this is
``dumbwaiter.contrib.starlette`` under the name a FastAPI user looks for
(docs/frameworks.md).
"""

from __future__ import annotations

from .starlette import (
    STATE_KEY,
    Lifespan,
    StateLifespan,
    close,
    lifespan,
    mount_dashboard,
    opened,
)

__all__ = [
    "STATE_KEY",
    "Lifespan",
    "StateLifespan",
    "close",
    "lifespan",
    "mount_dashboard",
    "opened",
]
