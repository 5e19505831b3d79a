"""Shared fixtures, and how the suite runs in parallel.

In CI (``CI=true``) a broker whose server is not answering makes its tests
fail; locally they are skipped with the reason, so a laptop without RabbitMQ
can still run the rest.

``make test`` runs pytest on several processes (pytest-xdist); which tests
run one after another then, and why: ``tests/serial.py``.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

#: type-checking samples, never run (tests/unit/test_typing.py checks them)
collect_ignore = ["typing"]

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    from tests import serial

    serial.check(items)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, when it is installed
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist") != "loadgroup":
        return None
    from tests.serial import make_scheduler

    return make_scheduler(config, log)


@pytest.fixture(autouse=True)
def _no_terminal_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pytest-xdist worker's environment carries ``COLUMNS=80`` and
    ``LINES=24``, which a plain run's does not: the CLI's tables honour
    ``$COLUMNS`` (cli/output.py) and would fold at 80 columns there only."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        monkeypatch.delenv("COLUMNS", raising=False)
        monkeypatch.delenv("LINES", raising=False)


def pytest_sessionfinish() -> None:
    from tests import atend

    atend.run()  # before an xdist worker's exit, which may be cut short


def require_service(name: str, reachable: bool, why: str) -> None:
    """Skip locally, fail in CI, when a broker's server is not reachable."""
    if reachable:
        return
    if IN_CI:
        pytest.fail(f"{name} is required in CI and is not reachable: {why}")
    pytest.skip(f"{name} not reachable: {why}")
