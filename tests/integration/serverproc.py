"""A server process of a test's own (redis-server, nats-server): started on a
free loopback port with its data in the test's tmp dir, so a test may stop,
kill and restart it without touching the shared server everyone else uses.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """One server process on 127.0.0.1:``port``, data and log in ``dir``.

    Subclasses say how to start it (``command``), where it logs (``log``) and
    how to tell it answers (``answers``, on a fresh connection)."""

    name = "server"

    def __init__(self, dir: Path, port: int, *extra: str) -> None:
        self.dir = dir
        self.port = port
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.dir / f"{self.name}.log"

    def command(self) -> list[str]:
        raise NotImplementedError

    def answers(self, s: socket.socket) -> bool:
        raise NotImplementedError

    def start(self) -> None:
        self.proc = subprocess.Popen(self.command())
        self.wait_ready()

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Until the server answers (it may be loading its data first)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    if self.answers(s):
                        return
            except OSError:
                pass
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log.read_text()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} on port {self.port} did not start")
            time.sleep(0.02)  # a process starting up: nothing to wait on

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(sig)
        self.proc.wait(timeout=30)
        self.proc = None
