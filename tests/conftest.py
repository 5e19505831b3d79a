"""Shared fixtures.

In CI (``CI=true``) a broker whose server is not answering makes its tests
fail; locally they are skipped with the reason, so a laptop without RabbitMQ
can still run the rest.
"""

from __future__ import annotations

import os

import pytest

#: type-checking samples, never run (tests/unit/test_typing.py checks them)
collect_ignore = ["typing"]

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_service(name: str, reachable: bool, why: str) -> None:
    """Skip locally, fail in CI, when a broker's server is not reachable."""
    if reachable:
        return
    if IN_CI:
        pytest.fail(f"{name} is required in CI and is not reachable: {why}")
    pytest.skip(f"{name} not reachable: {why}")
