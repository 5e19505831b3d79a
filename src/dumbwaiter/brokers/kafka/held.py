"""What this process last wrote to the state-store entries of the jobs it
holds: each leased job's record and lease entry (and an event's key lock),
as stored by the lease or its last extension.

Settling a job changes exactly those entries, and nobody else writes them
while the lease holds, so the settle's update can decide on what was
written instead of reading it back (``kv_update_known``: a right belief
costs one round trip instead of two; a wrong one, a lease lost to a
rescuer, is caught by the store's compare and read again).  The record
parsed at the lease is kept too, so an ack need not parse it again.

A cache, never the truth: a job forgotten here (settled, let go, or
dropped when the cache is full) is settled by an ordinary read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ..base import KvWrite, kv_write
from .records import Record

#: entries kept at most (two or three per job held): past it the cache is
#: emptied (jobs then settle by a read)
LIMIT = 50_000


class Held:
    def __init__(self) -> None:
        self._values: dict[str, bytes] = {}
        self._records: dict[str, Record] = {}

    def __len__(self) -> int:
        return len(self._values)

    def wrote(
        self, writes: Mapping[str, KvWrite], records: Mapping[str, Record] | None = None
    ) -> None:
        """``writes`` were stored (the decision a ``kv_update`` returned
        with); ``records``: the parsed records of some of those keys."""
        if len(self._values) + len(writes) > LIMIT:
            self._values.clear()
            self._records.clear()
        for k, w in writes.items():
            self._values[k] = kv_write(w)[0]
            self._records.pop(k, None)
        if records:
            self._records.update(records)

    def known(self, keys: Iterable[str]) -> dict[str, bytes | None] | None:
        """What ``keys`` hold, if every one of them is known here."""
        out: dict[str, bytes | None] = {}
        for k in keys:
            v = self._values.get(k)
            if v is None:
                return None
            out[k] = v
        return out

    def record(self, key: str, raw: bytes) -> Record:
        """``raw`` parsed: a copy of the record kept for it, if ``raw`` is
        the very value written here (a decision on ``known``), else a parse.
        The copy shares its message: for a change that leaves the message
        alone (an ack)."""
        rec = self._records.get(key)
        if rec is not None and self._values.get(key) is raw:
            return rec.copy()
        return Record.load(raw)

    def forget(self, keys: Sequence[str]) -> None:
        for k in keys:
            self._values.pop(k, None)
            self._records.pop(k, None)
