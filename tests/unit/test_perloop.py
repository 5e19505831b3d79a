"""The per-loop client registry every engine uses (brokers/perloop.py)."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from dumbwaiter.brokers import perloop
from dumbwaiter.brokers.perloop import PerLoop


class Client:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.closed_on: asyncio.AbstractEventLoop | None = None
        self.abandoned = False

    async def aclose(self) -> None:
        self.closed_on = asyncio.get_running_loop()


def _registry() -> PerLoop[Client]:
    return PerLoop(Client, Client.aclose, lambda c: setattr(c, "abandoned", True))


def test_one_client_per_loop_and_the_same_one_again() -> None:
    reg = _registry()

    async def twice() -> tuple[Client, Client]:
        return reg.get(), reg.get()

    a1, a2 = asyncio.run(twice())
    assert a1 is a2 and a1.loop is not None
    b1, _ = asyncio.run(twice())  # a new loop gets its own client ...
    assert b1 is not a1
    assert a1.abandoned  # ... and the closed loop's is let go, not awaited
    assert a1.closed_on is None
    assert len(reg) == 1


def test_close_awaits_this_loops_client_and_asks_other_running_loops() -> None:
    reg = _registry()
    other = asyncio.new_event_loop()
    made = threading.Event()
    theirs: list[Client] = []

    async def use() -> None:
        theirs.append(reg.get())
        made.set()

    t = threading.Thread(target=other.run_forever, daemon=True)
    t.start()
    asyncio.run_coroutine_threadsafe(use(), other).result(5)
    assert made.is_set()

    async def main() -> Client:
        mine = reg.get()
        await reg.close()
        return mine

    mine = asyncio.run(main())
    other.call_soon_threadsafe(other.stop)
    t.join(5)
    other.close()
    assert mine.closed_on is mine.loop  # closed on its own loop
    assert theirs[0].closed_on is other  # the other thread's loop closed its own
    assert len(reg) == 0


def test_close_abandons_clients_of_loops_that_do_not_run() -> None:
    reg = _registry()
    idle = asyncio.new_event_loop()

    async def use() -> Client:
        return reg.get()

    c = idle.run_until_complete(use())
    asyncio.run(reg.close())  # ``idle`` is not running: its client is abandoned
    idle.close()
    assert c.abandoned and c.closed_on is None


def test_current_makes_nothing() -> None:
    reg = _registry()

    async def peek() -> Client | None:
        return reg.current()

    assert asyncio.run(peek()) is None
    assert reg.current() is None  # no loop at all
    assert len(reg) == 0


def _on_another_loop(reg: PerLoop[Client]) -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    other = asyncio.new_event_loop()
    t = threading.Thread(target=other.run_forever, daemon=True)
    t.start()

    async def use() -> None:
        reg.get()

    asyncio.run_coroutine_threadsafe(use(), other).result(5)
    return other, t


def _stop(other: asyncio.AbstractEventLoop, t: threading.Thread) -> None:
    other.call_soon_threadsafe(other.stop)
    t.join(5)
    other.close()


def test_a_client_that_fails_to_close_on_its_loop_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken(c: Client) -> None:
        raise ConnectionError("the socket was gone")

    reg: PerLoop[Client] = PerLoop(Client, broken, lambda c: None)
    other, t = _on_another_loop(reg)
    with caplog.at_level(logging.ERROR, "dumbwaiter.broker"):
        asyncio.run(reg.close())  # returns: the failure is the other loop's
    _stop(other, t)
    [rec] = [r for r in caplog.records if "closing a client" in r.getMessage()]
    assert rec.exc_info is not None and isinstance(rec.exc_info[1], ConnectionError)
    assert len(reg) == 0


def test_close_stops_waiting_for_a_slow_loop_and_says_so(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(perloop, "CLOSE_ELSEWHERE", 0.05)
    release = asyncio.Event()  # waited for on the other loop only
    closed = threading.Event()

    async def slow(c: Client) -> None:
        await release.wait()
        closed.set()

    reg: PerLoop[Client] = PerLoop(Client, slow, lambda c: None)
    other, t = _on_another_loop(reg)
    with caplog.at_level(logging.WARNING, "dumbwaiter.broker"):
        asyncio.run(reg.close())
    other.call_soon_threadsafe(release.set)
    assert closed.wait(5)  # its own loop still closed it
    _stop(other, t)
    assert any("not closed after" in r.getMessage() for r in caplog.records)
