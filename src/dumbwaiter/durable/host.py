"""The app as durable workflows see it (``App`` is one).

``app.py`` imports this package (``@app.workflow``), so nothing here imports
the App: a run needs its broker and producer paths (``ports.Runtime``) and
the registry it adds its runner task and event router to.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ..ports import Runtime

if TYPE_CHECKING:
    from ..retry import Retry
    from ..task import Task


class Host(Runtime, Protocol):
    @property
    def tasks(self) -> dict[str, Task[..., Any]]: ...

    @property
    def event_routes(self) -> dict[str, Task[..., Any]]:
        """queue -> the handler of any event delivered there (the router)."""
        ...

    @property
    def timeout(self) -> float | None:
        """The app's default task timeout (a step's, unless given)."""
        ...

    @property
    def default_queue(self) -> str: ...

    def _retry(self, retry: Retry | bool | None, what: str) -> Retry:
        """``retry=`` as ``@app.task`` reads it."""
        ...
