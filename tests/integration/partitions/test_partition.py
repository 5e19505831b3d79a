"""A worker host cut off from the broker mid-run, then back.

Two worker hosts (``dumbwaiter worker --with-scheduler``, each in a network
namespace of its own, ``netns.py``) share a broker server the test starts on
the bridge's address.  Host ``a`` starts first, so it leads the scheduler.
Jobs take a second each; while ``a`` has some in flight, its cable is cut
(no reset, no close: its connections just stop hearing back).  Then:

* every job ``a`` had in flight runs on ``b`` once its lease (``LEASE``)
  ran out;
* the scheduler's ticks go on from ``b`` once the lock ran out, and no tick
  is enqueued twice (a tick job in flight on ``a`` runs again on ``b``, as
  any job);
* when ``a`` comes back, what it finished while cut off (its late
  acknowledgements and results) is fenced: every job is recorded once, by
  the run whose lease was live (``b``'s result stays), and no job's state
  moves back.

The seconds from the cut until ``a``'s jobs ran elsewhere and until a tick
came from ``b`` are printed (``-s``): docs/deploying.md quotes them.  On
Redis, PostgreSQL and NATS; RabbitMQ runs too, marked as the known failure
``RABBITMQ_SLOW_RETURN`` says.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import dumbwaiter as dw
from dumbwaiter.state import State
from tests.integration.partitions.netns import Network, network
from tests.integration.partitions.servers import SERVERS
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]
APP = "tests.integration.partitions.partapp:app"
pytestmark = pytest.mark.crash

#: the workers' job lease and heartbeat (seconds)
LEASE = 3.0
JOBS = 24
#: jobs enqueued after the heal, for ``a`` to show it works again; enqueued
#: again whenever ``b`` has started all of them (``b`` alone runs 16 in 4 s:
#: a host that takes a few seconds to learn its old connection is dead must
#: still find work to show it is back)
MORE = 16


class Log:
    """The lines ``partapp`` appends: starts, finishes and ticks."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def rows(self) -> list[list[str]]:
        if not self.path.exists():
            return []
        return [line.split() for line in self.path.read_text().splitlines()]

    def started(self, host: str) -> set[str]:
        return {r[1] for r in self.rows() if r[0] == "start" and r[2] == host}

    def done(self, host: str) -> set[str]:
        return {r[1] for r in self.rows() if r[0] == "done" and r[2] == host}

    def ticks(self) -> list[tuple[str, int]]:
        """(tick key, pid of the scheduler replica that enqueued it) per run."""
        return [(r[1], int(r[3].split(":")[-2])) for r in self.rows() if r[0] == "tick"]

    def fires(self) -> dict[str, set[str]]:
        """Tick key -> the ids of the jobs enqueued for it (a tick job in
        flight on the cut-off host runs again on the other, as any job:
        one fire, two runs)."""
        out: dict[str, set[str]] = {}
        for r in self.rows():
            if r[0] == "tick":
                out.setdefault(r[1], set()).add(r[4])
        return out


@contextmanager
def hosts(url: str, log: Log, dir: Path) -> Iterator[Callable[[str, Network], int]]:
    """Start ``dumbwaiter worker`` on a host (returns its pid: ``ip netns
    exec`` becomes the worker); every one still running at the end is
    killed."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, net: Network) -> int:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
            "DW_PART_URL": url,
            "DW_PART_LOG": str(log.path),
            "DW_PART_HOST": name,
        }
        env.pop("DUMBWAITER_APP", None)
        cmd = [
            *net.host(name), sys.executable, "-m", "dumbwaiter", "worker", "--app", APP,
            "-q", "part,ticks", "-c", "4", "--lease", str(LEASE), "--heartbeat", "1",
            "--grace", "0", "--with-scheduler",
        ]  # fmt: skip
        with (dir / f"worker-{name}.log").open("ab") as out:
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=out))
        return procs[-1].pid

    try:
        yield start
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.wait(timeout=10)


def _records(url: str, ids: list[str]) -> dict[str, tuple[str, object]]:
    """Each job's state and the host its recorded result names."""

    async def go() -> dict[str, tuple[str, object]]:
        app = dw.App(url)
        try:
            out = {}
            for i in ids:
                info = await app.broker.get(i)
                assert info is not None, f"job {i} is gone"
                out[i] = (str(info.state), info.outcome().get("value"))
            return out
        finally:
            await app.broker.close()

    return asyncio.run(go())


def _all_succeed(url: str, ids: list[str], what: str) -> None:
    wait_until(
        lambda: all(s == "succeeded" for s, _ in _records(url, ids).values()), what, timeout=60
    )


def _succeeded(url: str) -> int:
    async def go() -> int:
        app = dw.App(url)
        try:
            return sum(s.succeeded for s in await app.broker.stats() if s.queue == "part")
        finally:
            await app.broker.close()

    return asyncio.run(go())


def _enqueue(url: str, n: int) -> list[str]:
    app = dw.App(url)

    @app.task(name="part.work", queue="part")
    def work(n: int) -> str:  # the workers' task, as a producer sees it
        raise NotImplementedError

    try:
        return [work.enqueue(i).id for i in range(n)]
    finally:
        app.close()


#: RabbitMQ (with a Redis state store) failed this test two ways (of three
#: runs, one each, and one pass; docs/deploying.md).  A late ack of the
#: cut-off host overwrote the record of the run that replaced it: fenced
#: since (the ack writes only where the record still holds its lease,
#: ``ledger.still_held``; tests/integration/rabbitmq/test_engine.py's
#: ``test_an_ack_held_up_past_its_lease_leaves_the_next_runs_record_alone``).
#: Left: the host may not run jobs again for long after the heal (its
#: connection is not known dead before RabbitMQ's 60 s heartbeat).
RABBITMQ_SLOW_RETURN = pytest.mark.xfail(
    reason="rabbitmq: a cut-off worker may run nothing for long after the heal (docs/deploying.md)",
    strict=False,
)


@pytest.mark.parametrize(
    "broker",
    [
        "redis",
        "postgres",
        "nats",
        pytest.param("rabbitmq", marks=RABBITMQ_SLOW_RETURN),
    ],
)
def test_a_cut_off_worker_host_is_replaced_and_fenced_when_it_returns(
    broker: str, tmp_path: Path
) -> None:
    log = Log(tmp_path / "part.log")
    with network() as net:
        url, stop_server = SERVERS[broker](net.gateway, tmp_path)
        try:
            with hosts(url, log, tmp_path) as start:
                a = start("a", net)
                wait_until(lambda: any(by == a for _, by in log.ticks()), "a to lead the ticks")
                b = start("b", net)
                ids = _enqueue(url, JOBS)

                def in_flight() -> set[str]:
                    return log.started("a") - log.done("a")

                wait_until(
                    lambda: in_flight() and log.started("b"), "both hosts to run jobs", timeout=60
                )
                held = in_flight()
                net.cut("a")
                cut = time.monotonic()
                ticks_before = len(log.ticks())

                wait_until(
                    lambda: held <= log.started("b"),
                    f"b to run the {len(held)} job(s) a held",
                    timeout=LEASE + 30,
                )
                rerun_after = time.monotonic() - cut
                wait_until(
                    lambda: any(by == b for _, by in log.ticks()[ticks_before:]),
                    "b's scheduler to take over the ticks",
                    timeout=60,
                )
                ticks_after = time.monotonic() - cut
                _all_succeed(url, ids, "every job to succeed")
                assert held <= log.done("a"), "a finished its jobs while cut off"
                before = _records(url, ids)
                assert all(before[i][1] == "b" for i in held)  # b's runs are the record

                net.heal("a")
                healed = time.monotonic()
                more: list[str] = []

                def a_runs_again() -> bool:
                    if set(more) & log.started("a"):
                        return True
                    if set(more) <= log.started("b"):  # none left for a to take
                        more.extend(_enqueue(url, MORE))
                    return False

                wait_until(a_runs_again, "a to run jobs again after the heal", timeout=30)
                back_after = time.monotonic() - healed
                _all_succeed(url, more, "the jobs after the heal to succeed")
                after = _records(url, ids)
                # the counters may trail the records by a write (NATS: a
                # worker's holder list, written again within WRITE_AGAIN when
                # a write met JetStream not ready after the heal); a count
                # past the jobs' is never right, so the wait stops there too
                counted: list[int] = []

                def all_counted() -> bool:
                    counted.append(_succeeded(url))
                    return counted[-1] >= JOBS + len(more)

                try:
                    wait_until(
                        all_counted, "the succeeded counters to reach the jobs run", timeout=15
                    )
                except AssertionError as exc:  # NATS, until fixed (docs/deploying.md): how far
                    raise AssertionError(
                        f"{exc}: counted {counted[0]} at first, {counted[-1]} at the end, "
                        f"of {JOBS} jobs and {len(more)} after the heal"
                    ) from None
                succeeded = counted[-1]
                fires = log.fires()
        finally:
            stop_server()

    assert after == before, "a late acknowledgement from a changed a job's record"
    assert all(s == str(State.SUCCEEDED) for s, _ in after.values())  # nothing moved back
    assert succeeded == JOBS + len(more), "a job counted twice (or not at all) in stats"
    twice = {k: ids for k, ids in fires.items() if len(ids) > 1}
    assert not twice, f"ticks enqueued more than once: {twice}"
    print(
        f"\n{broker}: a's {len(held)} job(s) ran on b {rerun_after:.1f} s after the cut"
        f" (lease {LEASE:g} s); ticks from b {ticks_after:.1f} s after it; a ran jobs"
        f" again {back_after:.1f} s after the heal (cut {healed - cut:.1f} s)"
    )
