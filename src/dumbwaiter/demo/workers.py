"""The demo's worker processes: the real ``dumbwaiter worker`` command, stopped
with SIGTERM like any deployment would stop it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import DIR_ENV, QUEUES


class WorkerProcesses:
    def __init__(self, directory: Path, count: int, concurrency: int) -> None:
        self.directory = directory
        self.count = count
        self.concurrency = concurrency
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []

    @property
    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "dumbwaiter",
            "worker",
            "--app",
            "dumbwaiter.demo:app",
            "-q",
            ",".join(QUEUES),
            "-c",
            str(self.concurrency),
            "--log-level",
            "WARNING",
            "--grace",
            "5",
        ]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def start(self) -> None:
        """Start the workers; each writes its log to ``worker-N.log`` in the directory."""
        env = dict(os.environ)
        env[DIR_ENV] = str(self.directory)
        env["PYTHONUNBUFFERED"] = "1"
        for i in range(self.count):
            log = self.directory / f"worker-{i + 1}.log"
            self.logs.append(log)
            with open(log, "wb") as out:
                self.procs.append(
                    subprocess.Popen(
                        self.command, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
                    )
                )

    def exited(self) -> str | None:
        """Why the first worker that is no longer running stopped, if one did."""
        for p in self.procs:
            code = p.poll()
            if code is not None:
                return f"worker pid {p.pid} exited with code {code}"
        return None

    async def stop(self, timeout: float) -> tuple[int, list[str]]:
        """SIGTERM the running workers and wait; kill those still running after
        ``timeout`` seconds.  Returns how many got SIGTERM, and the problems
        (a kill, a non-zero exit code)."""
        running = [p for p in self.procs if p.poll() is None]
        for p in running:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        problems = []
        for p in self.procs:
            try:
                code = await asyncio.to_thread(p.wait, max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                await asyncio.to_thread(p.wait)
                problems.append(f"worker pid {p.pid} still ran {timeout:g} s after SIGTERM: killed")
                continue
            if code != 0:
                problems.append(f"worker pid {p.pid} exited with code {code}")
        return len(running), problems

    def log_tails(self, lines: int = 15) -> list[tuple[Path, list[str]]]:
        """The last lines of each worker's log, without the dead-letter warnings
        the story expects."""
        out = []
        for log in self.logs:
            try:
                text = log.read_text(errors="replace")
            except OSError:
                continue
            tail = [line for line in text.splitlines() if " dead-lettered: " not in line][-lines:]
            if tail:
                out.append((log, tail))
        return out
