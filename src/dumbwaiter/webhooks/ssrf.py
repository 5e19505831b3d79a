"""The SSRF guard: webhooks go to the public internet, never inside.

Endpoint URLs come from users, so a URL pointing at ``127.0.0.1:6379``, at
``10.0.0.5`` or at the cloud metadata service (``169.254.169.254``) would
make the workers attack their own network.  The guard refuses private,
loopback, link-local, multicast, reserved and unspecified addresses unless
the settings allow them (``allow_private=True``, or ``allow=[networks]``).

It checks the addresses a connection is really made to.  Checking a URL's
host name first and then letting the HTTP client resolve it again is open
to DNS rebinding: a name that resolved to a public address for the check
resolves to ``127.0.0.1`` a millisecond later for the connection.  So the
check sits inside the connection itself: ``GuardedBackend`` is the httpcore
network backend of the webhooks' client; asked to connect to a host, it
resolves the name once, checks *every* address it got (one bad address
refuses the host), and connects to those checked addresses only.  The URL
is untouched, so the ``Host`` header, TLS SNI and certificate check all use
the real host name, and pooled connections are keyed by it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpcore
import httpx

from ..errors import ConfigurationError, DumbwaiterError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class UnsafeTarget(DumbwaiterError):
    """An endpoint's host resolves to an address the SSRF guard refuses."""


@dataclass(frozen=True, slots=True)
class AddressPolicy:
    """Which resolved addresses deliveries may connect to."""

    allow_private: bool = False
    #: networks allowed even though they are not public (``"10.1.2.0/24"``)
    allow: tuple[IPNetwork, ...] = field(default=())

    @classmethod
    def make(cls, allow_private: bool = False, allow: Iterable[str] = ()) -> AddressPolicy:
        nets = []
        if isinstance(allow, str):
            raise ConfigurationError(f"allow= takes a list of networks, got the string {allow!r}")
        for a in allow:
            try:
                nets.append(ipaddress.ip_network(a, strict=False))
            except ValueError:
                raise ConfigurationError(
                    f"allow= entry {a!r} is not an IP address or network (e.g. '10.1.0.0/16')"
                ) from None
        return cls(allow_private=bool(allow_private), allow=tuple(nets))

    def refused(self, address: str) -> str | None:
        """Why ``address`` may not be connected to, or None when it may."""
        try:
            ip: IPAddress = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return f"{address!r} is not an IP address"
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
        if self.allow_private or any(ip in n for n in self.allow):
            return None
        kind = _kind(ip)
        return None if kind is None else f"{ip} is a {kind} address"


def _kind(ip: IPAddress) -> str | None:
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_reserved:
        return "reserved"
    if ip.is_private:
        return "private"
    if not ip.is_global:
        return "non-public"
    return None


async def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (an IP literal resolves to itself)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


async def checked_addresses(host: str, port: int, policy: AddressPolicy) -> list[str]:
    """``host``'s addresses, every one of them allowed by ``policy``; else
    ``UnsafeTarget`` naming the address refused."""
    try:
        addresses = await resolve(host, port)
    except socket.gaierror as exc:
        raise httpcore.ConnectError(f"cannot resolve {host!r}: {exc}") from None
    for a in addresses:
        why = policy.refused(a)
        if why is not None:
            raise UnsafeTarget(
                f"refused to connect to {host!r}: {why} (webhooks go to public addresses; "
                "allow it with app.webhooks.configure(allow_private=True) or allow=[network])"
            )
    if not addresses:
        raise httpcore.ConnectError(f"{host!r} resolved to no address")
    return addresses


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend, connecting only to checked addresses."""

    def __init__(self, policy: AddressPolicy, inner: httpcore.AsyncNetworkBackend | None = None):
        self.policy = policy
        self.inner = inner if inner is not None else httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        addresses = await checked_addresses(host, port, self.policy)
        last: Exception | None = None
        for a in addresses:  # the checked addresses, in the resolver's order
            try:
                return await self.inner.connect_tcp(
                    a, port, timeout=timeout, local_address=local_address,
                    socket_options=socket_options,
                )  # fmt: skip
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
        assert last is not None
        raise last

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        raise UnsafeTarget("webhooks never connect to a unix socket")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


#: httpcore's exceptions, as the httpx ones a caller of httpx expects
_MAPPED: dict[type[Exception], type[httpx.TransportError]] = {
    httpcore.ConnectTimeout: httpx.ConnectTimeout,
    httpcore.ReadTimeout: httpx.ReadTimeout,
    httpcore.WriteTimeout: httpx.WriteTimeout,
    httpcore.PoolTimeout: httpx.PoolTimeout,
    httpcore.ConnectError: httpx.ConnectError,
    httpcore.ReadError: httpx.ReadError,
    httpcore.WriteError: httpx.WriteError,
    httpcore.RemoteProtocolError: httpx.RemoteProtocolError,
    httpcore.LocalProtocolError: httpx.LocalProtocolError,
    httpcore.UnsupportedProtocol: httpx.UnsupportedProtocol,
    httpcore.ProxyError: httpx.ProxyError,
    httpcore.TimeoutException: httpx.TimeoutException,
    httpcore.NetworkError: httpx.NetworkError,
    httpcore.ProtocolError: httpx.ProtocolError,
}


def _mapped(exc: Exception) -> Exception:
    for cls in type(exc).__mro__:
        target = _MAPPED.get(cls)
        if target is not None:
            return target(str(exc))
    return exc


class _Body(httpx.AsyncByteStream):
    def __init__(self, stream: Any, shard: _Shard) -> None:
        self._stream = stream
        self._shard: _Shard | None = shard

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for part in self._stream:
                yield part
        except httpcore.TimeoutException as exc:
            raise _mapped(exc) from exc
        except (httpcore.NetworkError, httpcore.ProtocolError) as exc:
            raise _mapped(exc) from exc

    async def aclose(self) -> None:
        try:
            if hasattr(self._stream, "aclose"):
                await self._stream.aclose()
        finally:
            if self._shard is not None:
                self._shard.inflight -= 1
                self._shard = None


#: connections of one shard of an origin's pool (see ``GuardedTransport``)
SHARD_SIZE = 16


class _Shard:
    __slots__ = ("inflight", "pool")

    def __init__(self, pool: httpcore.AsyncConnectionPool) -> None:
        self.pool = pool
        self.inflight = 0


class GuardedTransport(httpx.AsyncBaseTransport):
    """An httpx transport over httpcore pools whose connections go through
    ``GuardedBackend`` (httpx's own transport takes no network backend).
    Plain HTTP/1.1, no proxy (a proxy would connect for us, unchecked).

    One pool per origin (scheme, host, port), split into shards of
    ``SHARD_SIZE`` connections: httpcore's pool looks at every one of its
    connections on every request and every response, so one pool of all the
    worker's connections would make each delivery pay for every endpoint's
    idle connections.  A request goes to the origin's least busy shard; a
    new shard opens when all are full, up to ``max_connections`` per origin."""

    def __init__(
        self,
        policy: AddressPolicy,
        *,
        max_connections: int = 200,
        keepalive_expiry: float = 30.0,
    ) -> None:
        self._backend = GuardedBackend(policy)
        self._ssl = httpx.create_ssl_context()
        self._max = max(1, max_connections)
        self._keepalive = keepalive_expiry
        self._origins: dict[tuple[bytes, bytes, int | None], list[_Shard]] = {}

    def _shard(self, origin: tuple[bytes, bytes, int | None]) -> _Shard:
        shards = self._origins.setdefault(origin, [])
        best = min(shards, key=lambda s: s.inflight, default=None)
        room = self._max - SHARD_SIZE * len(shards)
        if best is None or (best.inflight >= SHARD_SIZE and room > 0):
            size = min(SHARD_SIZE, room) if shards else min(SHARD_SIZE, self._max)
            best = _Shard(
                httpcore.AsyncConnectionPool(
                    ssl_context=self._ssl,
                    max_connections=size,
                    max_keepalive_connections=size,
                    keepalive_expiry=self._keepalive,
                    network_backend=self._backend,
                )
            )
            shards.append(best)
        return best

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.AsyncByteStream)
        url = request.url
        req = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        shard = self._shard((url.raw_scheme, url.raw_host, url.port))
        shard.inflight += 1
        try:
            resp = await shard.pool.handle_async_request(req)
        except BaseException as exc:
            shard.inflight -= 1
            if isinstance(
                exc,
                httpcore.TimeoutException
                | httpcore.NetworkError
                | httpcore.ProtocolError
                | httpcore.UnsupportedProtocol,
            ):
                raise _mapped(exc) from exc
            raise
        return httpx.Response(
            status_code=resp.status,
            headers=resp.headers,
            stream=_Body(resp.stream, shard),
            extensions=resp.extensions,
        )

    async def aclose(self) -> None:
        shards = [s for group in self._origins.values() for s in group]
        self._origins.clear()
        for s in shards:
            await s.pool.aclose()
