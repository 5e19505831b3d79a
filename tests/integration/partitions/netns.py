"""Test hosts in network namespaces, and the servers they reach.

``Network`` makes a Linux bridge with an address of its own (the
*gateway*: the servers of the test listen there, in the test's namespace)
and, per host, a network namespace joined to the bridge by a veth pair, with
its own address.  A host's processes run under ``ip netns exec``: they share
the file system with the test (logs) but reach the servers only through
their cable.  ``cut`` takes the bridge's end of that cable down, so the host
and the servers stop hearing each other with no reset or close on either
side (as when a switch port dies); ``heal`` brings it back.

Needs root and ``ip`` (iproute2); ``netns_available`` says why not.
"""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.conftest import IN_CI
from tests.waiting import wait_until


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["ip", *args], capture_output=True, check=check)


def netns_available() -> str | None:
    """None when namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    name = f"dwprobe{os.getpid()}"
    try:
        made = _ip("netns", "add", name, check=False)
    except FileNotFoundError:
        return "no ip command (iproute2)"
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.decode().strip()}"
    _ip("netns", "del", name, check=False)
    return None


def require_netns() -> None:
    """Skip where namespaces cannot be made; fail in CI."""
    why = netns_available()
    if why is None:
        return
    if IN_CI:
        pytest.fail(f"the partition tests need network namespaces in CI: {why}")
    pytest.skip(f"no network namespaces here: {why}")


class Network:
    """One bridge ``10.200.N.1/24`` and hosts ``10.200.N.2``, ``.3``, ...;
    every name carries ``N`` so two runs never meet: ``N`` is the first
    number, counting from the pid's, whose lock file this process could
    lock (two test processes, pytest-xdist workers or another checkout's
    run, may have pids equal modulo 200)."""

    def __init__(self) -> None:
        self.n, self._lock = _claim_number()
        self.bridge = f"dwbr{self.n}"
        self.gateway = f"10.200.{self.n}.1"
        self.hosts: dict[str, tuple[str, str, str]] = {}  # name -> netns, veth, address
        self._clear()
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def _clear(self) -> None:
        """Whatever an earlier run with this number left (it was killed: a
        live one would hold the number's lock)."""
        for line in _ip("netns", "list").stdout.decode().splitlines():
            ns = line.split()[0] if line.strip() else ""
            if ns.startswith(f"dwh{self.n}-"):
                _ip("netns", "del", ns, check=False)
        _ip("link", "del", self.bridge, check=False)

    def host(self, name: str) -> tuple[str, ...]:
        """Make host ``name``; returns the command prefix that runs a
        process there."""
        i = len(self.hosts) + 2
        ns, veth = f"dwh{self.n}-{name}", f"dwv{self.n}{name}"[:15]
        address = f"10.200.{self.n}.{i}"
        _ip("netns", "add", ns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", veth, "master", self.bridge)
        _ip("link", "set", veth, "up")
        _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        self.hosts[name] = (ns, veth, address)
        return ("ip", "netns", "exec", ns)

    def cut(self, name: str) -> None:
        _ip("link", "set", self.hosts[name][1], "down")

    def heal(self, name: str) -> None:
        _ip("link", "set", self.hosts[name][1], "up")

    def close(self) -> None:
        for ns, veth, _ in self.hosts.values():
            _ip("link", "del", veth, check=False)
            _ip("netns", "del", ns, check=False)
        self.hosts = {}
        _ip("link", "del", self.bridge, check=False)
        os.close(self._lock)  # frees the number


def _claim_number() -> tuple[int, int]:
    """A number in 20..219 and the descriptor of its lock (``flock``: the
    kernel drops it when the process dies, however it dies)."""
    start = os.getpid() % 200
    for i in range(200):
        n = (start + i) % 200 + 20
        fd = os.open(f"/tmp/dw-netns-{n}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return n, fd
    raise RuntimeError("every partition network number 20..219 is in use")


@contextmanager
def network() -> Iterator[Network]:
    require_netns()
    net = Network()
    try:
        yield net
    finally:
        net.close()


def _accepts(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1):
            return True
    except OSError:
        return False


def wait_port(address: str, port: int, what: str, timeout: float = 30.0) -> None:
    """Until ``address:port`` accepts connections (a server starting up in
    another process: nothing to wait on but its port)."""
    wait_until(lambda: _accepts(address, port), f"{what} to answer on {address}:{port}", timeout)
