"""The event loop of the long-running commands: uvloop when installed."""

from __future__ import annotations

import asyncio

import pytest
from click.testing import CliRunner

from dumbwaiter.cli import main
from dumbwaiter.loop import loop_factory, loop_name, run


async def _kind() -> str:
    await asyncio.sleep(0)
    return loop_name()


def test_auto_runs_on_uvloop_where_it_is_installed() -> None:
    pytest.importorskip("uvloop", reason="uvloop does not build on this platform")
    assert run(_kind()) == "uvloop"
    assert run(_kind(), "uvloop") == "uvloop"


def test_asyncio_keeps_the_standard_loop() -> None:
    assert loop_factory("asyncio") is None
    assert run(_kind(), "asyncio") == "asyncio"


def test_the_loop_is_current_for_code_that_asks_for_it_by_thread() -> None:
    async def same() -> bool:
        return asyncio.get_event_loop() is asyncio.get_running_loop()

    assert run(same(), "auto")


def test_an_unknown_loop_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown event loop 'tokio'"):
        loop_factory("tokio")
    result = CliRunner().invoke(main, ["worker", "--loop", "tokio", "--app", "x:app"])
    assert result.exit_code == 2
    assert "tokio" in result.output


def test_long_running_commands_take_startup_objects_out_of_the_collector() -> None:
    import gc

    from dumbwaiter.cli.common import serve

    async def frozen() -> int:
        return gc.get_freeze_count()

    try:
        assert serve(frozen(), "asyncio") > 0
    finally:
        gc.unfreeze()
