"""The pytest plugin, as a user's project meets it.

Each test writes a small project (an app module on a broker nobody can
reach, a conftest.py, test files) and runs pytest on it in a new process:
the fixtures must work there as docs/testing.md says, and the plugin must
load from the entry point pyproject.toml declares.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

import dumbwaiter

pytest_plugins = ["pytester"]

SRC = Path(dumbwaiter.__file__).resolve().parent.parent
PYPROJECT = SRC.parent / "pyproject.toml"

SHOP = """
    import dumbwaiter as dw

    # the user's real broker: nothing listens there, so any use of it fails
    app = dw.App("redis://127.0.0.1:9/0", retry=dw.Retry(attempts=2, backoff=3600))
    SENT: list[tuple[str, int]] = []


    class OrderPlaced(dw.Event, type="shop.order_placed", version=1):
        order: str
        cents: int


    @app.task(queue="mail", keep_result=True)
    def send_receipt(order: str, cents: int) -> str:
        SENT.append((order, cents))
        return f"receipt {order}"


    def checkout(order: str, cents: int) -> dw.Job[str]:
        job = send_receipt.enqueue(order, cents)
        app.publish(OrderPlaced(order=order, cents=cents), key=order)
        return job


    async def acheckout(order: str, cents: int) -> dw.Job[str]:
        job = await send_receipt.aenqueue(order, cents)
        await app.apublish(OrderPlaced(order=order, cents=cents), key=order)
        return job
"""

CONFTEST = """
    import pytest

    import shop


    @pytest.fixture
    def dw_app():
        return shop.app
"""

TESTS = """
    import pytest

    import dumbwaiter as dw
    import shop


    def test_what_checkout_sends_is_recorded(dw_testing):
        shop.checkout("o-1", 1200)
        [job] = dw_testing.enqueued(shop.send_receipt)
        assert (job.args, job.queue) == (["o-1", 1200], "mail")
        assert dw_testing.published(shop.OrderPlaced) == [shop.OrderPlaced(order="o-1", cents=1200)]
        assert shop.SENT == []


    def test_each_test_starts_empty(dw_testing):
        assert dw_testing.enqueued() == [] and dw_testing.published() == []


    def test_drain_runs_the_jobs(dw_testing):
        job = shop.checkout("o-2", 5)
        assert dw_testing.drain().counts["succeeded"] == 1
        assert shop.SENT[-1] == ("o-2", 5) and job.result() == "receipt o-2"


    async def test_async_checkout_and_adrain(dw_testing):
        job = await shop.acheckout("o-3", 7)
        await dw_testing.adrain()
        assert await job.aresult() == "receipt o-3"


    def test_eager_runs_inside_the_call(dw_eager):
        job = shop.checkout("o-4", 9)
        assert shop.SENT[-1] == ("o-4", 9)
        assert job.status() is dw.State.SUCCEEDED


    async def test_eager_async(dw_eager):
        await shop.acheckout("o-5", 11)
        assert shop.SENT[-1] == ("o-5", 11)


    def test_eager_checks_arguments_as_production_does(dw_eager):
        with pytest.raises(dw.SerializationError, match="argument 'cents'"):
            shop.send_receipt.enqueue("o-6", {1, 2})
        with pytest.raises(dw.InvalidArguments):
            shop.send_receipt.enqueue("o-6")


    def test_the_app_is_itself_again_after_the_fixtures():
        assert shop.app.url == "redis://127.0.0.1:9/0" and shop.app.eager is False
        assert [type(m).__name__ for m in shop.app.middleware.middleware] == []
"""


def _project(pytester: pytest.Pytester, *, override: bool = True) -> None:
    pytester.makepyfile(shop=textwrap.dedent(SHOP), test_shop=textwrap.dedent(TESTS))
    if override:
        pytester.makeconftest(textwrap.dedent(CONFTEST))
    pytester.makeini(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
        "filterwarnings = error\n"
    )


def _run(pytester: pytest.Pytester, *args: str, autoload: bool) -> pytest.RunResult:
    """pytest in a new process, importing the dumbwaiter under test."""
    path = [str(SRC), str(pytester.path), os.environ.get("PYTHONPATH", "")]
    pytester._monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in path if p))
    if autoload:
        pytester._monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
        return pytester.runpytest_subprocess(*args, timeout=100)
    # what loads is what -p names: the plugin as a module, and pytest-asyncio
    pytester._monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    return pytester.runpytest_subprocess(
        "-p", "dumbwaiter.pytest_plugin", "-p", "pytest_asyncio.plugin", *args, timeout=100
    )


def test_the_fixtures_test_a_users_own_app(pytester: pytest.Pytester) -> None:
    _project(pytester)
    result = _run(pytester, "-q", autoload=False)
    result.assert_outcomes(passed=8)


def test_the_default_dw_app_is_a_memory_app(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_inline=textwrap.dedent(
            """
            def test_register_and_run_eagerly(dw_app, dw_eager):
                assert dw_app.url == "memory://" and dw_eager.app is dw_app
                ran = []

                @dw_app.task(keep_result=True)
                def double(n: int) -> int:
                    ran.append(n)
                    return n * 2

                assert double.enqueue(21).result() == 42 and ran == [21]
                assert [m.args for m in dw_eager.enqueued(double)] == [[21]]
            """
        )
    )
    _run(pytester, "-q", autoload=False).assert_outcomes(passed=1)


def test_pytest_loads_the_plugin_from_the_declared_entry_point(
    pytester: pytest.Pytester,
) -> None:
    """The ``pytest11`` entry point of pyproject.toml, as an installed
    distribution declares it (a dist-info on the path), loads the fixtures
    without any ``-p``."""
    entry = tomllib.loads(PYPROJECT.read_text())["project"]["entry-points"]["pytest11"]
    assert entry == {"dumbwaiter": "dumbwaiter.pytest_plugin"}
    info = pytester.path / "dumbwaiter_entry_probe-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dumbwaiter-entry-probe\n")
    (info / "entry_points.txt").write_text(
        "[pytest11]\n" + "".join(f"{k} = {v}\n" for k, v in entry.items())
    )
    _project(pytester)
    result = _run(pytester, "-q", autoload=True)
    result.assert_outcomes(passed=8)
    # and it is named so users can turn it off
    off = _run(pytester, "-q", "-p", "no:dumbwaiter", autoload=True)
    assert "fixture 'dw_testing' not found" in off.stdout.str()


def test_loading_the_plugin_imports_no_optional_extra() -> None:
    code = (
        "import sys, dumbwaiter.pytest_plugin\n"
        "heavy = {'pydantic', 'redis', 'psycopg', 'aio_pika', 'nats', 'starlette',"
        " 'prometheus_client', 'opentelemetry', 'typing_extensions'}\n"
        "loaded = sorted(m for m in heavy if m in sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert out.returncode == 0, out.stderr
