"""The durable workflow examples run as the docs say (examples/signup_flow, examples/order_saga)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(name: str) -> str:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name / "main.py")],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return out.stdout


def test_signup_flow_example_activates_one_user_and_nudges_the_other() -> None:
    out = _run("signup_flow")
    assert "ann: activated" in out and "bob: nudged" in out
    assert out.count("mail 'welcome'") == 2 and out.count("mail 'nudge'") == 1
    assert "bob's event 'activation': timed out" in out


def test_order_saga_example_compensates_in_reverse_order() -> None:
    out = _run("order_saga")
    assert "-> parcel-o-1" in out
    o2 = out.split("o-2:", 1)[1]
    assert o2.index("release r-o-2") < o2.index("refund ch-o-2")  # last completed, first undone
    assert "failed at step 'ship'" in o2 and "no carrier delivers to Atlantis" in o2
    assert "refund ch-o-1" not in out  # the order that shipped keeps its charge
