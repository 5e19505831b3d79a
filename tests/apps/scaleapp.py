"""The app ``tests/integration/test_scaling_signal.py`` runs a worker of:
``tests.apps.scaleapp:app`` on ``$DUMBWAITER_URL``, one task on queue
``scale`` whose jobs run until the file ``$SCALEAPP_GATE`` exists (the
test holds them running, then lets them all finish).

Built at each lookup of ``app`` (the module's ``__getattr__``), so the
test's environment decides the URL and the gate.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import dumbwaiter as dw

QUEUE = "scale"
TASK = "scale.held"


def held(n: int) -> None:
    """Run until the gate opens: a job whose length the test decides."""
    gate = Path(os.environ["SCALEAPP_GATE"])
    while not gate.exists():
        time.sleep(0.02)


def create_app() -> dw.App:
    app = dw.App()
    app.task(name=TASK, queue=QUEUE)(held)
    return app


def __getattr__(name: str) -> dw.App:
    if name == "app":
        return create_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
