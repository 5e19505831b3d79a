"""The dashboard: a Starlette ASGI app over the broker's admin API.

``dumbwaiter.dashboard.create_app(app)`` returns an ASGI app to run with any
ASGI server or to mount in FastAPI/Starlette (``fastapi_app.mount("/jobs",
create_app(app))``); ``dumbwaiter dashboard`` runs it with uvicorn.

Importing this package costs nothing: Starlette and Jinja2 (``pip install
'dumbwaiter[dashboard]'``) are imported by ``create_app``, so the throughput
sampler works in a worker without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from ..app import App
    from .security import Auth

__all__ = ["Auth", "create_app"]


def create_app(app: App | str, *, auth: Auth | None = None, **options: Any) -> Starlette:
    """The dashboard of ``app`` (an App, or a broker URL); see ``asgi.create_app``."""
    from .asgi import create_app as create

    return create(app, auth=auth, **options)


def __getattr__(name: str) -> Any:
    if name == "Auth":
        from .security import Auth

        return Auth
    raise AttributeError(name)
