"""The type variables of the generic public classes, ``Task`` and ``Job``.

They have defaults (PEP 696), so a bare ``Task`` or ``Job`` in a caller's
annotations still means "any task", "a job of any result", and code written
before the classes were generic type-checks as it did.  Python 3.11's
``typing`` has no defaults; ``typing_extensions`` has them, but it is a heavy
import that every worker process would pay for, and at run time a default
changes nothing.  So type checkers read ``typing_extensions``' variables
(their own stubs of it, nothing needs installing) and the interpreter plain
``typing``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import ParamSpec, TypeVar

    #: a task's parameters (what ``enqueue`` takes)
    P = ParamSpec("P", default=...)
    #: what a task's function returns (for an async function, its coroutine)
    R = TypeVar("R", covariant=True, default=Any)
    #: what a job's ``result()`` returns
    T = TypeVar("T", covariant=True, default=Any)
else:
    from typing import ParamSpec, TypeVar

    P = ParamSpec("P")
    R = TypeVar("R", covariant=True)
    T = TypeVar("T", covariant=True)

__all__ = ["P", "R", "T"]
