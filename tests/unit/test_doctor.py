"""``dumbwaiter doctor``: each anti-pattern is found and named with its fix;
a well-configured app passes; the broker is asked too; the command exits 1
on faults only (an unreachable or unready broker), never on warnings, so the
README's quick start passes."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
from click.testing import CliRunner

import dumbwaiter as dw
from dumbwaiter import doctor
from dumbwaiter.alerts import DeadLetters, QueueDepth, configure
from dumbwaiter.cli import main
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


class Paid(dw.Event, type="doctor.paid"):
    order: str


def bad_app() -> dw.App:
    app = dw.App("memory://doctor-bad")

    @app.task(queue="mail", retry=dw.Retry(attempts=5, backoff=0))
    def hammer() -> None: ...

    @app.task(queue="mail", retry=dw.Retry(attempts=3, backoff=(1, 2), jitter=0))
    def charge() -> None: ...

    sub = app.subscribe(Paid, group="ledger")(lambda event: None)
    sub.inbox = False  # type: ignore[attr-defined]  # a group that turned its inbox off
    return app


def good_app() -> dw.App:
    app = dw.App("memory://doctor-good", timeout=60)

    @app.task(queue="mail")
    @doctor.idempotent
    def send(to: str) -> None: ...

    @app.task(queue="mail", retry=dw.Retry.never())
    def charge_once() -> None: ...

    @app.subscribe(Paid, group="ledger")
    def book(event: Paid) -> None: ...

    configure(app, webhooks=["https://alerts.example.invalid/hook"])
    return app


#: what ``dumbwaiter doctor --app tests.unit.test_doctor:bad`` (or ``:good``) checks
bad, good = bad_app(), good_app()


def codes(findings: list[doctor.Finding]) -> set[tuple[str, str]]:
    return {(f.code, f.subject) for f in findings}


def test_every_anti_pattern_is_found() -> None:
    app = bad_app()
    found = doctor.check(app)
    got = codes(found)
    hammer, charge = (f"task {t.name}" for t in app.tasks.values())
    assert ("DW001", hammer) in got  # retries with no backoff
    assert ("DW006", charge) in got  # no jitter (a note)
    assert ("DW004", hammer) in got and ("DW004", charge) in got  # no idempotency hint
    assert ("DW003", "group ledger") in got  # inbox disabled
    assert ("DW002", "app") in got  # no dead-letter alert
    assert ("DW005", "queue mail") in got and ("DW005", "queue group:ledger") in got
    assert ("DW007", hammer) in got  # no timeout (a note)
    levels = {f.code: f.level for f in found}
    assert levels["DW006"] == levels["DW007"] == doctor.NOTE
    # all work as configured: warnings, not faults
    assert all(levels[c] == doctor.WARNING for c in ("DW001", "DW002", "DW003", "DW004", "DW005"))
    assert doctor.faults(found) == []
    # warnings first, and every finding says what to change
    assert [f.level for f in found] == sorted((f.level for f in found), key=doctor.LEVELS.index)
    assert all(f.fix for f in found)
    dw001 = next(f for f in found if f.code == "DW001")
    assert "backoff" in dw001.fix


def test_a_well_configured_app_has_no_warnings() -> None:
    found = doctor.check(good_app())
    assert [f for f in found if f.level != doctor.NOTE] == []


def test_alert_config_gaps() -> None:
    app = good_app()
    configure(app, rules=[QueueDepth(per_queue={"mail": {"enabled": False}})])
    got = codes(doctor.check(app))
    assert ("DW002", "app") in got  # the rules lack the dead-letter alert
    assert ("DW005", "queue mail") in got  # depth alert disabled for mail
    assert ("DW005", "queue group:ledger") not in got
    configure(app, rules=[DeadLetters(), QueueDepth()])  # log only: a note
    found = doctor.check(app)
    assert [(f.code, f.level) for f in found if f.code == "DW002"] == [("DW002", doctor.NOTE)]


def test_ignore_silences_one_check() -> None:
    app = dw.App("memory://doctor-ignore")

    @app.task(retry=dw.Retry(attempts=2, backoff=0))
    @doctor.ignore("DW001", "DW004")
    def fast_poll() -> None: ...

    got = {f.code for f in doctor.check(app) if f.subject == f"task {fast_poll.name}"}
    assert "DW001" not in got and "DW004" not in got


def test_cli_shows_levels_and_exits_0_on_warnings_only() -> None:
    runner = CliRunner()
    r = runner.invoke(main, ["doctor", "--app", "tests.unit.test_doctor:bad"])
    assert r.exit_code == 0, r.output  # warnings and notes: advice, not failure
    assert "DW001 warning" in r.output and "fix:" in r.output and "DW006 note" in r.output
    assert "0 faults, " in r.output and "no faults (warnings and notes are advice)" in r.output
    r = runner.invoke(main, ["doctor", "--app", "tests.unit.test_doctor:bad", "--json"])
    assert r.exit_code == 0
    body = orjson.loads(r.stdout)
    assert body["ok"] is True and body["counts"]["fault"] == 0
    levels = {f["code"]: f["level"] for f in body["findings"]}
    assert levels["DW001"] == levels["DW002"] == "warning" and levels["DW007"] == "note"
    r = runner.invoke(main, ["doctor", "--app", "tests.unit.test_doctor:good"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["doctor", "--url", "memory://"])
    assert r.exit_code == 2 and "--app" in r.output  # it needs the code


#: an app whose broker nothing listens for
unreachable = dw.App("redis://127.0.0.1:1/0")


def test_an_unreachable_broker_is_a_fault_and_exit_1() -> None:
    runner = CliRunner()
    spec = "tests.unit.test_doctor:unreachable"
    r = runner.invoke(main, ["doctor", "--app", spec, "--timeout", "5", "--json"])
    assert r.exit_code == 1, r.output
    body = orjson.loads(r.stdout)
    [fault] = [f for f in body["findings"] if f["level"] == "fault"]
    assert body["ok"] is False and body["counts"]["fault"] == 1
    assert fault["code"] == "DW101" and fault["subject"] == "broker redis://"
    assert "cannot be reached" in fault["message"] and "127.0.0.1:1" in fault["message"]
    r = runner.invoke(main, ["doctor", "--app", spec, "--timeout", "5"])
    assert r.exit_code == 1 and "DW101 fault" in r.output and "1 fault, " in r.output
    # configuration only (CI without a broker): no fault
    r = runner.invoke(main, ["doctor", "--app", spec, "--no-broker", "--json"])
    assert r.exit_code == 0 and "DW101" not in r.output


def test_a_schema_not_migrated_is_a_fault() -> None:
    from tests.integration.postgres import server

    app = dw.App(server.url(server.new_schema(), migrate="check"))
    found = asyncio.run(_broker_findings(app))
    [fault] = doctor.faults(found)
    assert (fault.code, fault.subject) == ("DW102", "broker postgresql://")
    assert "has no dumbwaiter tables" in fault.message and "dumbwaiter migrate" in fault.message


async def _broker_findings(app: dw.App) -> list[doctor.Finding]:
    try:
        return await doctor.check_broker(app, timeout=10)
    finally:
        await app.aclose()


def test_the_readme_quick_start_passes_and_a_running_worker_is_seen(tmp_path: Path) -> None:
    """The quick start failed doctor (exit 1, "3 problems"); its findings are
    warnings.  "No worker is running" goes away once one runs."""
    shutil.copy(ROOT / "examples" / "quickstart" / "tasks.py", tmp_path / "tasks.py")
    env = {k: v for k, v in os.environ.items() if k not in ("DUMBWAITER_URL", "DUMBWAITER_APP")}

    def doctor_json() -> dict[str, Any]:
        out = subprocess.run(
            [sys.executable, "-m", "dumbwaiter", "doctor", "--app", "tasks:app", "--json"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
        body: dict[str, Any] = orjson.loads(out.stdout)
        assert body["ok"] is True and body["counts"]["fault"] == 0
        return body

    assert "DW103" in {f["code"] for f in doctor_json()["findings"]}
    cmd = [
        sys.executable,
        "-m",
        "dumbwaiter",
        "worker",
        "--app",
        "tasks:app",
        "--log-level",
        "ERROR",
    ]
    worker = subprocess.Popen(cmd, cwd=tmp_path, env=env)
    try:
        wait_until(
            lambda: "DW103" not in {f["code"] for f in doctor_json()["findings"]},
            "doctor to see the running worker",
        )
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
