"""Coordination on NATS: locks with fencing tokens, the kv store and the
cluster-wide rate and concurrency limits.

Everything is a compare-and-set on one subject of the KV stream (one message
per subject); a lock's fencing token is the stream sequence of the write that
took it, so it grows with every change of owner.  JetStream (2.9) has no
per-message TTL: a value with a ``ttl`` carries its expiry in a header (reads
treat it as absent once expired) and a note in the work stream's
``dw.NS.t.MINUTE`` subject, so the sweeper deletes it when its minute is
over.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import orjson

from ...errors import BrokerError
from ...flow import window_wait
from ..base import KvWrite, kv_write
from .connection import LoopLink
from .core import (
    Core,
    Hdrs,
)
from .names import digest, key_of, tok
from .pointers import (
    live,
    lock_token,
)
from .protocol import (
    JetStreamError,
    pub_ack,
)
from .store import Stored, is_conflict

T = TypeVar("T")

#: seconds a ``kv_update``'s key locks last if their holder dies holding them
#: (an update holds them for a few round trips)
KV_LOCK_TTL = 10.0
#: seconds a ``kv_update`` keeps trying to take its keys' locks (and to write
#: past plain writers) before it gives up: longer than a dead holder's locks
KV_UPDATE_PATIENCE = 30.0


class Coordination(Core):
    async def acquire(self, name: str, owner: str, ttl: float) -> int | None:
        link = await self._link()
        subject = self.n.c + b"lock." + tok(name)
        for _ in range(50):
            now = self.clock.now()
            cur = await link.store.read(self.n.kv, subject)
            held = orjson.loads(cur.data) if cur is not None else None
            if held is not None and held["x"] > now and held["o"] != owner:
                return None
            keep = held is not None and held["o"] == owner and held["x"] > now
            value = {"o": owner, "x": now + ttl, "t": held["t"] if keep and held else 0}
            try:
                ack = await link.store.put(subject, orjson.dumps(value), cur.seq if cur else 0)
            except JetStreamError as exc:
                if is_conflict(exc):
                    continue
                raise
            if keep and held:
                return int(held["t"])
            value["t"] = ack.seq  # the token: the sequence of the write that took it
            with contextlib.suppress(JetStreamError):
                await link.store.put(subject, orjson.dumps(value), ack.seq)
            return ack.seq
        return None

    async def renew(self, name: str, owner: str, token: int, ttl: float) -> bool:
        link = await self._link()
        subject = self.n.c + b"lock." + tok(name)
        for _ in range(50):
            now = self.clock.now()
            cur = await link.store.read(self.n.kv, subject)
            if cur is None:
                return False
            held = orjson.loads(cur.data)
            if held["o"] != owner or lock_token(held, cur) != token or held["x"] <= now:
                return False
            value = {"o": owner, "x": now + ttl, "t": token}
            try:
                await link.store.put(subject, orjson.dumps(value), cur.seq)
                return True
            except JetStreamError as exc:
                if not is_conflict(exc):
                    raise
        return False

    async def release(self, name: str, owner: str, token: int) -> None:
        link = await self._link()
        subject = self.n.c + b"lock." + tok(name)
        cur = await link.store.read(self.n.kv, subject)
        if cur is None:
            return
        held = orjson.loads(cur.data)
        if held["o"] == owner and lock_token(held, cur) == token:
            await link.store.delete(self.n.kv, cur.seq)

    async def _kv_put_raw(
        self, link: LoopLink, subject: bytes, data: bytes, ttl: float | None
    ) -> None:
        extra: Hdrs = ((b"Dw-Exp", repr(self.clock.now() + ttl)),) if ttl else ()
        ack = await link.store.put(subject, data, None, extra)
        if ttl:
            await self._expire_later(link, [(subject, ack.seq)], ttl)

    async def kv_get(self, keys: Sequence[str]) -> dict[str, bytes]:
        if not keys:
            return {}
        link = await self._link()
        now = self.clock.now()
        found = await link.store.read_many(self.n.kv, [self._kv_subject(k) for k in keys])
        out = {}
        for k, cur in zip(keys, found, strict=True):
            v = live(cur, now)
            if v is not None:
                out[k] = v
        return out

    async def kv_set(self, items: Mapping[str, bytes], ttl: float | None = None) -> None:
        if not items:
            return
        link = await self._link()
        extra: Hdrs = ((b"Dw-Exp", repr(self.clock.now() + ttl)),) if ttl is not None else ()
        subjects = [self._kv_subject(k) for k in items]
        futs = [
            link.store.put_req(s, bytes(v), None, extra)
            for s, v in zip(subjects, items.values(), strict=True)
        ]
        seqs = []
        for s, r in zip(subjects, await link.wire.gather(futs), strict=True):
            if isinstance(r, BaseException):
                raise r
            seqs.append((s, pub_ack(r, "kv_set").seq))
        if ttl is not None:
            await self._expire_later(link, seqs, ttl)

    async def kv_update(
        self,
        keys: Sequence[str],
        decide: Callable[[dict[str, bytes]], tuple[Mapping[str, KvWrite], T]],
    ) -> T:
        """Key locks, then per-key compare-and-set: what JetStream (2.9, one
        message per subject, no multi-subject transaction) allows.

        1. Take a lock per key read (a create-only write of
           ``c.kvl.DIGEST``; sorted, all at once; if any is held the others
           are given back and the update waits and tries again, so two
           updates never wait for each other in a cycle; a lock whose holder
           died is taken over after ``KV_LOCK_TTL``).  So no other
           ``kv_update`` of these keys runs meanwhile: updates of shared
           keys are serialized, absent keys included.
        2. Read the keys, ``decide``, write each key read with
           ``Nats-Expected-Last-Subject-Sequence`` = the sequence read (0:
           absent), all at once.  A plain writer (``kv_set``, ``kv_delete``...,
           which take no lock) that changed such a key since the read fails
           its write: the writes that went through are put back as they were
           (each only if still ours) and the update reads and decides again.
           (A key only read is not checked again.)  Keys written but not
           read are written after, unconditionally.  A write with a ttl
           carries its expiry as ``kv_set``'s does (the ``Dw-Exp`` header,
           and a note for the sweeper once the update has won); one
           without replaces the key's message, header and all, so it never
           expires.
        3. Give the locks back.

        What it does not give: readers (``kv_get``) may see some keys of an
        update written and others not yet, and a process that dies between
        two writes of one update leaves it half written (nothing on a
        single-subject store can make a multi-key write all-or-nothing)."""
        keys = list(dict.fromkeys(keys))
        link = await self._link()
        deadline = time.monotonic() + KV_UPDATE_PATIENCE
        delay = 0.001
        while True:
            locks = await self._kv_lock(link, keys)
            if locks is not None:
                try:
                    done, out = await self._kv_update_locked(link, keys, decide)
                finally:
                    await link.store.delete_many(self.n.kv, list(locks.values()))
                if done:
                    return out
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"NATS kv_update: could not update {keys[:3]!r}... for"
                    f" {KV_UPDATE_PATIENCE:.0f} s (locked, or changing); gave up"
                )
            await asyncio.sleep(delay * (0.5 + secrets.randbelow(1000) / 1000))
            delay = min(delay * 2, 0.05)

    async def _kv_lock(self, link: LoopLink, keys: list[str]) -> dict[bytes, int] | None:
        """Take the locks of ``keys``: subject -> sequence of our lock, or
        None (and nothing held) when one is held by a live update."""
        subjects = sorted({self.n.c + b"kvl." + digest(k).encode() for k in keys})
        if not subjects:
            return {}
        now = self.clock.now()
        body = orjson.dumps({"o": secrets.token_hex(8), "x": now + KV_LOCK_TTL})
        replies = await link.wire.gather([link.store.put_req(s, body, 0) for s in subjects])
        held: dict[bytes, int] = {}
        busy: list[bytes] = []
        failed: BaseException | None = None
        for s, r in zip(subjects, replies, strict=True):
            try:
                if isinstance(r, BaseException):
                    raise r
                held[s] = pub_ack(r, "kv_update lock").seq
            except JetStreamError as exc:
                if not is_conflict(exc):
                    failed = exc
                busy.append(s)
            except BaseException as exc:
                failed = exc
        if busy and failed is None:
            # a lock older than its ttl was left by a holder that died: take it over
            for s, cur in zip(busy, await link.store.read_many(self.n.kv, busy), strict=True):
                if cur is None or float(orjson.loads(cur.data).get("x", 0)) > now:
                    break
                try:
                    held[s] = (await link.store.put(s, body, cur.seq)).seq
                except JetStreamError as exc:
                    if not is_conflict(exc):
                        failed = exc
                    break
            else:
                busy = []
        if busy or failed is not None:
            await link.store.delete_many(self.n.kv, list(held.values()))
            if failed is not None:
                raise failed
            return None
        return held

    async def _kv_update_locked(
        self,
        link: LoopLink,
        keys: list[str],
        decide: Callable[[dict[str, bytes]], tuple[Mapping[str, KvWrite], T]],
    ) -> tuple[bool, T]:
        """Read, decide, write, holding the keys' locks: (True, decide's result),
        or (False, its result) when a plain writer changed a key read."""
        subjects = [self._kv_subject(k) for k in keys]
        found = await link.store.read_many(self.n.kv, subjects)
        now = self.clock.now()
        got: dict[str, bytes] = {}
        for k, cur in zip(keys, found, strict=True):
            v = live(cur, now)
            if v is not None:
                got[k] = v
        decided, out = decide(got)
        if not decided:
            return True, out
        writes = {k: kv_write(v) for k, v in decided.items()}
        read = dict(zip(keys, zip(subjects, found, strict=True), strict=True))
        checked = [k for k in writes if k in read]
        futs = []
        at = self.clock.now()
        for k in checked:
            s, cur = read[k]
            data, ttl = writes[k]
            extra: Hdrs = ((b"Dw-Exp", repr(at + ttl)),) if ttl is not None else ()
            futs.append(link.store.put_req(s, data, cur.seq if cur else 0, extra))
        mine: list[tuple[bytes, Stored | None, int]] = []  # what to put back on a conflict
        conflict = False
        failed: BaseException | None = None
        for k, r in zip(checked, await link.wire.gather(futs), strict=True):
            s, cur = read[k]
            try:
                if isinstance(r, BaseException):
                    raise r
                mine.append((s, cur, pub_ack(r, "kv_update").seq))
            except JetStreamError as exc:
                if not is_conflict(exc):
                    failed = exc
                conflict = True
            except BaseException as exc:
                failed = exc
        if conflict or failed is not None:
            await self._kv_put_back(link, mine)
            if failed is not None:
                raise failed
            return False, out
        await self._kv_update_won(link, writes, read, mine)
        return True, out

    async def _kv_update_won(
        self,
        link: LoopLink,
        writes: Mapping[str, tuple[bytes, float | None]],
        read: Mapping[str, tuple[bytes, Stored | None]],
        mine: list[tuple[bytes, Stored | None, int]],
    ) -> None:
        """The rest of a ``kv_update`` whose checked writes (``mine``) all
        went through: the sweeper's notes of those with a ttl (reads treat
        them as absent by their ``Dw-Exp`` already), then the keys written
        but not read."""
        ttl_of = {read[k][0]: ttl for k, (_, ttl) in writes.items() if k in read}
        expiring: dict[float, list[tuple[bytes, int]]] = {}
        for s, _, seq in mine:
            ttl = ttl_of[s]
            if ttl is not None:
                expiring.setdefault(ttl, []).append((s, seq))
        for ttl, notes in expiring.items():
            await self._expire_later(link, notes, ttl)
        blind: dict[float | None, dict[str, bytes]] = {}
        for k, (data, ttl) in writes.items():
            if k not in read:
                blind.setdefault(ttl, {})[k] = data
        for ttl, items in blind.items():
            await self.kv_set(items, ttl)

    async def _kv_put_back(
        self, link: LoopLink, mine: list[tuple[bytes, Stored | None, int]]
    ) -> None:
        """Undo a ``kv_update``'s writes (subject, what it replaced, its
        sequence), each only if nothing replaced it since."""
        now = self.clock.now()
        for s, old, seq in mine:
            with contextlib.suppress(JetStreamError):
                if old is None:
                    await link.store.delete(self.n.kv, seq)
                    continue
                exp = old.get(b"Dw-Exp")
                extra: Hdrs = ((b"Dw-Exp", exp),) if exp else ()
                ack = await link.store.put(s, old.data, seq, extra)
                if exp and float(exp) > now:
                    await self._expire_later(link, [(s, ack.seq)], float(exp) - now)

    async def kv_add(self, key: str, value: bytes, ttl: float | None = None) -> bool:
        link = await self._link()
        subject = self._kv_subject(key)
        extra: Hdrs = ((b"Dw-Exp", repr(self.clock.now() + ttl)),) if ttl is not None else ()
        for _ in range(50):
            cur = await link.store.read(self.n.kv, subject)
            if live(cur, self.clock.now()) is not None:
                return False
            try:
                ack = await link.store.put(subject, bytes(value), cur.seq if cur else 0, extra)
            except JetStreamError as exc:
                if is_conflict(exc):
                    continue
                raise
            if ttl is not None:
                await self._expire_later(link, [(subject, ack.seq)], ttl)
            return True
        return False

    async def kv_incr(self, key: str, amount: int = 1, ttl: float | None = None) -> int:
        link = await self._link()
        subject = self._kv_subject(key)
        out: dict[str, Any] = {}

        async def change(cur: Stored | None) -> tuple[bytes, Hdrs]:
            now = self.clock.now()
            value = live(cur, now)
            if value is not None:
                exp = cur.get(b"Dw-Exp") if cur is not None else None
                extra: Hdrs = ((b"Dw-Exp", exp),) if exp else ()
                new = int(value) + amount
            else:
                extra = ((b"Dw-Exp", repr(now + ttl)),) if ttl is not None else ()
                new = amount
            out["v"], out["fresh"] = new, value is None
            return str(new).encode(), extra

        ack = await link.store.cas(self.n.kv, subject, change)
        if ttl is not None and out.get("fresh") and ack is not None:
            await self._expire_later(link, [(subject, ack.seq)], ttl)
        return int(out["v"])

    async def kv_delete(self, keys: Sequence[str]) -> int:
        if not keys:
            return 0
        link = await self._link()
        now = self.clock.now()
        found = await link.store.read_many(self.n.kv, [self._kv_subject(k) for k in keys])
        alive = [cur.seq for cur in found if cur is not None and live(cur, now) is not None]
        gone = [cur.seq for cur in found if cur is not None and live(cur, now) is None]
        await link.store.delete_many(self.n.kv, alive + gone)
        return len(alive)

    async def kv_scan(self, prefix: str) -> dict[str, bytes]:
        link = await self._link()
        parts = prefix.split(":")
        whole = parts[:-1]  # complete tokens narrow the scan on the server
        filt = self.n.k + b"".join(tok(p) + b"." for p in whole) + b">"
        now = self.clock.now()
        out = {}
        for m in await link.store.scan(self.n.kv, filt, last_per_subject=True):
            key = key_of(m.subject[len(self.n.k) :])
            if not key.startswith(prefix):
                continue
            v = live(Stored(m.seq, m.subject, m.hdr, m.data), now)
            if v is not None:
                out[key] = v
        return out

    async def kv_sadd(self, key: str, member: str, ttl: float | None = None) -> int:
        link = await self._link()
        subject = self._kv_subject(key)
        out: dict[str, Any] = {}

        async def change(cur: Stored | None) -> tuple[bytes, Hdrs] | None:
            now = self.clock.now()
            value = live(cur, now)
            members = set(orjson.loads(value)) if value is not None else set()
            out["n"] = len(members | {member})
            out["fresh"] = value is None
            if member in members:
                return None
            members.add(member)
            if value is not None and cur is not None and cur.get(b"Dw-Exp"):
                extra: Hdrs = ((b"Dw-Exp", cur.get(b"Dw-Exp") or b""),)
            elif value is None and ttl is not None:
                extra = ((b"Dw-Exp", repr(now + ttl)),)
            else:
                extra = ()
            return orjson.dumps(sorted(members)), extra

        ack = await link.store.cas(self.n.kv, subject, change)
        if ttl is not None and out.get("fresh") and ack is not None:
            await self._expire_later(link, [(subject, ack.seq)], ttl)
        return int(out["n"])

    async def kv_smembers(self, key: str) -> set[str]:
        link = await self._link()
        value = await self._kv_read(link, self._kv_subject(key))
        return set(orjson.loads(value)) if value is not None else set()

    async def _expire_later(
        self, link: LoopLink, items: list[tuple[bytes, int]], ttl: float
    ) -> None:
        """Note when these writes expire: the sweeper deletes them then (a
        read treats them as absent already)."""
        minute = int((self.clock.now() + ttl) // 60) + 1
        body = orjson.dumps([[s.decode(), seq] for s, seq in items])
        await link.store.put(self.n.t + b"%d" % minute, body)

    async def _sweep_kv(self, link: LoopLink, now: float | None = None) -> None:
        """Delete kv entries whose time ran out (see ``_expire_later``)."""
        now_minute = int((self.clock.now() if now is None else now) // 60)
        buckets = await link.store.subjects(self.n.work, self.n.t + b"*")
        for subject in sorted(buckets):
            minute = int(subject[len(self.n.t) :])
            if minute > now_minute:
                continue
            seqs: list[int] = []
            async for m in link.store.walk(self.n.work, subject):
                seqs += [int(seq) for _, seq in orjson.loads(m.data)]
            await link.store.delete_many(self.n.kv, seqs)
            await link.wire.api(f"STREAM.PURGE.{self.n.work}", {"filter": subject.decode()})

    async def rate_limit(self, key: str, rate: int, per: float, at: float) -> float:
        link = await self._link()
        at = self.clock.to_server(at)
        out: dict[str, float] = {}

        async def change(cur: Stored | None) -> tuple[bytes, Hdrs] | None:
            times = [
                t for t in (orjson.loads(cur.data) if cur is not None else []) if t > at - 2 * per
            ]
            times.sort()
            wait = window_wait(times, at, rate, per)
            out["w"] = wait
            if wait > 0:
                return None
            times.append(at)
            times.sort()
            return orjson.dumps(times), ()

        await link.store.cas(self.n.kv, self.n.c + b"rate." + tok(key), change)
        return out["w"]

    async def slot_acquire(self, key: str, limit: int, holder: str, ttl: float) -> bool:
        link = await self._link()
        out: dict[str, bool] = {}

        async def change(cur: Stored | None) -> tuple[bytes, Hdrs] | None:
            now = self.clock.now()
            held = {h: x for h, x in (orjson.loads(cur.data) if cur else {}).items() if x > now}
            if holder not in held and len(held) >= limit:
                out["ok"] = False
                return None
            held[holder] = now + ttl
            out["ok"] = True
            return orjson.dumps(held), ()

        await link.store.cas(self.n.kv, self.n.c + b"slot." + tok(key), change)
        return out["ok"]

    async def slot_extend(self, holds: Sequence[tuple[str, str]], ttl: float) -> None:
        await self._slots(
            holds, lambda held, h, now: held.__setitem__(h, now + ttl) if h in held else None
        )

    async def slot_release(self, holds: Sequence[tuple[str, str]]) -> None:
        await self._slots(holds, lambda held, h, now: held.pop(h, None))

    async def _slots(self, holds: Sequence[tuple[str, str]], op: Any) -> None:
        if not holds:
            return
        link = await self._link()
        by_key: dict[str, list[str]] = {}
        for key, holder in holds:
            by_key.setdefault(key, []).append(holder)
        for key, holders in by_key.items():

            async def change(
                cur: Stored | None, holders: list[str] = holders
            ) -> tuple[bytes, Hdrs] | None:
                if cur is None:
                    return None
                now = self.clock.now()
                held = {h: x for h, x in orjson.loads(cur.data).items() if x > now}
                before = dict(held)
                for h in holders:
                    op(held, h, now)
                if held == before:
                    return None
                return orjson.dumps(held), ()

            await link.store.cas(self.n.kv, self.n.c + b"slot." + tok(key), change)
