"""``dumbwaiter schedules ls|pause|resume|trigger`` and the scheduler commands'
wiring, in-process against a real SQLite database.

The schedules' state is made by running leader passes in-process
(``Scheduler.step``); every assertion is about what the CLI shows or changed.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result

import dumbwaiter as dw
from dumbwaiter.cli import main
from dumbwaiter.scheduler import Scheduler
from tests.apps import schedapp

APP = "tests.apps.schedapp:app"
HEARTBEAT = "tests.apps.schedapp.heartbeat"


@pytest.fixture
def url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    u = f"sqlite:///{tmp_path / 'jobs.db'}"
    monkeypatch.setenv(schedapp.URL_ENV, u)
    monkeypatch.delenv("DUMBWAITER_URL", raising=False)
    monkeypatch.delenv("DUMBWAITER_APP", raising=False)
    return u


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def js(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return orjson.loads(result.stdout)


def leader_passes() -> None:
    """Two leader passes: the first (its clock three seconds back) sees the
    schedules, the second (at the real time) enqueues the heartbeat's ticks."""

    async def go() -> None:
        app = schedapp.create_app()
        now = time.time()
        clock = [now - 3]
        s = Scheduler(app, clock=lambda: clock[0])
        await s.step()
        clock[0] = now
        await s.step()
        await s.resign()
        await app.aclose()

    asyncio.run(go())


def by_name(data: Any) -> dict[str, Any]:
    return {row["name"]: row for row in data["schedules"]}


def test_ls_before_any_scheduler_ran_shows_the_code(url: str) -> None:
    rows = by_name(js(cli("schedules", "ls", "--app", APP, "--json")))
    assert set(rows) == {HEARTBEAT, "daily-report", "weekly-report"}
    daily = rows["daily-report"]
    assert (daily["expression"], daily["tz"], daily["paused"], daily["last_run"]) == (
        "0 3 * * *",
        "Asia/Taipei",
        False,
        None,
    )
    assert daily["next_run"] > time.time() and daily["task"] == "tests.apps.schedapp.report"
    assert rows["weekly-report"]["missed"] == "once"
    # nothing in the broker yet: a bare --url knows no schedule
    assert js(cli("schedules", "ls", "--url", url, "--json")) == {"schedules": []}
    out = cli("schedules", "ls", "--url", url)
    assert "no schedules" in out.output


def test_ls_table_after_a_leader_ran(url: str) -> None:
    leader_passes()
    out = cli("schedules", "ls", "--app", APP)
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    for column in ("name", "expression", "tz", "last run", "next run", "paused"):
        assert column in lines[0]
    heartbeat = next(line for line in lines if line.startswith(HEARTBEAT))
    assert "* * * * * *" in heartbeat and " ago)" in heartbeat and "UTC" in heartbeat
    rows = by_name(js(cli("schedules", "ls", "--url", url, "--json")))
    hb = rows[HEARTBEAT]
    assert hb["last_run"] is not None and hb["last_job"] and hb["in_code"] is False
    assert hb["next_run"] > hb["last_run"]
    assert "not in this app" not in cli("schedules", "ls", "--url", url).output


def test_ls_marks_schedules_the_app_does_not_have(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    leader_passes()
    other = tmp_path / "otherapp.py"
    other.write_text(
        "import os\nimport dumbwaiter as dw\n"
        "app = dw.App(os.environ['SCHEDAPP_URL'])\n"
        "@app.periodic(every=60, name='other')\ndef other() -> None: ...\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "otherapp", raising=False)
    out = cli("schedules", "ls", "--app", "otherapp:app")
    assert out.exit_code == 0, out.output
    assert f"{HEARTBEAT} (not in this app)" in out.output
    assert "other " in out.output and "other (not" not in out.output


def test_pause_and_resume_by_short_name_and_from_a_bare_url(url: str) -> None:
    leader_passes()
    out = cli("schedules", "pause", "heartbeat", "--app", APP)
    assert out.exit_code == 0, out.output
    assert out.stdout.strip() == f"paused {HEARTBEAT}"
    assert by_name(js(cli("schedules", "ls", "--url", url, "--json")))[HEARTBEAT]["paused"]
    assert "paused" in cli("schedules", "ls", "--app", APP).output
    assert js(cli("schedules", "resume", HEARTBEAT, "--url", url, "--json")) == {
        "name": HEARTBEAT,
        "paused": False,
        "was_paused": True,
    }
    again = cli("schedules", "resume", HEARTBEAT, "--url", url)
    assert again.stdout.strip() == f"{HEARTBEAT} was not paused"
    assert not by_name(js(cli("schedules", "ls", "--app", APP, "--json")))[HEARTBEAT]["paused"]


def test_trigger_enqueues_one_run_with_the_schedules_arguments(url: str) -> None:
    out = js(cli("schedules", "trigger", "weekly-report", "--app", APP, "--json"))
    assert out["name"] == "weekly-report"
    job = js(cli("jobs", "show", out["id"], "--url", url, "--json"))
    assert (job["name"], job["args"], job["kwargs"], job["key"]) == (
        "tests.apps.schedapp.report",
        ["weekly"],
        {"days": 7},
        None,
    )
    assert job["headers"]["periodic"]["trigger"] is True
    rows = by_name(js(cli("schedules", "ls", "--app", APP, "--json")))
    assert rows["weekly-report"]["last_trigger"] is not None


def test_trigger_from_a_bare_url_uses_the_stored_definition(url: str) -> None:
    leader_passes()
    plain = cli("schedules", "trigger", "daily-report", "--url", url)
    assert plain.exit_code == 0, plain.output
    job = js(cli("jobs", "show", plain.stdout.strip(), "--url", url, "--json"))
    assert (job["name"], job["args"], job["queue"]) == (
        "tests.apps.schedapp.report",
        ["daily"],
        "default",
    )


def test_unknown_and_ambiguous_names_are_errors(url: str) -> None:
    out = CliRunner().invoke(main, ["schedules", "pause", "nope", "--app", APP])
    assert out.exit_code == 1 and "no schedule 'nope'" in out.output
    assert "daily-report" in out.output  # the known names are listed


def test_the_commands_are_listed_and_need_an_app() -> None:
    top = cli("--help").output
    assert "scheduler" in top and "schedules" in top
    assert "--with-scheduler" in cli("worker", "--help").output
    assert "--lease" in cli("scheduler", "--help").output
    for sub in ("ls", "pause", "resume", "trigger"):
        assert cli("schedules", sub, "--help").exit_code == 0
    out = CliRunner().invoke(main, ["scheduler"], env={"DUMBWAITER_APP": ""})
    assert out.exit_code == 2 and "needs --app" in out.output


def test_an_app_without_schedules_has_an_empty_registry() -> None:
    assert dw.App("memory://").schedules == {}
