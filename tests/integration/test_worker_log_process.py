"""``dumbwaiter worker --log-format json``: every line a JSON object.

A real worker process runs a job that succeeds, one that fails twice (a
retry, then a dead letter) and one of a task it does not know; its stderr
must parse line by line as JSON, with one ``job_finished`` line per ended
attempt carrying the stable keys.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

import dumbwaiter as dw
from dumbwaiter.message import TASK, Message, uuid7
from tests.apps import logapp
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
KEYS = {
    "ts", "level", "logger", "event", "message", "pid", "task", "job_id", "queue", "attempt",
    "max_attempts", "duration_ms", "outcome", "retry_in_s", "error_type", "error",
}  # fmt: skip


def _lines(path: Path) -> list[dict[str, Any]]:
    text = path.read_text()
    complete = text[: text.rfind("\n") + 1]  # a line being written is not read yet
    return [orjson.loads(line) for line in complete.splitlines()]


def test_json_log_lines_from_a_real_worker(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/broker.db"
    app = dw.App(url)
    app.task(queue="mail")(logapp.send_welcome.fn)
    app.task(retry=logapp.charge.retry)(logapp.charge.fn)
    ok = "tests.apps.logapp.send_welcome"
    welcome = app.tasks[ok].enqueue(7)
    charged = app.tasks["tests.apps.logapp.charge"].enqueue("o-1")
    typo = Message(id=uuid7(), kind=TASK, name="tests.apps.logapp.send_welcom", queue="mail")
    asyncio.run(app.broker.enqueue([typo]))
    log = tmp_path / "worker.log"
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT)])  # this checkout's code
    env = {**os.environ, "LOGAPP_URL": url, "PYTHONPATH": path}
    env.pop("DUMBWAITER_LOG_FORMAT", None)
    cmd = [sys.executable, "-m", "dumbwaiter", "worker", "--app", "tests.apps.logapp:app",
           "-q", "mail,default", "--log-format", "json"]  # fmt: skip
    with log.open("wb") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=err, stdout=subprocess.DEVNULL)
        try:

            def four_finished() -> bool:
                return sum(1 for j in _lines(log) if j["event"] == "job_finished") >= 4

            wait_until(four_finished, "4 job_finished lines (1 + 2 attempts + 1)")
        except AssertionError:
            print(log.read_text())  # what the worker said instead
            raise
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=30)
    assert code == 0  # SIGTERM: a clean stop
    lines = _lines(log)
    assert log.read_text().endswith("\n")
    assert all({"ts", "level", "logger", "event", "message", "pid"} <= set(j) for j in lines)
    assert any(j["event"] == "worker_start" for j in lines)
    finished = [j for j in lines if j["event"] == "job_finished"]
    assert all(set(j) == KEYS for j in finished), finished
    by_job: dict[str, list[dict[str, Any]]] = {}
    for j in finished:
        by_job.setdefault(j["job_id"], []).append(j)

    [s] = by_job[welcome.id]
    assert (s["task"], s["queue"], s["attempt"], s["outcome"]) == (ok, "mail", 1, "succeeded")
    assert s["level"] == "INFO" and s["error_type"] is None and s["duration_ms"] >= 0

    retry, dead = by_job[charged.id]
    assert (retry["outcome"], retry["attempt"], retry["error_type"]) == (
        "retrying", 1, "ConnectionError"
    )  # fmt: skip
    assert isinstance(retry["retry_in_s"], float)
    assert (dead["outcome"], dead["attempt"], dead["level"]) == ("dead", 2, "WARNING")
    assert dead["error"] == "payment provider down for o-1"

    [unknown] = by_job[typo.id]
    assert (unknown["task"], unknown["outcome"]) == (typo.name, "dead")
    assert unknown["error_type"] == "dumbwaiter.errors.UnknownTask"
    assert "did you mean 'tests.apps.logapp.send_welcome'?" in unknown["error"]
    app.close()
