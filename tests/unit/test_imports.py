"""What a worker of tasks loads: every module is memory in every worker process."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_a_task_only_app_and_its_worker_do_not_load_pydantic() -> None:
    code = textwrap.dedent(
        """
        import sys
        import dumbwaiter as dw
        import dumbwaiter.cli.worker
        app = dw.App("memory://imports")

        @app.task
        def f(x: int) -> int:
            return x

        f.enqueue(1)
        assert "pydantic" not in sys.modules, "pydantic was imported"
        class Paid(dw.Event, type="order.paid", version=1):
            amount: int
        assert "pydantic" in sys.modules and issubclass(Paid, dw.Event)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
