"""The app ``alerts check`` runs against in ``tests/unit/test_alerts.py``:
``tests.apps.lagapp:app``, on ``$DUMBWAITER_URL``, whose alerts fire on any lag.

Built at each lookup of ``app`` (the module's ``__getattr__``), because the
test sets ``$DUMBWAITER_URL`` only for the command it runs, and the CLI calls
nothing it finds behind ``--app``.
"""

from __future__ import annotations

import dumbwaiter as dw
from dumbwaiter.alerts import Lag, configure


def create_app() -> dw.App:
    app = dw.App()
    configure(app, rules=[Lag(threshold=0)])
    return app


def __getattr__(name: str) -> dw.App:
    if name == "app":
        return create_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
