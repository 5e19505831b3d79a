"""Leases that ran out and jobs that come due: ``rescue`` (the holder
lists, read under the rescue lock), the promoter's ``_promote`` (delay
entries moved to the work subjects) and ``_touch`` (a far ``eta``'s
records kept past retention); docs/nats.md, "Leases and rescue".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import orjson

from ...errors import BrokerError
from ...state import State
from ..types import Rescued
from . import records as R
from .connection import LoopLink
from .coordination import Coordination
from .core import (
    MAX_HOLD,
    SWEEP_EVERY,
)
from .moves import Moves
from .names import untok
from .pointers import lease_error
from .protocol import (
    JetStreamError,
    Reply,
    Unavailable,
    header,
    headers,
    pub_ack,
)
from .puller import Pulled
from .store import Stored, ack_meta

log = logging.getLogger("dumbwaiter.nats")
_NS_PER_S = 1_000_000_000
#: the lock one process holds while it rescues expired leases for everyone
_LOCK_RESCUE = "dw:rescue"
#: seconds of index catch-up per rescue (it shares the worker's loop; a
#: ``get`` that needs an entry not written yet writes it itself)
INDEX_BUDGET = 0.2


class Rescue(Moves, Coordination):
    """Rescue and promotion (see the module doc)."""

    async def rescue(self) -> Rescued:
        link = await self._link()
        n = 0
        if await self.acquire(_LOCK_RESCUE, link.holder.id, 5.0) is not None:
            for h in await self._holders(link):
                n += await self._rescue_holder(link, h)
            try:  # before their Nats-Msg-Id leaves the window (Core._lookup)
                await self._index_fresh(
                    link, self.clock.now() - self.settings.dupe_window / 2, INDEX_BUDGET
                )
            except Unavailable:
                raise
            except Exception:
                log.exception("nats: indexing waiting jobs failed")
            now = time.monotonic()
            if now - link.swept >= SWEEP_EVERY:
                link.swept = now
                try:
                    await self._sweep_kv(link)
                except Unavailable:
                    raise
                except Exception:
                    log.exception("nats: kv expiry sweep failed")
        await self._reconcile_own(link)
        # taken last, with no await in between: what a claim or this call
        # buried is reported once, and kept for the next call if this one failed
        dead = list(self._found_dead)
        self._found_dead.clear()
        return Rescued(n + len(dead), dead)

    async def _rescue_holder(self, link: LoopLink, h: tuple[str, Stored, dict[str, Any]]) -> int:
        """Give back the expired jobs one process listed; tidy its list.

        This process' own list is only read for jobs to give back: what it
        lists otherwise is decided from its memory, which is newer than the
        stored list (``_reconcile_own``, called by every ``rescue``)."""
        holder, cur, content = h
        now = self.clock.now()
        run: dict[str, list[Any]] = content.get("run", {})
        expired = [(jid, e) for jid, e in run.items() if float(e[1]) < now]
        if not expired:
            return 0
        recs = await link.store.read_many(
            self.n.jobs, [self.n.js + jid.encode() for jid, _ in expired]
        )
        n = 0
        remove: set[str] = set()
        credit: dict[str, list[int]] = {}
        own = holder == link.holder.id
        for (jid, entry), rc in zip(expired, recs, strict=True):
            if rc is None:
                remove.add(jid)
                continue
            rec = R.loads(rc.data)
            st = rec.get(R.ST)
            if st == R.RUNNING:
                if float(rec.get(R.LEASE, 0)) >= now:
                    continue  # extended since the list was written
                if await self._rescue_one(link, rec, rc.seq, now):
                    n += 1
                remove.add(jid)
                continue
            if own:
                continue
            if rec.get(R.SETTLED_BY) == holder:
                # Settled by that process, and still in its list: the list
                # was last written before the settle counted the job (a
                # settle takes the job out of ``run`` and counts it in one
                # step), and the process died before writing it again.
                # (Not a time comparison: a list written by another task of
                # that process while the settle was on its way is newer than
                # the record and still lacks the count.)
                if st == State.SUCCEEDED.value:
                    c = credit.setdefault(str(entry[0]), [0, 0])
                    c[0] += 1
                elif st == State.DEAD.value:
                    await self._dlq_publish(link, rec)
                if rec.get(R.ACK):  # the pointer may not have been acked either
                    with contextlib.suppress(Unavailable):
                        link.wire.publish(str(rec[R.ACK]).encode(), b"+ACK")
            remove.add(jid)
        if remove and not own:
            await self._tidy_holder(link, holder, cur, content, remove, credit, now)
        return n

    async def _tidy_holder(
        self,
        link: LoopLink,
        holder: str,
        cur: Stored,
        content: dict[str, Any],
        remove: set[str],
        credit: dict[str, list[int]],
        now: float,
    ) -> None:
        run = {k: v for k, v in content.get("run", {}).items() if k not in remove}
        fin = content.get("fin", {})
        minute = str(int(now // 60))
        for queue, (ok, cx) in credit.items():
            b = fin.setdefault(queue, {}).setdefault(minute, [0, 0])
            b[0] += ok
            b[1] += cx
        new = {"t": content.get("t", now), "run": run, "fin": fin}
        with contextlib.suppress(JetStreamError):  # it wrote meanwhile: next pass
            await link.store.put(self.n.h + holder.encode(), orjson.dumps(new), cur.seq)

    async def _rescue_one(self, link: LoopLink, rec: dict[str, Any], seq: int, now: float) -> bool:
        """Give back a job whose lease ran out: record (with a ``LeaseExpired``
        error) first, then its new pointer, then ``+ACK`` the old delivery.
        True if given back; one out of attempts is buried and kept for
        ``rescue`` to report (and count) as a dead letter instead."""
        env = rec[R.ENV]
        env.setdefault("errors", []).append(lease_error(rec, now))
        if int(env.get("attempt", 0)) >= int(env.get("max_attempts", 1)):
            if await self._bury(link, rec, seq, now):
                self._found_dead.append(R.dead_letter(env))
            return False
        return await self._ready_again(link, rec, env, seq, now)

    async def _promote(self, link: LoopLink, items: list[Pulled]) -> None:
        """Move due delay entries to the work subjects; hold the others."""
        now = self.clock.now()
        wire = link.wire
        moves: list[tuple[Pulled, asyncio.Future[Reply]]] = []
        longest = min(MAX_HOLD, self.retention / 2)
        for it in items:
            at = float(header(it.hdr, b"Dw-At") or 0)
            if at > now + 0.001:
                if ack_meta(it.reply).delivered > 1:  # held for a while already
                    await self._touch(link, it)
                hold = min(at - now, longest)
                wire.publish(it.reply, b'-NAK {"delay":%d}' % int(hold * _NS_PER_S))
                continue
            parts = it.subject.split(b".")
            queue = untok(parts[-2])
            prio = int(header(it.hdr, b"Dw-P") or 0)
            jid = (header(it.hdr, b"Dw-Id") or b"").decode()
            gen = (header(it.hdr, b"Dw-G") or b"0").decode()
            if prio:
                link.level_seen(queue, prio)
            pairs: list[tuple[bytes, bytes | str | int | float]] = [
                (b"Nats-Msg-Id", f"{jid}:{gen}:due"),
                (b"Dw-Id", jid),
                (b"Dw-G", gen),
                (b"Dw-S", header(it.hdr, b"Dw-S") or b"0"),
                (b"Dw-Rp", header(it.hdr, b"Dw-Rp") or b"0"),
            ]
            if header(it.hdr, b"Dw-Raw") is not None:
                pairs.append((b"Dw-Raw", b"1"))
            hdr = headers(*pairs)
            moves.append((it, wire.request(self.n.pointer(queue, prio), it.data, hdr)))
        await wire.flush()
        for it, fut in moves:
            try:
                pub_ack(await fut, "promote")
            except (JetStreamError, Unavailable, BrokerError):
                log.warning("nats: could not move a due job; it is looked at again", exc_info=True)
                continue
            wire.publish(it.reply, b"+ACK")
        await wire.flush()

    async def _touch(self, link: LoopLink, it: Pulled) -> None:
        """Rewrite a waiting job's index entry, record and unique key, so they
        outlive ``retention`` (JOBS ``max_age``) while the job waits for a far
        ``eta``: the promoter holds each delay entry at most ``retention/2``
        and touches it whenever it comes back not yet due."""
        jid = (header(it.hdr, b"Dw-Id") or b"").decode()
        if not jid:
            return
        store = link.store
        n = self.n
        try:
            cur, fresh = await store.read_many(n.jobs, [n.js + jid.encode(), n.je + jid.encode()])
            if cur is not None:  # the record: the same content, a new time
                with contextlib.suppress(JetStreamError):
                    await store.put(n.js + jid.encode(), cur.data, cur.seq)
            elif fresh is not None:
                extra = tuple(
                    (k, v) for k in (b"Dw-U", b"Dw-Ra") if (v := fresh.get(k)) is not None
                )
                await store.put(n.je + jid.encode(), fresh.data, None, extra)
            env = orjson.loads(it.data)
            key = env.get("key") if isinstance(env, dict) and env.get("kind") == "task" else None
            if key:
                held = await store.read(n.jobs, n.unique(str(key)))
                if held is not None and orjson.loads(held.data).get("id") == jid:
                    with contextlib.suppress(JetStreamError):
                        await store.put(n.unique(str(key)), held.data, held.seq)
        except (Unavailable, BrokerError, orjson.JSONDecodeError):
            log.debug("nats: could not touch waiting job %s", jid, exc_info=True)
