"""``dumbwaiter demo`` end to end: real worker processes on one SQLite file,
receipts through dumbwaiter.mail into .eml files, signed webhooks through
dumbwaiter.webhooks to a receiver on 127.0.0.1 that verifies them, an outage
that opens the partner's circuit breaker, dead letters and their replay."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

TIMEOUT = 150


@pytest.mark.timeout(TIMEOUT + 30)
def test_demo_delivers_every_order(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUMBWAITER_")}
    env["PYTHONWARNINGS"] = "error"  # the demo and its workers run warning-free
    cmd = [sys.executable, "-m", "dumbwaiter", "demo", "--orders", "60", "--dir", str(tmp_path)]
    # its own session: on a timeout, the demo and its workers are killed together
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the demo did not finish in {TIMEOUT} s:\n{out}")

    assert proc.returncode == 0, out
    assert re.search(r"orders accepted\s+60 in", out), out
    assert re.search(r"dead letters after replay\s+0\b", out), out
    assert re.search(r"missing deliveries\s+0\b", out), out
    assert "all 60 orders delivered" in out, out
    assert "Traceback" not in out, out
    # the partner verified every webhook's signature; the breaker opened and closed
    assert re.search(r"bad signatures\s+0\b", out), out
    assert re.search(r"orders the partner was told about\s+.\s+60\s+.\s+0\b", out), out
    assert "webhook-signature: v1," in out and "breaker open" in out, out
    assert "breaker closed" in out, out
    # every 10th order's webhook died (422 from the partner's old catalog) and
    # was replayed by endpoint
    assert "HTTP 422" in out, out
    assert "await app.webhooks.replay('ep_partner')\n    -> 6 deliveries ready again" in out, out

    # the workers were stopped, not left behind
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)
    # --dir keeps the files; the workers logged no errors (dead letters are warnings)
    assert (tmp_path / "jobs.db").exists() and (tmp_path / "shop.db").exists()
    # one receipt per order, as the mail a server would get
    receipts = sorted((tmp_path / "mail").glob("receipt-o-*.eml"))
    assert len(receipts) == 60
    mail = receipts[0].read_text()
    assert "To: customer1@example.com" in mail and "Subject: Your receipt for order o-00001" in mail
    logs = sorted(tmp_path.glob("worker-*.log"))
    assert len(logs) == 2
    for log in logs:
        text = log.read_text()
        assert "Traceback" not in text and " ERROR " not in text, text


def test_without_the_extras_the_demo_says_what_to_install(tmp_path: Path) -> None:
    """``pip install dumbwaiter`` alone has no httpx: the demo names the extras
    in one line instead of a traceback, and leaves nothing behind."""
    script = (
        "import sys; sys.modules['httpx'] = None\n"  # import httpx fails
        "from dumbwaiter.cli import main\n"
        "main(['demo', '--orders', '5'])\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUMBWAITER_")}
    env["TMPDIR"] = str(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 1, proc.stderr
    assert "Error: the demo sends its mail and webhooks" in proc.stderr
    assert "pip install 'dumbwaiter[mail,webhooks]'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []  # its temporary directory is gone
