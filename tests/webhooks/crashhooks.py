"""The app the webhook crash test's worker processes import
(``tests.webhooks.crashhooks:app``): deliveries allowed to the test's
receiver on loopback, retried quickly."""

from __future__ import annotations

import os
from typing import Any

import dumbwaiter as dw

app = dw.App(os.environ.get("DW_CRASH_URL", "memory://"))
SETTINGS: dict[str, Any] = {
    "allow_private": True,
    "retry": dw.Retry(attempts=20, backoff=0.2, jitter=0),
    "timeout": 5.0,
}
app.webhooks.configure(**SETTINGS)
