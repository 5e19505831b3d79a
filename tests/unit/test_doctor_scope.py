"""``dumbwaiter doctor`` says where an app's processes may run (its broker's
``multi_host``), warns where a deployment looks multi-host and is not
(DW104), and where workers of several hosts share a single-host broker
(DW105)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
from click.testing import CliRunner

import dumbwaiter as dw
from dumbwaiter import doctor
from dumbwaiter.cli import main

AMQP = "amqp://guest:guest@127.0.0.1:5672/%2F?prefix=doc"
#: apps the CLI is pointed at (made without connecting: doctor --no-broker)
rabbit_on_sqlite = dw.App(f"{AMQP}&state=sqlite%3A%2F%2F%2F%2Fsrv%2Fstate.db")
rabbit_on_redis = dw.App(f"{AMQP}&state=redis%3A%2F%2F%3Apw%40cache%3A6379%2F0")


def dw104(app: dw.App) -> list[doctor.Finding]:
    return [f for f in doctor.check(app) if f.code == "DW104"]


def test_rabbitmq_on_a_local_state_store_is_a_single_host_warning() -> None:
    """The issue's deployment: RabbitMQ reaches every host, the SQLite state
    store does not.  It works on one machine; the doctor says so."""
    [f] = dw104(rabbit_on_sqlite)
    assert f.level == doctor.WARNING and f.subject == "broker amqp://"
    assert "single-host" in f.message and "sqlite:////srv/state.db" in f.message
    assert "state=postgresql://" in f.fix
    assert dw104(rabbit_on_redis) == []
    assert doctor.host_scope(rabbit_on_redis).startswith("multi-host")


def test_an_embedded_broker_is_a_note(tmp_path: Path) -> None:
    [f] = dw104(dw.App(f"sqlite:///{tmp_path}/jobs.db"))
    assert f.level == doctor.NOTE and "single-host" in f.message
    [f] = dw104(dw.App("memory://doctor-scope"))
    assert f.level == doctor.NOTE and "single-process" in f.message


def test_the_cli_shows_where_processes_may_run() -> None:
    runner = CliRunner()
    spec = "tests.unit.test_doctor_scope:rabbit_on_sqlite"
    r = runner.invoke(main, ["doctor", "--app", spec, "--no-broker"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("deployment: single-host") and "DW104 warning" in r.output
    r = runner.invoke(main, ["doctor", "--app", spec, "--no-broker", "--json"])
    body = orjson.loads(r.stdout)
    assert body["multi_host"] is False and body["scope"].startswith("single-host")
    spec = "tests.unit.test_doctor_scope:rabbit_on_redis"
    body = orjson.loads(
        runner.invoke(main, ["doctor", "--app", spec, "--no-broker", "--json"]).stdout
    )
    assert body["multi_host"] is True and "pw" not in body["scope"]
    assert "DW104" not in {f["code"] for f in body["findings"]}


def test_workers_of_several_hosts_on_a_single_host_broker_are_a_warning(tmp_path: Path) -> None:
    """A worker's default id starts with its host: two hosts on one SQLite
    file (a network share) is what DW105 names; ids given by hand are left
    out."""
    app = dw.App(f"sqlite:///{tmp_path}/jobs.db")

    async def dw105(*ids: str) -> list[doctor.Finding]:
        await app.broker.kv_delete(list(await app.broker.kv_scan(doctor.WORKER_KEY)))
        await app.broker.kv_set({doctor.WORKER_KEY + i: b"{}" for i in ids}, ttl=60)
        return [f for f in await doctor.check_broker(app, timeout=10) if f.code == "DW105"]

    async def go() -> None:
        try:
            assert await dw105("web-1:10:ab12", "web-1:11:cd34") == []
            assert await dw105("web-1:10:ab12", "by-hand") == []
            [f] = await dw105("web-1:10:ab12", "web-2:10:ef56")
            assert f.level == doctor.WARNING and "2 hosts (web-1, web-2)" in f.message
        finally:
            await app.aclose()

    asyncio.run(go())
