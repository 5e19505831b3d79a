"""Flask: the App as an extension, for the application-factory pattern.

    # myproject/jobs.py: the App and its tasks, importable by the worker
    jobs = dw.App()                              # $DUMBWAITER_URL
    dumbwaiter = Dumbwaiter(jobs)

    @jobs.task
    def send_receipt(order_id: str) -> None: ...

    # myproject/__init__.py
    def create_app(config=None):
        app = Flask(__name__)
        app.config.from_mapping(config or {})
        dumbwaiter.init_app(app)
        return app

    # a view: sync, like Flask itself
    @bp.post("/orders")
    def create_order():
        job = send_receipt.enqueue(order_id)

The App is module-level, not built by the factory, because its tasks are
registered when their module is imported, and ``dumbwaiter worker --app
myproject.jobs:jobs`` imports that same module.  So the broker URL comes from
the environment (``DUMBWAITER_URL``) or the code, and a ``DUMBWAITER_URL`` in
the Flask config that says otherwise is an error at ``init_app``, not a
silent use of another broker.  Tests point the App at a private broker with
``dumbwaiter.testing.isolate`` (docs/testing.md).

Flask views run in the server's threads, where the sync API is the right one
(no event loop runs there); inside a transaction, ``jobs.outbox(session)``
works on a Flask-SQLAlchemy session as on any SQLAlchemy one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError, MissingDependency
from ..redact import mask_url

try:
    from flask import Flask, current_app
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise MissingDependency(
        "dumbwaiter.contrib.flask needs Flask, which is not installed: "
        "pip install 'dumbwaiter[flask]'"
    ) from exc

if TYPE_CHECKING:
    from ..app import App

__all__ = ["EXTENSION", "Dumbwaiter", "get_app"]

#: the key of the extension in ``flask_app.extensions``
EXTENSION = "dumbwaiter"


class Dumbwaiter:
    """The Flask extension of a dumbwaiter App: ``Dumbwaiter(jobs, flask_app)``
    or, with a factory, ``Dumbwaiter(jobs)`` then ``init_app(flask_app)`` in
    each app the factory makes."""

    def __init__(self, app: App, flask_app: Flask | None = None) -> None:
        self.app = app
        if flask_app is not None:
            self.init_app(flask_app)

    def init_app(self, flask_app: Flask) -> None:
        """Register the App with ``flask_app`` (``flask_app.extensions["dumbwaiter"]``,
        ``get_app()``, and ``jobs`` in ``flask shell``).  A ``DUMBWAITER_URL``
        in its config must name the App's broker."""
        wanted = flask_app.config.get("DUMBWAITER_URL")
        if wanted is not None and str(wanted) != self.app.url:
            raise ConfigurationError(
                f"the Flask config's DUMBWAITER_URL is {mask_url(str(wanted))}, but the "
                f"dumbwaiter App was built for {mask_url(self.app.url)}: the App is built at "
                "import (its tasks register there), so set DUMBWAITER_URL in the environment "
                "or pass the URL to dw.App(); in tests use dumbwaiter.testing.isolate"
            )
        flask_app.extensions[EXTENSION] = self
        flask_app.shell_context_processor(self._shell)

    def _shell(self) -> dict[str, Any]:
        return {"jobs": self.app}


def get_app() -> App:
    """The dumbwaiter App of the current Flask app (inside a request or an app
    context): for code that does not import the module the App lives in."""
    ext = current_app.extensions.get(EXTENSION)
    if not isinstance(ext, Dumbwaiter):
        raise ConfigurationError(
            f"Flask app {current_app.name!r} has no dumbwaiter extension: "
            "call Dumbwaiter(jobs).init_app(app) in its factory"
        )
    return ext.app
