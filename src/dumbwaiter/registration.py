"""What checking a registration needs, shared by ``@app.task``,
``@app.subscribe`` and ``@app.workflow``: a function's name, and timeouts
given as seconds or a ``timedelta``."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from .errors import ConfigurationError


def seconds(value: float | timedelta | None) -> float | None:
    if value is None:
        return None
    s = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if s <= 0:
        raise ConfigurationError(f"a timeout must be positive, got {value!r}")
    return s


def qualname(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def default_name(fn: Callable[..., Any]) -> str:
    """``module.qualname``; for a script run as ``__main__``, the name the
    module would have when a worker imports it (its file name)."""
    module = getattr(fn, "__module__", None) or "?"
    if module == "__main__":
        main = sys.modules.get("__main__")
        spec = getattr(main, "__spec__", None)
        if spec is not None and spec.name:
            module = spec.name
        elif main is not None and getattr(main, "__file__", None):
            module = os.path.splitext(os.path.basename(main.__file__ or ""))[0]
    return f"{module}.{getattr(fn, '__qualname__', getattr(fn, '__name__', repr(fn)))}"
