"""The per-loop client registry every engine uses (brokers/perloop.py)."""

from __future__ import annotations

import asyncio
import threading

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
