"""pytest fixtures for code that uses dumbwaiter (docs/testing.md).

pytest loads this by itself wherever dumbwaiter is installed (the
``pytest11`` entry point ``dumbwaiter``; ``-p no:dumbwaiter`` turns it off).
It defines fixtures and nothing else: no hook, no option, no import of an
optional extra, so it costs a suite that does not use it nothing but the
import of dumbwaiter itself.

* ``dw_app``: the App under test; a new ``App("memory://")`` unless your
  conftest.py overrides it to return your own app.
* ``dw_testing``: that app on a fresh ``memory://`` broker for the test, with
  what it enqueued and published (``testing.Harness``).
* ``dw_eager``: the same, in eager mode: each job runs inside the call that
  enqueued it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .app import App
from .testing import Harness, isolate


@pytest.fixture
def dw_app() -> Iterator[App]:
    """The App the dumbwaiter fixtures work on.

    Override it to test your own app, tasks and subscriptions as they are::

        @pytest.fixture
        def dw_app():
            from myproject.jobs import app
            return app
    """
    app = App("memory://")
    yield app
    app.close()


@pytest.fixture
def dw_testing(dw_app: App) -> Iterator[Harness]:
    """``dw_app`` on a fresh ``memory://`` broker for this test (its own broker
    is never contacted), recording what it enqueues and publishes; put back
    as it was after the test."""
    with isolate(dw_app) as harness:
        yield harness


@pytest.fixture
def dw_eager(dw_testing: Harness) -> Harness:
    """``dw_testing`` in eager mode: ``enqueue`` and ``publish`` return after a
    worker ran what they sent (arguments through JSON as in production,
    retries by the task's policy without the waits)."""
    dw_testing.eager = True
    return dw_testing
