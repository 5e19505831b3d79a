"""A failed workflow raises, from sync code, as the issue's user called it.

``dw.chain(...).enqueue().result(timeout=6)`` with step 2 dead raised
``ResultTimeout ... has not finished`` after waiting the whole timeout; it
must raise ``WorkflowFailed`` naming the dead step.  (Every broker, async:
tests/conformance/test_workflows.py.)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import dumbwaiter as dw
from dumbwaiter.testing import drain_sync


@pytest.fixture(params=["memory", "sqlite"])
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dw.App]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/wf.db"
    a = dw.App(url)
    yield a
    a.close()


def test_sync_result_of_a_chain_with_a_dead_step_raises_workflow_failed(app: dw.App) -> None:
    @app.task
    def fetch(order: str) -> str:
        return order

    @app.task(retry=dw.Retry.never())
    def charge(order: str) -> int:
        raise KeyError(order)

    @app.task
    def receipt(cents: int) -> str:
        return f"{cents} cents"

    wf = dw.chain(fetch.s("o-9"), charge.s(), receipt.s()).enqueue()
    drain_sync(app)
    with pytest.raises(dw.JobFailed) as raised:
        wf.result(timeout=6)
    e = raised.value
    assert isinstance(e, dw.WorkflowFailed)
    assert (e.step, e.task, e.error_type) == ("1", charge.name, "KeyError")
    assert f"step 1 ({charge.name}, job {e.job_id}) is dead: KeyError: 'o-9'" in str(e)
    assert wf.status() == dw.State.DEAD
    assert app.job(e.job_id).status() == dw.State.DEAD


def test_a_cancelled_step_means_the_workflow_cannot_finish(app: dw.App) -> None:
    """No worker sees a cancel: the waiter finds it by looking at the steps."""

    @app.task
    def prepare(n: int) -> int:
        return n

    wf = dw.chain(prepare.s(1), prepare.s()).enqueue()
    first = wf.steps()[0]["job"]
    assert app.job(first).cancel()
    with pytest.raises(dw.WorkflowFailed, match=f"step 0 .*{first}.* was cancelled") as raised:
        wf.result(timeout=30)
    assert (raised.value.step, raised.value.error_type) == ("0", None)
    assert wf.status() == dw.State.CANCELLED
