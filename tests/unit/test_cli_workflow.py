"""``dumbwaiter jobs show`` shows a workflow's steps and their states."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
from click.testing import CliRunner

import dumbwaiter as dw
from dumbwaiter.cli import main
from dumbwaiter.testing import drain


def test_jobs_show_lists_the_workflow_steps(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/wf.db"
    app = dw.App(url, retry=dw.Retry.never())

    @app.task
    def first() -> int:
        return 1

    @app.task
    def second(x: int) -> int:
        raise ValueError("second step broke")

    @app.task
    def third(x: int) -> int:
        return x

    wf = dw.chain(first.s(), second.s(), third.s()).enqueue()
    asyncio.run(drain(app))
    steps = wf.steps()
    failed = steps[1]["job"]
    out = CliRunner().invoke(main, ["jobs", "show", failed, "--url", url, "--json"])
    assert out.exit_code == 0, out.output
    shown = orjson.loads(out.stdout)
    assert shown["workflow"]["id"] == wf.id
    assert [s["state"] for s in shown["workflow"]["steps"]] == ["succeeded", "dead", "pending"]
    text = CliRunner().invoke(main, ["jobs", "show", failed, "--url", url])
    assert f"Workflow {wf.id}" in text.stdout and "this job" in text.stdout
    app.close()
