"""The worker's log: one line per finished job, as text or JSON.

Succeeded and retrying at INFO, dead-lettered at WARNING, each with the task,
the job id, the queue, the attempt, the duration and the error as the
record's extra fields (what a JSON formatter writes); an unknown task's line
names it and suggests the registered names close to it.  (The JSON format
from a real ``dumbwaiter worker`` process: tests/integration/test_worker_log_process.py.)
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
import pytest

import dumbwaiter as dw
from dumbwaiter import logs
from dumbwaiter.attempt import did_you_mean
from dumbwaiter.message import TASK, Message, uuid7
from dumbwaiter.testing import drain
from dumbwaiter.worker import Worker

FAST = dw.Retry(attempts=2, backoff=0.01, jitter=0)


def _finished(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == logs.JOB_FINISHED]


def _app() -> dw.App:
    app = dw.App("memory://")

    @app.task(name="shop.send_welcome", queue="mail")
    def send_welcome(user_id: int) -> None: ...

    @app.task(name="shop.flaky", retry=FAST)
    def flaky(ctx: dw.Context) -> None:
        if ctx.attempt == 1:
            raise ConnectionError("smtp refused")

    @app.task(name="shop.doomed", retry=dw.Retry.never())
    def doomed() -> None:
        raise KeyError("order-7")

    return app


async def test_one_line_per_finished_job_with_its_facts(caplog: pytest.LogCaptureFixture) -> None:
    app = _app()
    ok = await app.tasks["shop.send_welcome"].aenqueue(42)
    retried = await app.tasks["shop.flaky"].aenqueue()
    dead = await app.tasks["shop.doomed"].aenqueue()
    with caplog.at_level(logging.INFO, logger="dumbwaiter"):
        await drain(app)
    lines = _finished(caplog)
    by_job: dict[str, list[logging.LogRecord]] = {}
    for r in lines:
        by_job.setdefault(r.job_id, []).append(r)  # type: ignore[attr-defined]
    assert sorted(len(v) for v in by_job.values()) == [1, 1, 2]  # one line per attempt's end

    [s] = by_job[ok.id]
    assert s.levelno == logging.INFO
    assert (s.task, s.queue, s.attempt, s.outcome, s.error_type) == (  # type: ignore[attr-defined]
        "shop.send_welcome",
        "mail",
        1,
        "succeeded",
        None,
    )
    assert isinstance(s.duration_ms, float) and s.duration_ms >= 0  # type: ignore[attr-defined]
    assert s.getMessage().startswith(f"job {ok.id} (shop.send_welcome) succeeded in ")

    first, second = by_job[retried.id]
    assert (first.levelno, first.outcome, first.attempt) == (logging.INFO, "retrying", 1)  # type: ignore[attr-defined]
    assert first.error_type == "ConnectionError" and first.error == "smtp refused"  # type: ignore[attr-defined]
    assert first.retry_in_s is not None and 0 <= first.retry_in_s <= 1  # type: ignore[attr-defined]
    assert " retrying in " in first.getMessage()
    assert "attempt 1 of 2 failed in " in first.getMessage()
    assert "ConnectionError: smtp refused" in first.getMessage()
    assert (second.outcome, second.attempt) == ("succeeded", 2)  # type: ignore[attr-defined]

    [d] = by_job[dead.id]
    assert (d.levelno, d.outcome, d.error_type) == (logging.WARNING, "dead", "KeyError")  # type: ignore[attr-defined]
    assert "dead-lettered after attempt 1 of 1" in d.getMessage()
    assert "KeyError: 'order-7'" in d.getMessage()


async def test_an_unknown_task_is_named_with_a_did_you_mean(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = _app()
    typo = Message(id=uuid7(), kind=TASK, name="shop.send_welcom", queue="mail")
    moved = Message(id=uuid7(), kind=TASK, name="old.module.doomed", queue="default")
    far = Message(id=uuid7(), kind=TASK, name="nothing.alike", queue="default")
    await app.broker.enqueue([typo, moved, far])
    with caplog.at_level(logging.INFO, logger="dumbwaiter"):
        await drain(app, ["mail", "default"])
    lines = {r.job_id: r for r in _finished(caplog)}  # type: ignore[attr-defined]
    line = lines[typo.id]
    assert (line.task, line.outcome) == (typo.name, "dead")  # type: ignore[attr-defined]
    assert line.error_type == "dumbwaiter.errors.UnknownTask"  # type: ignore[attr-defined]
    assert f"no task named '{typo.name}'" in line.getMessage()
    assert "did you mean 'shop.send_welcome'?" in line.getMessage()
    assert "did you mean 'shop.doomed'?" in lines[moved.id].getMessage()  # by its last part
    assert "did you mean" not in lines[far.id].getMessage()
    # the dead letter carries the same words
    info = await app.broker.get(typo.id)
    assert info is not None and "did you mean" in info.message.errors[-1].message


def test_did_you_mean() -> None:
    names = ["shop.jobs.send_welcome", "shop.jobs.send_receipt", "shop.billing.charge"]
    assert did_you_mean("shop.jobs.send_welcom", names) == ["shop.jobs.send_welcome"]
    assert did_you_mean("jobs.charge", names) == ["shop.billing.charge"]
    assert did_you_mean("shop.jobs.refund", names) == []


async def test_no_line_is_built_when_its_level_is_off(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The per-job line costs nothing when INFO is off: not built, not formatted
    (a dead letter, at WARNING, still is)."""
    app = _app()
    built: list[str] = []
    real = Worker._finished

    def spy(self: Worker, d: Any, kind: str, took: float, level: int) -> None:
        built.append(kind)
        real(self, d, kind, took, level)

    monkeypatch.setattr(Worker, "_finished", spy)
    await app.tasks["shop.send_welcome"].aenqueue(1)
    await app.tasks["shop.doomed"].aenqueue()
    with caplog.at_level(logging.WARNING, logger="dumbwaiter"):
        await drain(app)
    assert built == ["dead"]
    assert [r.outcome for r in _finished(caplog)] == ["dead"]  # type: ignore[attr-defined]


def test_json_formatter_writes_stable_keys() -> None:
    fmt = logs.JsonFormatter()
    job = logging.LogRecord(
        "dumbwaiter.worker", logging.INFO, __file__, 1, "job %s ok", ("j1",), None
    )
    job.__dict__.update(event=logs.JOB_FINISHED, task="t", job_id="j1", outcome="succeeded")
    plain = logging.LogRecord("other", logging.WARNING, __file__, 1, 'say "%s"\n', ("hi",), None)
    a, b = orjson.loads(fmt.format(job)), orjson.loads(fmt.format(plain))
    assert set(a) == {"ts", "level", "logger", "event", "message", "pid", *logs.JOB_FIELDS}
    assert (a["event"], a["task"], a["job_id"], a["error_type"]) == (
        "job_finished",
        "t",
        "j1",
        None,
    )
    assert a["ts"].endswith("Z") and a["level"] == "INFO" and a["message"] == "job j1 ok"
    assert set(b) == {"ts", "level", "logger", "event", "message", "pid"}
    assert (b["event"], b["message"]) == ("log", 'say "hi"\n')
    try:
        raise ValueError("inside")
    except ValueError:
        import sys

        err = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    assert "ValueError: inside" in orjson.loads(fmt.format(err))["exc"]


async def test_worker_config_log_format_json(capsys: pytest.CaptureFixture[str]) -> None:
    """An embedded worker asked for JSON writes its lines to stderr as JSON
    while it runs, and leaves the logger as it found it."""
    app = _app()
    logger = logging.getLogger("dumbwaiter")
    before = (logger.level, logger.propagate, list(logger.handlers))
    job = await app.tasks["shop.send_welcome"].aenqueue(3)
    await drain(app, log_format="json")
    assert (logger.level, logger.propagate, list(logger.handlers)) == before
    lines = [orjson.loads(line) for line in capsys.readouterr().err.splitlines()]
    [done] = [j for j in lines if j["event"] == "job_finished"]
    assert (done["job_id"], done["outcome"], done["queue"]) == (job.id, "succeeded", "mail")
    with pytest.raises(ValueError, match="log_format must be one of text, json"):
        dw.WorkerConfig(log_format="xml")
