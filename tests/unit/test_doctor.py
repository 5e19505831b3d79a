"""``dumbwaiter doctor``: each anti-pattern is found and named with its fix;
a well-configured app passes; the command exits 1 on problems."""

from __future__ import annotations

import orjson
from click.testing import CliRunner

import dumbwaiter as dw
from dumbwaiter import doctor
from dumbwaiter.alerts import DeadLetters, QueueDepth, configure
from dumbwaiter.cli import main


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
    assert all(levels[c] == doctor.PROBLEM for c in ("DW001", "DW002", "DW003", "DW004", "DW005"))
    # problems first, and every finding says what to change
    assert [f.level for f in found] == sorted(
        (f.level for f in found), key=lambda x: x != "problem"
    )
    assert all(f.fix for f in found)
    dw001 = next(f for f in found if f.code == "DW001")
    assert "backoff" in dw001.fix


def test_a_well_configured_app_has_no_problems() -> None:
    found = doctor.check(good_app())
    assert doctor.problems(found) == []


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


def test_cli_exits_1_on_problems_and_0_when_clean() -> None:
    runner = CliRunner()
    r = runner.invoke(main, ["doctor", "--app", "tests.unit.test_doctor:bad"])
    assert r.exit_code == 1, r.output
    assert "DW001" in r.output and "fix:" in r.output and "problem" in r.output
    r = runner.invoke(main, ["doctor", "--app", "tests.unit.test_doctor:bad", "--json"])
    assert r.exit_code == 1
    body = orjson.loads(r.stdout)
    assert body["ok"] is False and {f["code"] for f in body["findings"]} >= {"DW001", "DW002"}
    r = runner.invoke(main, ["doctor", "--app", "tests.unit.test_doctor:good"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["doctor", "--url", "memory://"])
    assert r.exit_code == 2 and "--app" in r.output  # it needs the code
