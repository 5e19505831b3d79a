"""What a job's first copy says its record holds, so that the judge's lease
can skip reading the record back.

An enqueue (or a publish, for a delivery to a group) writes a record and
then its first copy (version 0), from the same envelope and the same two
times: the run time and the time the record was written.  The copy carries
the envelope as its value and, being a first copy, the record's time in
``dw-u`` and its run time in ``dw-r`` where that differs (both as
``repr``: exact floats), so a worker that reads it can build the very bytes
the record was written with.
The judge decides on those (``kv_update_known``): a right belief leases in
one round trip instead of a read and a write, and a wrong one (the job was
cancelled, taken by another worker, already ran: a copy read again after a
rebalance or a crash) is caught by the state store's compare, which then
reads and decides again, as before.  A belief is never trusted, only
checked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar

import orjson

from ...message import from_dict
from ...state import State
from ..base import Broker, KvWrite
from .names import Names
from .records import Record
from .transport import Copy

#: headers of a first copy: the time its record was written, and the
#: record's run time where it is not that time (an ``eta``)
WRITTEN, RUN_AT = "dw-u", "dw-r"

T = TypeVar("T")


def first_copy_headers(run_at: float, written: float) -> list[tuple[str, bytes]]:
    """What a first copy carries of the record written at ``written``."""
    out = [(WRITTEN, repr(written).encode())]
    if run_at != written:
        out.append((RUN_AT, repr(run_at).encode()))
    return out


def record_of(c: Copy) -> Record | None:
    """The record a first copy was written after, as its writer stored it;
    None for any other copy (a later version, a foreign record, one without
    the times)."""
    u = c.header(WRITTEN)
    if u is None or c.header("dw-v") != "0":
        return None
    try:
        written = float(u)
        run_at = float(c.header(RUN_AT) or u)
        msg = from_dict(orjson.loads(c.value))
    except ValueError:  # MessageDecodeError too: the judge reads the record and says why
        return None
    state = State.SCHEDULED if run_at > written else State.READY
    return Record(msg=msg, state=state, run_at=run_at, updated_at=written, enq=c.header("dw-e"))


class Beliefs:
    """What the judge believes its keys hold (``values``, for
    ``kv_update_known``), and the records parsed for them: a decision on a
    belief takes the record built for it instead of parsing its bytes
    again, once (a decision changes the record it takes)."""

    def __init__(
        self,
        values: dict[str, bytes | None] | None = None,
        records: dict[str, tuple[bytes, Record]] | None = None,
    ) -> None:
        #: None: nothing is believed (the update reads first)
        self.values = values
        self._records = records or {}

    def load(self, key: str, raw: bytes) -> Record:
        """``raw``, the value of ``key`` a decision is made on, parsed."""
        kept = self._records.pop(key, None)
        if kept is not None and kept[0] is raw:
            return kept[1]
        return Record.load(raw)

    async def update(
        self,
        store: Broker,
        keys: Sequence[str],
        decide: Callable[[dict[str, bytes]], tuple[Mapping[str, KvWrite], T]],
    ) -> T:
        """The judge's update: decided on the beliefs first, if any."""
        if self.values is None:
            return await store.kv_update(keys, decide)
        return await store.kv_update_known(keys, decide, self.values)


def believed(
    names: Names,
    wanted: Sequence[tuple[Copy, str, int, str | None]],
    others: Iterable[str],
) -> Beliefs:
    """What the judge's keys hold if every copy it judges is a first copy
    and the queues are not paused (``others``: the pause keys, believed
    absent); nothing when any copy says nothing of its record."""
    values: dict[str, bytes | None] = dict.fromkeys(others)
    records: dict[str, tuple[bytes, Record]] = {}
    for c, cid, ver, lock in wanted:
        rec = record_of(c) if ver == 0 and lock is None else None
        if rec is None:
            return Beliefs()
        key = names.job + cid
        raw = values[key] = rec.dump()
        records[key] = (raw, rec)
    return Beliefs(values, records)
