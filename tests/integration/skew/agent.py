"""A test host: one process that makes the broker calls a test tells it to.

The clock-skew tests run it with its wall clock shifted (libfaketime, set by
``Host``), so what one host writes is judged by another exactly as it would
be between two machines whose clocks disagree.  It reads one JSON command a
line on stdin and answers one JSON line on stdout:

* ``enqueue`` ``n``, ``delay`` (seconds, by this host's clock) -> ``ids``
* ``fetch`` ``limit``, ``lease`` -> ``ids`` (this host holds them; no wait)
* ``extend`` ``lease`` -> ``lost`` (ids of held jobs whose lease was gone)
* ``retry`` ``delay`` -> ``ids`` (every held job, to run again after ``delay``)
* ``ack`` -> ``ids`` (every held job)
* ``rescue`` -> ``n``
* ``acquire`` ``name``, ``owner``, ``ttl`` -> ``token``; ``renew`` with
  ``token`` -> ``ok``
* ``state`` ``id`` -> ``state``, ``worker``
* ``time`` -> ``time`` (this host's wall clock)

Run as ``python -m tests.integration.skew.agent URL WORKER-ID``.
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dumbwaiter.brokers import from_url
from dumbwaiter.brokers.base import Broker
from dumbwaiter.brokers.types import Delivery
from dumbwaiter.message import TASK, Message, uuid7
from tests.conftest import IN_CI

ROOT = Path(__file__).resolve().parents[3]
QUEUE = "default"


class Agent:
    def __init__(self, broker: Broker, worker: str) -> None:
        self.broker = broker
        self.worker = worker
        self.held: list[Delivery] = []

    async def enqueue(self, n: int = 1, delay: float = 0.0) -> dict[str, Any]:
        eta = time.time() + delay if delay else None
        msgs = [
            Message(
                id=uuid7(),
                kind=TASK,
                name="agent.job",
                queue=QUEUE,
                args=[],
                created_at=time.time(),
                eta=eta,
                max_attempts=10,
            )
            for _ in range(n)
        ]
        return {"ids": await self.broker.enqueue(msgs)}

    async def fetch(self, limit: int = 1, lease: float = 10.0) -> dict[str, Any]:
        ds = await self.broker.fetch([QUEUE], limit, lease, 0, self.worker)
        self.held += ds
        return {"ids": [d.id for d in ds]}

    async def extend(self, lease: float = 10.0) -> dict[str, Any]:
        return {"lost": [d.id for d in await self.broker.extend(self.held, lease)]}

    async def retry(self, delay: float = 1.0) -> dict[str, Any]:
        held, self.held = self.held, []
        for d in held:
            d.retry_at = time.time() + delay
        await self.broker.retry(held)
        return {"ids": [d.id for d in held]}

    async def ack(self) -> dict[str, Any]:
        held, self.held = self.held, []
        await self.broker.ack(held)
        return {"ids": [d.id for d in held]}

    async def rescue(self) -> dict[str, Any]:
        return {"n": int(await self.broker.rescue())}

    async def acquire(self, name: str, owner: str, ttl: float) -> dict[str, Any]:
        return {"token": await self.broker.acquire(name, owner, ttl)}

    async def renew(self, name: str, owner: str, token: int, ttl: float) -> dict[str, Any]:
        return {"ok": await self.broker.renew(name, owner, token, ttl)}

    async def state(self, id: str) -> dict[str, Any]:
        info = await self.broker.get(id)
        if info is None:
            return {"state": None, "worker": None}
        return {"state": str(info.state), "worker": info.worker}

    async def time(self) -> dict[str, Any]:
        return {"time": time.time()}


async def serve(url: str, worker: str) -> None:
    broker = from_url(url)
    await broker.open()
    agent = Agent(broker, worker)
    loop = asyncio.get_running_loop()
    print(json.dumps({"ready": worker}), flush=True)
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        cmd = json.loads(line)
        op = cmd.pop("op")
        try:
            out = await getattr(agent, op)(**cmd)
        except Exception as exc:
            out = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(out), flush=True)
    await broker.close()


# -- the test side ---------------------------------------------------------------


def faketime_library() -> str:
    """Debian's libfaketime (package ``faketime``; .ci/run installs it): a
    skewed host's wall clock without touching anyone else's.  Skips where it
    is missing, and fails in CI."""
    found = glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
    if found:
        return found[0]
    if IN_CI:
        pytest.fail("libfaketime is missing: .ci/run installs Debian's faketime package")
    pytest.skip("libfaketime is missing (apt-get install faketime)")


class Host:
    """An agent process; ``offset`` seconds added to its wall clock (its
    monotonic clock is left alone, as NTP leaves it)."""

    def __init__(self, url: str, worker: str, offset: float = 0.0) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
        if offset:
            env["LD_PRELOAD"] = faketime_library()
            env["FAKETIME"] = f"{offset:+g}s"
            env["FAKETIME_DONT_FAKE_MONOTONIC"] = "1"
        self.worker = worker
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.skew.agent", url, worker],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._read(60.0)  # {"ready": ...}: connected

    def _read(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise AssertionError(f"host {self.worker} did not answer in {timeout} s")
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"host {self.worker} exited ({self.proc.wait()})")
        out: dict[str, Any] = json.loads(line)
        return out

    def call(self, op: str, timeout: float = 60.0, **kw: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **kw}).encode() + b"\n")
        self.proc.stdin.flush()
        out = self._read(timeout)
        if "error" in out:
            raise AssertionError(f"host {self.worker}: {op} failed: {out['error']}")
        return out

    def kill(self) -> None:
        """SIGKILL: a host that dies holding what it holds."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._unpipe()

    def close(self) -> None:
        """End of input: the host closes its broker and exits."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._unpipe()

    def _unpipe(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None and not pipe.closed:
                pipe.close()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], sys.argv[2]))
