"""JetStream storage primitives over ``Wire``: reads, compare-and-set writes, scans.

A stream with one message per subject (``max_msgs_per_subject=1``) is a
key-value table whose versions are stream sequences, as in NATS KV:

* ``read`` is a direct get of the last message on a subject;
* ``put(..., expect=N)`` writes only if the subject's last sequence is still
  ``N`` (``Nats-Expected-Last-Subject-Sequence``; 0 = only if absent), so
  every read-modify-write is a compare-and-set whose new sequence is the
  fencing token of whoever won;
* ``delete`` removes one message by sequence: if a newer write replaced it
  meanwhile, nothing happens (the delete came first).

Scans read many messages: ``scan`` with a short-lived pull consumer (streams
with limits retention), ``walk`` with direct gets by sequence (the work
stream, where a consumer would take the messages away).
"""

from __future__ import annotations

import asyncio
import calendar
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import NamedTuple

import orjson

from ...errors import BrokerError
from .names import Subjects
from .protocol import (
    WRONG_LAST_SEQUENCE,
    JetStreamError,
    PubAck,
    Reply,
    header,
    headers,
    pub_ack,
)
from .wire import Wire

_NS_PER_S = 1_000_000_000


class Stored(NamedTuple):
    """One stored message as a direct get or a scan returns it."""

    seq: int
    subject: bytes
    hdr: bytes | None
    data: bytes

    @property
    def time(self) -> float:
        """When the server stored it (Unix seconds)."""
        raw = header(self.hdr, b"Nats-Time-Stamp")
        return parse_time(raw) if raw else 0.0

    def get(self, name: bytes) -> bytes | None:
        return header(self.hdr, name)


def parse_time(raw: bytes) -> float:
    """RFC 3339 with nanoseconds, as the server writes it, to Unix seconds."""
    s = raw.decode()
    date, _, rest = s.partition("T")
    y, mo, d = (int(x) for x in date.split("-"))
    frac = 0.0
    tz = 0
    if rest.endswith("Z"):
        rest = rest[:-1]
    elif "+" in rest or rest.count("-"):
        sign = 1 if "+" in rest else -1
        rest, off = rest.rsplit("+" if sign == 1 else "-", 1)
        hh, mm = off.split(":")
        tz = sign * (int(hh) * 3600 + int(mm) * 60)
    if "." in rest:
        rest, f = rest.split(".")
        frac = float("0." + f)
    h, mi, sec = (int(x) for x in rest.split(":"))
    return calendar.timegm((y, mo, d, h, mi, sec, 0, 0, 0)) + frac - tz


def stored(r: Reply) -> Stored | None:
    """A direct get's reply, or None for "no message" (404)."""
    status = r.status
    if status == 404:
        return None
    if status:
        raise BrokerError(f"NATS direct get failed with status {status}: {r.hdr!r}")
    seq = header(r.hdr, b"Nats-Sequence")
    subject = header(r.hdr, b"Nats-Subject") or b""
    return Stored(int(seq) if seq else 0, subject, r.hdr, r.data)


def cas_item(subject: bytes, data: bytes, expect: int) -> tuple[bytes, bytes, bytes]:
    """A compare-and-set write for ``Wire.batch``: only if ``subject``'s last
    sequence is still ``expect`` (0: only if it has no message)."""
    return subject, data, b"NATS/1.0\r\nNats-Expected-Last-Subject-Sequence: %d\r\n\r\n" % expect


def is_conflict(exc: BaseException) -> bool:
    return isinstance(exc, JetStreamError) and exc.err_code == WRONG_LAST_SEQUENCE


@dataclass(slots=True)
class Scanned:
    """A message a scan delivered, with its stream sequence."""

    seq: int
    subject: bytes
    hdr: bytes | None
    data: bytes
    time: float


class Store:
    def __init__(self, wire: Wire, names: Subjects) -> None:
        self.wire = wire
        self.n = names

    # -- single messages ---------------------------------------------------------------

    def read_req(self, stream: str, subject: bytes) -> asyncio.Future[Reply]:
        return self.wire.request(self.n.direct(stream, subject), b"")

    async def read(self, stream: str, subject: bytes) -> Stored | None:
        return stored(await self.wire.call(self.n.direct(stream, subject), b""))

    async def read_many(self, stream: str, subjects: list[bytes]) -> list[Stored | None]:
        if not subjects:
            return []
        futs = [self.read_req(stream, s) for s in subjects]
        out: list[Stored | None] = []
        for r in await self.wire.gather(futs):
            if isinstance(r, BaseException):
                raise r
            out.append(stored(r))
        return out

    def put_req(
        self,
        subject: bytes,
        data: bytes,
        expect: int | None = None,
        extra: tuple[tuple[bytes, bytes | str | int | float], ...] = (),
    ) -> asyncio.Future[Reply]:
        pairs = extra
        if expect is not None:
            pairs = ((b"Nats-Expected-Last-Subject-Sequence", expect), *pairs)
        return self.wire.request(subject, data, headers(*pairs) if pairs else None)

    async def put(
        self,
        subject: bytes,
        data: bytes,
        expect: int | None = None,
        extra: tuple[tuple[bytes, bytes | str | int | float], ...] = (),
    ) -> PubAck:
        fut = self.put_req(subject, data, expect, extra)
        await self.wire.flush()
        return pub_ack(await fut, subject.decode(errors="replace"))

    async def delete(self, stream: str, seq: int) -> bool:
        """Remove message ``seq`` (False if it is gone already)."""
        try:
            await self.wire.api(f"STREAM.MSG.DELETE.{stream}", {"seq": seq, "no_erase": True})
        except JetStreamError as exc:
            if exc.code == 404 or exc.err_code in (10037, 10057):  # no message found
                return False
            raise
        return True

    async def delete_many(self, stream: str, seqs: list[int]) -> int:
        if not seqs:
            return 0
        path = b"$JS.API.STREAM.MSG.DELETE." + stream.encode()
        futs = [self.wire.request(path, b'{"seq":%d,"no_erase":true}' % s) for s in seqs]
        n = 0
        for r in await self.wire.gather(futs):
            if isinstance(r, Reply) and b'"success":true' in r.data:
                n += 1
        return n

    async def cas(
        self,
        stream: str,
        subject: bytes,
        change: Callable[
            [Stored | None],
            Awaitable[tuple[bytes, tuple[tuple[bytes, bytes | str | int | float], ...]] | None],
        ],
        attempts: int = 200,
    ) -> PubAck | None:
        """Read-modify-write until it wins: ``change(current)`` returns the new
        (data, extra headers), or None to write nothing.  Returns the write's
        ack (None when nothing was written)."""
        delay = 0.001
        for _ in range(attempts):
            cur = await self.read(stream, subject)
            new = await change(cur)
            if new is None:
                return None
            data, extra = new
            try:
                return await self.put(subject, data, cur.seq if cur else 0, extra)
            except JetStreamError as exc:
                if not is_conflict(exc):
                    raise
            # lost the race: back off a little (jittered), read again
            await asyncio.sleep(delay * (0.5 + secrets.randbelow(1000) / 1000))
            delay = min(delay * 2, 0.05)
        raise BrokerError(f"NATS: {subject.decode(errors='replace')} kept changing; gave up")

    # -- many messages --------------------------------------------------------------

    async def subjects(self, stream: str, filter_subject: bytes) -> dict[bytes, int]:
        """Subjects of ``stream`` matching ``filter_subject``, with message counts."""
        d = await self.wire.api(
            f"STREAM.INFO.{stream}", {"subjects_filter": filter_subject.decode()}
        )
        subs = (d.get("state") or {}).get("subjects") or {}
        return {k.encode(): int(v) for k, v in subs.items()}

    async def walk(
        self, stream: str, filter_subject: bytes, start: int = 1, stop: int | None = None
    ) -> AsyncIterator[Stored]:
        """Messages matching ``filter_subject`` from sequence ``start`` on, one
        direct get each (safe on a work-queue stream: nothing is consumed)."""
        path = b"$JS.API.DIRECT.GET." + stream.encode()
        seq = start
        while stop is None or seq <= stop:
            r = await self.wire.call(
                path, orjson.dumps({"seq": seq, "next_by_subj": filter_subject.decode()})
            )
            m = stored(r)
            if m is None or (stop is not None and m.seq > stop):
                return
            yield m
            seq = m.seq + 1

    async def scan(
        self,
        stream: str,
        filter_subject: bytes,
        last_per_subject: bool = False,
        start_seq: int | None = None,
        start_time: float | None = None,
        limit: int | None = None,
        headers_only: bool = False,
    ) -> list[Scanned]:
        """Read matching messages with a short-lived pull consumer (limits
        retention only), oldest first; at most ``limit``."""
        cfg: dict[str, object] = {
            "ack_policy": "all",
            "filter_subject": filter_subject.decode(),
            "mem_storage": True,
            "num_replicas": 1,
            "inactive_threshold": 30 * _NS_PER_S,
            "max_ack_pending": -1,
            "headers_only": headers_only,
        }
        if last_per_subject:
            cfg["deliver_policy"] = "last_per_subject"
        elif start_seq is not None:
            cfg["deliver_policy"] = "by_start_sequence"
            cfg["opt_start_seq"] = max(1, start_seq)
        elif start_time is not None:
            cfg["deliver_policy"] = "by_start_time"
            cfg["opt_start_time"] = _rfc3339(start_time)
        else:
            cfg["deliver_policy"] = "all"
        created = await self.wire.api(
            f"CONSUMER.CREATE.{stream}", {"stream_name": stream, "config": cfg}
        )
        name = created["name"]
        total = int(created.get("num_pending", 0))
        if limit is not None:
            total = min(total, limit)
        out: list[Scanned] = []
        try:
            if total:
                out = await self._drain(stream, name, total)
        finally:
            try:
                await self.wire.api(f"CONSUMER.DELETE.{stream}.{name}")
            except Exception:  # it expires by itself (inactive_threshold)
                pass
        return out

    async def _drain(self, stream: str, consumer: str, total: int) -> list[Scanned]:
        """Pull ``total`` messages of a fresh consumer, 512 per request."""
        loop = asyncio.get_running_loop()
        out: list[Scanned] = []
        waiting: list[tuple[int, asyncio.Future[None]]] = []  # (count that ends it, future)

        def on_msg(subject: bytes, reply: bytes, hdr: bytes | None, data: bytes) -> None:
            if reply:
                meta = ack_meta(reply)
                out.append(Scanned(meta.stream_seq, subject, hdr, data, meta.timestamp))
                if not waiting or len(out) < waiting[0][0]:
                    return
            if waiting:  # a status (the request ended short) or the batch is complete
                fut = waiting.pop(0)[1]
                if not fut.done():
                    fut.set_result(None)

        inbox = self.wire.new_inbox()
        sid = await self.wire.subscribe(inbox.decode(), on_msg)
        path = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}".encode()
        try:
            while len(out) < total:
                before = len(out)
                batch = min(512, total - before)
                fut: asyncio.Future[None] = loop.create_future()
                waiting.append((before + batch, fut))
                self.wire.publish(path, b'{"batch":%d,"no_wait":true}' % batch, reply=inbox)
                await self.wire.flush()
                await asyncio.wait_for(fut, self.wire.timeout)
                if len(out) == before:
                    break
        finally:
            await self.wire.unsubscribe(sid)
        return out[:total]


class AckMeta(NamedTuple):
    stream: str
    consumer: str
    delivered: int
    stream_seq: int
    timestamp: float


def ack_meta(reply: bytes) -> AckMeta:
    """Fields of a JetStream ack subject (v1 ``$JS.ACK.<stream>.<consumer>...`` or v2)."""
    t = reply.split(b".")
    if len(t) == 9:
        i = 2
    elif len(t) >= 12:
        i = 4
    else:
        raise BrokerError(f"NATS: not a JetStream ack subject: {reply!r}")
    return AckMeta(
        t[i].decode(),
        t[i + 1].decode(),
        int(t[i + 2]),
        int(t[i + 3]),
        int(t[i + 5]) / _NS_PER_S,
    )


def _rfc3339(t: float) -> str:
    whole = int(t)
    frac = int((t - whole) * 1e9)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{frac:09d}Z"
