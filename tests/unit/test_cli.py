"""The admin command line against a real SQLite database: stats, jobs, dlq, enqueue.

Each test gets its own database file under ``tmp_path``; the CLI reaches it
with ``--url`` or with ``--app tests.apps.cliapp:app`` (which reads
``$CLIAPP_URL``).  Setup talks to the broker directly: dead letters are made
by fetching jobs and dead-lettering them with a chosen error, so every
assertion is about what the CLI shows or changed, not about timing.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest
from click.testing import CliRunner, Result

import dumbwaiter as dw
from dumbwaiter.brokers.types import JobFilter, JobInfo
from dumbwaiter.cli import dlq as dlq_module
from dumbwaiter.cli import main
from dumbwaiter.cli.output import duration, parse_time
from dumbwaiter.message import ErrorRecord, dumps
from tests.apps import cliapp

T = TypeVar("T")

APP = "tests.apps.cliapp:app"
FAIL = "tests.apps.cliapp.fail"
ADD = "tests.apps.cliapp.add"
NOTIFY = "tests.apps.cliapp.notify"


@pytest.fixture
def url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    u = f"sqlite:///{tmp_path / 'jobs.db'}"
    monkeypatch.setenv(cliapp.URL_ENV, u)
    monkeypatch.delenv("DUMBWAITER_URL", raising=False)
    monkeypatch.delenv("DUMBWAITER_APP", raising=False)
    return u


def cli(url: str, *args: str, input: str | None = None) -> Result:
    """Run ``dumbwaiter ARGS --url URL`` in-process."""
    return CliRunner().invoke(main, [*args, "--url", url], input=input, catch_exceptions=False)


def cli_app(*args: str) -> Result:
    return CliRunner().invoke(main, [*args, "--app", APP], catch_exceptions=False)


def js(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return orjson.loads(result.stdout)


def with_app(fn: Callable[[dw.App], Awaitable[T]]) -> T:
    """Run ``fn`` against a fresh app on the test's database, closing it after."""

    async def go() -> T:
        app = cliapp.create_app()
        try:
            return await fn(app)
        finally:
            await app.broker.close()

    return asyncio.run(go())


def enqueue(task: str, *calls: Any, **options: Any) -> list[str]:
    async def go(app: dw.App) -> list[str]:
        t = app.tasks[task].options(**options)
        return [(await t.aenqueue(*c)).id for c in calls]

    return with_app(go)


def kill(
    n: int,
    *,
    queue: str = "default",
    error: str = "ValueError",
    message: str = "boom",
    traceback: str = 'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: boom',
) -> list[str]:
    """Enqueue ``n`` jobs of the failing task on ``queue`` and dead-letter them with
    one recorded error each; returns their ids, oldest first."""

    async def go(app: dw.App) -> list[str]:
        task = app.tasks[FAIL].options(queue=queue)
        ids = [(await task.aenqueue(i)).id for i in range(n)]
        fetched = await app.broker.fetch([queue], 1000, 30.0, 0)
        ds = [d for d in fetched if d.id in ids]
        assert len(ds) == n
        await app.broker.requeue([d for d in fetched if d.id not in ids])  # others stay ready
        for d in ds:
            d.error = ErrorRecord(
                time=time.time(),
                type=error,
                message=message,
                traceback=traceback,
                worker="w1",
                attempt=1,
            )
        await app.broker.dead(ds)
        return ids

    return with_app(go)


def get(job_id: str) -> JobInfo | None:
    return with_app(lambda app: app.broker.get(job_id))


def dead_ids() -> set[str]:
    async def go(app: dw.App) -> set[str]:
        page = await app.broker.list_jobs(JobFilter(state=dw.State.DEAD), None, 1000)
        return {i.message.id for i in page.items}

    return with_app(go)


# -- pure helpers ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0.0s"),
        (3.24, "3.2s"),
        (42.9, "42s"),
        (250, "4m10s"),
        (7500, "2h05m"),
        (273600, "3d04h"),
    ],
)
def test_duration_reads_like_a_person_would_say_it(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_parse_time_relative_and_iso() -> None:
    now = 1_700_000_000.0
    assert parse_time("30m", now) == now - 1800
    assert parse_time("2h", now) == now - 7200
    assert parse_time("1d", now) == now - 86400
    assert parse_time("1h30m ago", now) == now - 5400
    assert parse_time("2023-11-14T22:13:20Z") == 1_700_000_000.0
    assert parse_time("2023-11-14T22:13:20+00:00") == 1_700_000_000.0
    with pytest.raises(ValueError, match="neither a relative time"):
        parse_time("yesterday")


# -- stats -------------------------------------------------------------------------


def test_stats_counts_each_queue(url: str) -> None:
    enqueue(ADD, (1, 2), (3, 4))
    enqueue(NOTIFY, (7,), delay=3600)
    kill(1)
    with_app(lambda app: app.broker.pause("email"))

    rows = {r["queue"]: r for r in js(cli(url, "stats", "--json"))["queues"]}
    assert rows["default"]["ready"] == 2
    assert rows["default"]["dead"] == 1
    assert rows["default"]["lag"] >= 0
    assert rows["email"]["scheduled"] == 1
    assert rows["email"]["paused"] is True
    assert rows["default"]["paused"] is False

    out = cli(url, "stats")
    assert out.exit_code == 0
    lines = {line.split()[0]: line for line in out.stdout.splitlines() if line.strip()}
    # ready, scheduled, retrying, running, prefetched, dead, succeeded
    assert lines["default"].split()[1:8] == ["2", "0", "0", "0", "0", "1", "0"]
    assert lines["default"].split()[8].endswith("s")  # the lag, e.g. 0.1s
    assert "paused" in lines["email"]


def test_stats_tells_running_jobs_from_prefetched_ones(url: str) -> None:
    """Of 3 leased jobs, the worker's heartbeat says 2 wait in its buffer: 1
    running, 2 prefetched, in the table and in --json (the broker alone
    counted 3 running)."""
    enqueue(ADD, (1, 2), (3, 4), (5, 6), (7, 8))

    async def lease(app: dw.App) -> None:
        assert len(await app.broker.fetch(["default"], 3, 60.0, 0, "w1")) == 3
        record = {"id": "w1", "queues": ["default"], "prefetched": {"default": 2}}
        await app.broker.kv_set({"worker:w1": orjson.dumps(record)}, ttl=60)

    with_app(lease)
    [row] = js(cli(url, "stats", "--json"))["queues"]
    assert (row["ready"], row["running"], row["prefetched"]) == (1, 1, 2)
    out = cli(url, "stats").stdout
    header = next(line for line in out.splitlines() if "queue" in line).split()
    assert header[header.index("running") + 1] == "prefetched"
    line = next(line for line in out.splitlines() if line.split()[:1] == ["default"]).split()
    assert line[header.index("running")] == "1"
    assert line[header.index("prefetched")] == "2"


def test_stats_says_how_many_workers_a_queue_wants(url: str) -> None:
    """One worker of concurrency 2 whose jobs take 30 s holds 3 (2 running, 1
    buffered), 7 are ready: 3 busy slots + 3.5 slots to clear 7 x 30 s in
    60 s = 6.5 slots, 4 workers; with a 600 s target, 3.35 slots, 2 workers."""
    enqueue(ADD, *[(i, i) for i in range(10)])

    async def lease(app: dw.App) -> None:
        assert len(await app.broker.fetch(["default"], 3, 60.0, 0, "w1")) == 3
        record = {
            "id": "w1",
            "queues": ["default"],
            "concurrency": 2,
            "prefetched": {"default": 1},
            "job_seconds": {"default": 30.0},
        }
        await app.broker.kv_set({"worker:w1": orjson.dumps(record)}, ttl=60)

    with_app(lease)
    [row] = js(cli(url, "stats", "--json"))["queues"]
    assert (row["ready"], row["running"], row["prefetched"]) == (7, 2, 1)
    assert (row["workers"], row["desired_workers"]) == (1, 4)
    assert row["backlog_per_worker"] == 10
    assert row["job_seconds"] == 30.0 and row["drain_rate"] == pytest.approx(2 / 30)
    [row] = js(cli(url, "stats", "--json", "--drain-target", "600"))["queues"]
    assert row["desired_workers"] == 2
    out = cli(url, "stats").stdout
    header = next(line for line in out.splitlines() if "queue" in line).split()
    line = next(line for line in out.splitlines() if line.split()[:1] == ["default"]).split()
    assert line[header.index("workers")] == "1"
    assert line[header.index("want")] == "4"


def test_health_passes_on_a_fresh_heartbeat_of_this_host_only(url: str) -> None:
    """``dumbwaiter health``: a worker of this host (the id starts with the
    hostname) that heartbeated within --max-age passes; a stale one, one of
    another host, or none fails with exit 1 and says why."""
    host = socket.gethostname()
    assert cli(url, "health").exit_code == 1  # no worker at all
    assert "no live worker on" in cli(url, "health").output

    async def announce(app: dw.App, id: str, age: float) -> None:
        record = {"id": id, "queues": ["default"], "heartbeat_at": time.time() - age}
        await app.broker.kv_set({f"worker:{id}": orjson.dumps(record)}, ttl=60)

    with_app(lambda app: announce(app, f"{host}:1:aa", 40.0))
    with_app(lambda app: announce(app, "elsewhere:2:bb", 0.0))
    stale = cli(url, "health")
    assert stale.exit_code == 1 and "within 20 s" in stale.output and f"{host}:1:aa" in stale.output
    assert cli(url, "health", "--host", "elsewhere").exit_code == 0
    assert cli(url, "health", "--max-age", "60").exit_code == 0
    with_app(lambda app: announce(app, f"{host}:3:cc", 0.5))
    ok = js(cli(url, "health", "--json"))
    assert ok["healthy"] is True and ok["host"] == host
    assert set(ok["workers"]) == {f"{host}:1:aa", f"{host}:3:cc"}


def test_stats_on_an_empty_broker(url: str) -> None:
    assert js(cli(url, "stats", "--json")) == {"queues": []}
    assert "no queues" in cli(url, "stats").stdout


# -- jobs --------------------------------------------------------------------------


def test_jobs_ls_pages_newest_first(url: str) -> None:
    ids = enqueue(ADD, *[(i, i) for i in range(5)])
    seen: list[str] = []
    cursor: str | None = None
    for expected in (2, 2, 1):
        args = ["jobs", "ls", "--limit", "2", "--json"]
        if cursor is not None:
            args += ["--cursor", cursor]
        page = js(cli(url, *args))
        assert len(page["items"]) == expected
        seen += [item["id"] for item in page["items"]]
        cursor = page["cursor"]
    assert cursor is None
    assert seen == ids[::-1]

    table = cli(url, "jobs", "ls", "--limit", "2")
    assert table.exit_code == 0
    assert ids[4] in table.stdout and ids[2] not in table.stdout
    assert f"--cursor {ids[3]}" in table.stdout


def test_jobs_ls_filters(url: str) -> None:
    [ready] = enqueue(ADD, (1, 2))
    [later] = enqueue(NOTIFY, (1,), delay=3600)
    [dead] = kill(1)

    def listed(*args: str) -> list[str]:
        return [i["id"] for i in js(cli(url, "jobs", "ls", "--json", *args))["items"]]

    assert listed("--queue", "email") == [later]
    assert listed("--state", "scheduled") == [later]
    assert listed("--state", "dead") == [dead]
    assert listed("--task", ADD) == [ready]
    assert listed("--queue", "default", "--state", "ready") == [ready]
    assert "no jobs match" in cli(url, "jobs", "ls", "--queue", "nope").stdout
    bad = cli(url, "jobs", "ls", "--state", "asleep")
    assert bad.exit_code == 2 and "asleep" in bad.output


def test_jobs_ls_by_key_finds_old_jobs_exactly(url: str) -> None:
    """``--key`` is an exact search over every stored job, however old."""
    [old] = enqueue(ADD, (0, 0), key="order-42")
    enqueue(ADD, *[(i, i) for i in range(60)])
    enqueue(ADD, (1, 1), key="order-420")

    def listed(*args: str) -> list[str]:
        return [i["id"] for i in js(cli(url, "jobs", "ls", "--json", *args))["items"]]

    assert listed("--key", "order-42", "--limit", "5") == [old]
    assert listed("-k", "order-42", "--state", "ready", "--queue", "default") == [old]
    assert listed("--key", "order-4") == []
    assert "no jobs match" in cli(url, "jobs", "ls", "--key", "nope").stdout


def test_jobs_show_envelope_result_and_errors(url: str) -> None:
    [job] = enqueue(ADD, (2, 3), priority=7, key="sum:2+3")

    async def succeed(app: dw.App) -> None:
        [d] = await app.broker.fetch(["default"], 1, 30.0, 0, worker="w9")
        d.result = dumps({"value": 5})
        d.result_ttl = 60
        await app.broker.ack([d])

    with_app(succeed)
    shown = js(cli(url, "jobs", "show", job, "--json"))
    assert shown["id"] == job
    assert shown["args"] == [2, 3]
    assert shown["state"] == "succeeded"
    assert shown["priority"] == 7
    assert shown["key"] == "sum:2+3"
    assert shown["worker"] == "w9"
    assert shown["result"] == 5
    assert shown["replays"] == 0

    text = cli(url, "jobs", "show", job)
    assert text.exit_code == 0
    for expected in (job, ADD, "succeeded", "1 of 4", "sum:2+3", "[2,3]", "w9", "no errors"):
        assert expected in text.stdout
    assert any(line.split()[:2] == ["result", "5"] for line in text.stdout.splitlines())

    [dead] = kill(1, traceback="Traceback (most recent call last):\nValueError: boom at line 9")
    text = cli(url, "jobs", "show", dead)
    assert "Errors (1)" in text.stdout
    assert "boom at line 9" in text.stdout and "ValueError" in text.stdout


def test_jobs_show_says_how_long_the_attempt_took(url: str) -> None:
    """The worker keeps when a successful attempt started and finished, for
    every task (``add`` keeps its result, ``notify`` does not)."""
    from dumbwaiter.testing import drain

    [added] = enqueue(ADD, (2, 3))

    async def run(app: dw.App) -> str:
        job = await app.tasks[NOTIFY].aenqueue(7)
        await drain(app)
        return job.id

    notified = with_app(run)
    shown = js(cli(url, "jobs", "show", added, "--json"))
    assert shown["result"] == 5
    assert 0 < shown["started_at"] <= shown["finished_at"] <= time.time()
    shown = js(cli(url, "jobs", "show", notified, "--json"))
    assert "result" not in shown and "result_error" not in shown
    assert 0 < shown["started_at"] <= shown["finished_at"]
    text = cli(url, "jobs", "show", notified).stdout
    assert "took" in text and "result" not in text

    async def result(app: dw.App) -> object:
        return await app.job(notified).aresult(timeout=1)

    with pytest.raises(dw.ResultNotKept, match="does not keep results"):
        with_app(result)


def test_jobs_show_unknown_id_is_a_clear_error(url: str) -> None:
    result = cli(url, "jobs", "show", "no-such-id", "--json")
    assert result.exit_code == 1
    assert "no job no-such-id" in result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.output


def test_jobs_cancel_says_what_it_did_and_why_not(url: str) -> None:
    ready, later, running = enqueue(ADD, (1, 1), (2, 2), (3, 3))

    async def start_one(app: dw.App) -> str:
        ds = await app.broker.fetch(["default"], 3, 30.0, 0)
        # give back all but one, so exactly one job is running
        keep = next(d for d in ds if d.id == running)
        await app.broker.requeue([d for d in ds if d is not keep])
        return keep.id

    with_app(start_one)
    result = cli(url, "jobs", "cancel", ready, later, running, "missing")
    assert result.exit_code == 0
    assert f"cancelled {ready}" in result.stdout and f"cancelled {later}" in result.stdout
    # a running job is asked to stop: the request waits in the broker for its worker
    assert f"asked to stop {running}: it is running" in result.stdout
    assert "not cancelled missing: not found" in result.stderr
    for i in (ready, later):
        info = get(i)
        assert info is not None and info.state is dw.State.CANCELLED
    assert get(running).state is dw.State.RUNNING  # type: ignore[union-attr]

    async def requests(app: dw.App) -> dict[str, bytes]:
        return await app.broker.kv_scan("cancel:")

    assert list(with_app(requests)) == [f"cancel:{running}"]
    as_json = cli(url, "jobs", "cancel", running, "missing", "--json")
    assert as_json.exit_code == 0
    assert orjson.loads(as_json.stdout) == {
        "cancelled": [],
        "requested": [running],
        "not_cancelled": {"missing": "not found"},
    }

    again = cli(url, "jobs", "cancel", ready)
    assert again.exit_code == 1
    assert "already cancelled" in again.stderr
    [dead] = kill(1)
    finished = cli(url, "jobs", "cancel", dead)
    assert finished.exit_code == 1 and "already finished (dead)" in finished.stderr


# -- dlq ----------------------------------------------------------------------------


def test_dlq_ls_filters_by_queue_task_and_error_type(url: str) -> None:
    values = kill(2, error="ValueError")
    declined = kill(1, queue="email", error="myapp.errors.PaymentDeclined", message="card")
    enqueue(ADD, (1, 1))  # alive: never listed

    def listed(*args: str) -> set[str]:
        return {i["id"] for i in js(cli(url, "dlq", "ls", "--json", *args))["items"]}

    assert listed() == {*values, *declined}
    assert listed("--queue", "email") == set(declined)
    assert listed("--error", "PaymentDeclined") == set(declined)
    assert listed("--error", "myapp.errors.PaymentDeclined") == set(declined)
    # the worker records built-ins by bare name; the qualified name finds them too
    assert listed("--error", "builtins.ValueError") == set(values)
    assert listed("--task", FAIL, "--queue", "default") == set(values)
    assert listed(values[0]) == {values[0]}

    table = cli(url, "dlq", "ls")
    assert table.exit_code == 0
    assert "PaymentDeclined: card" in table.stdout
    assert all(i in table.stdout for i in (*values, *declined))


def test_short_task_names_work_wherever_a_task_is_taken(url: str) -> None:
    """``enqueue`` took ``add`` for ``tests.apps.cliapp.add`` but ``jobs ls -t``
    and ``dlq ls -t`` found nothing: every --task now expands a short name
    with the app, and refuses one that two tasks share."""
    dead = kill(2)
    [alive] = enqueue(ADD, (1, 1))

    def listed(*args: str) -> set[str]:
        return {i["id"] for i in js(cli_app(*args, "--json"))["items"]}

    assert listed("jobs", "ls", "-t", "add") == {alive}
    assert listed("jobs", "ls", "--task", "fail") == set(dead)
    assert listed("dlq", "ls", "-t", "fail") == set(dead)
    exported = cli_app("dlq", "export", "-t", "fail")
    assert sorted(orjson.loads(line)["id"] for line in exported.stdout.splitlines()) == dead
    assert "replayed 2 dead letters" in cli_app("dlq", "replay", "-t", "fail").stdout
    again = kill(1)
    assert "purged 1 dead letter" in cli_app("dlq", "purge", "-t", "fail", "--yes").stdout
    assert get(again[0]) is None

    for command in (["jobs", "ls"], ["dlq", "ls"], ["dlq", "purge", "--yes"]):
        ambiguous = cli_app(*command, "-t", "report")
        assert ambiguous.exit_code == 2, command
        assert (
            "task 'report' is ambiguous: billing.report, tests.apps.cliapp.report; "
            "give the full name" in ambiguous.stderr
        )
    # with only a URL there is no app to expand it: the listing says how to look
    bare = cli(url, "jobs", "ls", "-t", "add")
    assert "no jobs match (task names are matched in full" in bare.stdout
    assert "with --app a short name finds the app's task" in bare.stdout


def test_dlq_time_filters(url: str) -> None:
    [old] = kill(1)
    cut = datetime.fromtimestamp(time.time(), UTC).isoformat()
    [new] = kill(1)

    def listed(*args: str) -> set[str]:
        return {i["id"] for i in js(cli(url, "dlq", "ls", "--json", *args))["items"]}

    assert listed("--until", cut) == {old}
    assert listed("--since", cut) == {new}
    assert listed("--since", "1h") == {old, new}
    assert listed("--until", "1h") == set()

    bad = cli(url, "dlq", "ls", "--since", "last tuesday")
    assert bad.exit_code == 2
    assert "--since" in bad.stderr and "ISO 8601" in bad.stderr
    backwards = cli(url, "dlq", "replay", "--since", "1h", "--until", "2h")
    assert backwards.exit_code == 2 and "later than --until" in backwards.stderr


def test_dlq_show_puts_the_attempts_first(url: str) -> None:
    [dead] = kill(1, error="TimeoutError", message="took [bold]too[/] long", traceback="TB-LINE")
    text = cli(url, "dlq", "show", dead)
    assert text.exit_code == 0
    out = text.stdout
    assert out.index("Attempts (1)") < out.index("Envelope")
    for expected in ("TimeoutError", "took [bold]too[/] long", "w1", "TB-LINE", "attempt 1"):
        assert expected in out  # user text printed as written, never as markup
    shown = js(cli(url, "dlq", "show", dead, "--json"))
    assert shown["state"] == "dead"
    assert shown["errors"][0]["type"] == "TimeoutError"
    assert shown["errors"][0]["traceback"] == "TB-LINE"

    [alive] = enqueue(ADD, (1, 1))
    refused = cli(url, "dlq", "show", alive)
    assert refused.exit_code == 1
    assert "not a dead letter (it is ready)" in refused.stderr


def test_dlq_replay_makes_ready_and_keeps_errors(url: str) -> None:
    first, second = kill(2)
    result = cli(url, "dlq", "replay", first)
    assert result.exit_code == 0
    assert "replayed 1 dead letter" in result.stdout

    info = get(first)
    assert info is not None
    assert info.state is dw.State.READY
    assert info.replays == 1
    assert [e.message for e in info.message.errors] == ["boom"]
    assert get(second).state is dw.State.DEAD  # type: ignore[union-attr]

    # an id that is no dead letter is counted out, and said so
    again = cli(url, "dlq", "replay", first)
    assert again.exit_code == 0
    assert "replayed 0 dead letters" in again.stdout
    assert "1 of the 1 id given matched no dead letter" in again.stderr

    everything = cli(url, "dlq", "replay", "--all")
    assert "replayed 1 dead letter" in everything.stdout
    assert dead_ids() == set()


@pytest.mark.parametrize("verb", ["replay", "purge"])
def test_replay_and_purge_refuse_without_a_selection(url: str, verb: str) -> None:
    dead = set(kill(2))
    result = cli(url, "dlq", verb, "--yes") if verb == "purge" else cli(url, "dlq", verb)
    assert result.exit_code == 2
    assert f"refusing to {verb} every dead letter" in result.stderr
    assert "--all" in result.stderr
    assert dead_ids() == dead


def test_dlq_purge_deletes_only_what_the_filter_says(url: str) -> None:
    keep = kill(2, queue="default")
    gone = kill(2, queue="email")
    [alive] = enqueue(NOTIFY, (5,))  # in the same queue, but not dead

    result = cli(url, "dlq", "purge", "--queue", "email", "--yes")
    assert result.exit_code == 0
    assert "purged 2 dead letters" in result.stdout
    assert dead_ids() == set(keep)
    assert all(get(i) is None for i in gone)
    assert get(alive) is not None

    by_error = kill(1, error="KeyError")
    result = cli(url, "dlq", "purge", "--error", "KeyError", "--yes")
    assert "purged 1 dead letter" in result.stdout
    assert get(by_error[0]) is None and dead_ids() == set(keep)


def test_dlq_purge_without_a_terminal_needs_yes(url: str) -> None:
    """``dlq purge -e KeyError </dev/null`` deleted without --yes: with
    nobody to ask, a purge must say it is meant."""
    dead = set(kill(2, error="KeyError"))
    refused = cli(url, "dlq", "purge", "--error", "KeyError", input="")  # stdin: no terminal
    assert refused.exit_code == 2
    assert "refusing to purge dead letters without confirmation" in refused.stderr
    assert "stdin is not a terminal" in refused.stderr and "add --yes" in refused.stderr
    assert dead_ids() == dead
    done = cli(url, "dlq", "purge", "--error", "KeyError", "--yes", input="")
    assert done.exit_code == 0 and "purged 2 dead letters" in done.stdout
    assert dead_ids() == set()


def test_dlq_purge_asks_a_person_first(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dlq_module, "interactive", lambda: True)
    dead = kill(2)

    no = cli(url, "dlq", "purge", "--all", input="n\n")
    assert no.exit_code == 1
    assert "Delete 2 dead letters for good?" in no.output
    assert dead_ids() == set(dead)

    yes = cli(url, "dlq", "purge", "--all", input="y\n")
    assert yes.exit_code == 0
    assert "purged 2 dead letters" in yes.stdout
    assert dead_ids() == set()

    nothing = cli(url, "dlq", "purge", "--all")
    assert "nothing purged" in nothing.stdout


def test_dlq_export_writes_one_json_line_per_dead_letter(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dlq_module, "PAGE", 2)  # several pages, so paging is exercised
    dead = kill(5)
    email = kill(1, queue="email")
    enqueue(ADD, (1, 1))

    target = tmp_path / "dlq.jsonl"
    result = cli(url, "dlq", "export", "-o", str(target))
    assert result.exit_code == 0
    assert result.stdout == ""
    assert "exported 6 dead letters" in result.stderr
    lines = target.read_bytes().splitlines()
    assert len(lines) == 6
    rows = [orjson.loads(line) for line in lines]
    assert {r["id"] for r in rows} == {*dead, *email}
    for r in rows:
        assert r["state"] == "dead"
        assert r["errors"][0]["type"] == "ValueError"
        assert r["errors"][0]["traceback"].startswith("Traceback")
        assert r["name"] == FAIL and isinstance(r["args"], list)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]

    piped = cli(url, "dlq", "export", "--queue", "email")
    assert piped.exit_code == 0
    assert [orjson.loads(line)["id"] for line in piped.stdout.splitlines()] == email


# -- finding the app --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attr", "what"),
    [
        ("wipe_cache", "is a function, not a dumbwaiter App (--app calls nothing to find one)"),
        ("send_welcome", "is a Task, not a dumbwaiter App;"),
        ("Settings", "is the class Settings, not a dumbwaiter App"),
    ],
)
def test_app_that_names_no_app_is_refused_and_nothing_is_called(
    url: str, attr: str, what: str
) -> None:
    """``--app side:wipe_cache`` ran the user's function inside the CLI, and
    ``--app tasks:send_welcome`` gave a raw TypeError traceback."""
    from tests.apps import notapps

    spec = f"tests.apps.notapps:{attr}"
    result = CliRunner().invoke(main, ["stats", "--app", spec])
    assert result.exit_code == 2, result.output
    assert f"{spec} {what}" in result.stderr
    assert "point --app at the App, e.g. tests.apps.notapps:app" in result.stderr
    assert "Traceback" not in result.output and result.exception is not None
    assert notapps.CALLED == []
    assert CliRunner().invoke(main, ["stats", "--app", "tests.apps.notapps:app"]).exit_code == 0


@pytest.mark.parametrize(
    "command",
    [["worker"], ["scheduler"], ["doctor"], ["events", "ls"], ["events", "schema"]],
    ids=" ".join,
)
def test_commands_that_need_the_apps_code_do_not_offer_url(url: str, command: list[str]) -> None:
    """``worker --help`` offered ``--url ... when no --app is given``, and
    ``worker --url redis://...`` then said ``this command needs --app``: a
    worker without the app's code has no tasks to run.  Help and behaviour
    now agree: these commands take --app only, and say so."""
    helped = CliRunner().invoke(main, [*command, "--help"])
    assert helped.exit_code == 0 and "--app" in helped.stdout
    assert "--url" not in helped.stdout
    given = CliRunner().invoke(main, [*command, "--url", url])
    assert given.exit_code == 2
    assert "runs the app's code, which a broker URL does not have: give --app" in given.stderr
    bare = CliRunner().invoke(main, command, env={"DUMBWAITER_URL": url})
    assert bare.exit_code == 2 and "needs --app MODULE:ATTR" in bare.stderr


# -- enqueue ---------------------------------------------------------------------------


def test_enqueue_with_app_uses_the_task(url: str) -> None:
    result = cli_app("enqueue", "notify", "--args", "[7]", "--kwargs", '{"channel": "sms"}')
    assert result.exit_code == 0, result.output
    job_id = result.stdout.strip()
    info = get(job_id)
    assert info is not None
    m = info.message
    assert (m.name, m.queue, m.args, m.kwargs) == (NOTIFY, "email", [7], {"channel": "sms"})

    out = js(
        cli_app("enqueue", ADD, "--args", "[1, 2]", "--priority", "3", "--key", "k1", "--json")
    )
    info = get(out["id"])
    assert info is not None
    assert (info.message.priority, info.message.key) == (3, "k1")
    assert info.message.max_attempts == 4

    later = js(cli_app("enqueue", ADD, "--args", "[1, 2]", "--delay", "600", "--json"))
    assert get(later["id"]).state is dw.State.SCHEDULED  # type: ignore[union-attr]


def test_enqueue_with_app_checks_name_and_signature(url: str) -> None:
    unknown = cli_app("enqueue", "nope")
    assert unknown.exit_code == 2
    assert "no task 'nope'" in unknown.stderr
    assert ADD in unknown.stderr and FAIL in unknown.stderr

    wrong = cli_app("enqueue", ADD, "--args", "[1]")
    assert wrong.exit_code == 2
    assert "missing a required argument: 'b'" in wrong.stderr
    assert js(cli(url, "jobs", "ls", "--json"))["items"] == []


def test_enqueue_with_only_a_url_builds_the_message(url: str) -> None:
    out = js(cli(url, "enqueue", "elsewhere.task", "--args", '["x"]', "--json"))
    info = get(out["id"])
    assert info is not None
    m = info.message
    assert (m.kind, m.name, m.queue, m.args, m.max_attempts) == (
        "task",
        "elsewhere.task",
        "default",
        ["x"],
        4,
    )
    assert info.state is dw.State.READY

    plain = cli(url, "enqueue", "elsewhere.task", "--queue", "q2", "--delay", "60")
    info = get(plain.stdout.strip())
    assert info is not None
    assert info.message.queue == "q2" and info.state is dw.State.SCHEDULED


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--args", "[1,"], "not valid JSON"),
        (["--args", '{"a": 1}'], "must be a JSON array"),
        (["--kwargs", "[1]"], "must be a JSON object"),
        (["--args", "[NaN]"], "not valid JSON"),
        (["--args", "[1e400]"], "beyond a double's range"),
        # orjson would read these as floats; the API refuses the integers
        (["--args", "[18446744073709551616]"], "the integer 18446744073709551616 does not fit"),
        (["--kwargs", '{"n": -9223372036854775809}'], "does not fit in 64 bits"),
        (["--args", '["\\ud800"]'], "lone surrogate"),
    ],
)
def test_enqueue_bad_json_is_a_usage_error(url: str, args: Sequence[str], message: str) -> None:
    result = cli(url, "enqueue", "t", *args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert "Traceback" not in result.output
    assert js(cli(url, "jobs", "ls", "--json"))["items"] == []


def test_enqueue_refuses_what_the_api_refuses_with_its_error(url: str) -> None:
    """A number the API refuses (over 64 bits) is refused by the CLI with the
    API's own message, instead of reaching the task as a float."""
    with pytest.raises(dw.SerializationError) as api:
        with_app(lambda app: app.tasks[ADD].aenqueue(2**64, 1))
    result = cli_app("enqueue", ADD, "--args", "[18446744073709551616, 1]")
    assert result.exit_code == 2
    assert str(api.value) in result.stderr
    exact = js(cli(url, "enqueue", "elsewhere.task", "--args", "[18446744073709551615]", "--json"))
    info = get(exact["id"])
    assert info is not None and info.message.args == [2**64 - 1]  # the largest, exact
    assert len(js(cli(url, "jobs", "ls", "--json"))["items"]) == 1


# -- end to end with a real worker -----------------------------------------------------


def test_a_real_worker_dead_letter_shows_its_traceback(url: str) -> None:
    [job] = enqueue(FAIL, (3,))

    async def work(app: dw.App) -> None:
        w = dw.Worker(app, queues=("default",), concurrency=4)
        running = asyncio.create_task(w.run())
        while sum(s.dead for s in await app.broker.stats()) < 1:
            assert not running.done()
        w.stop()
        await running

    with_app(work)
    shown = cli(url, "dlq", "show", job)
    assert shown.exit_code == 0
    assert "ValueError" in shown.stdout and "boom 3" in shown.stdout
    assert 'raise ValueError(f"boom {n}")' in shown.stdout  # the task's own line


# -- queues ---------------------------------------------------------------------------


def test_queues_pause_and_resume(url: str) -> None:
    [job] = enqueue(ADD, (1, 2))

    async def fetchable(app: dw.App) -> list[str]:
        ds = await app.broker.fetch(["default"], 10, 30.0, 0)
        await app.broker.requeue(ds)
        return [d.id for d in ds]

    r = cli(url, "queues", "pause", "default")
    assert r.exit_code == 0 and r.stdout == "paused default\n"
    assert with_app(fetchable) == []  # no worker gets its jobs
    assert js(cli(url, "stats", "--json"))["queues"][0]["paused"] is True
    again = cli(url, "queues", "pause", "default", "--json")
    assert js(again) == {"queue": "default", "paused": True, "was_paused": True}
    assert js(cli(url, "queues", "resume", "default", "--json")) == {
        "queue": "default",
        "paused": False,
        "was_paused": True,
    }
    assert with_app(fetchable) == [job]
    assert cli(url, "queues", "resume", "default").stdout == "default was not paused\n"
    # a queue no job was ever stored in: done, with a note (a typo?)
    r = cli(url, "queues", "pause", "defualt")
    assert r.exit_code == 0 and "no job was ever stored in a queue named 'defualt'" in r.stderr
