"""pgqueuer a second time in each repetition: the harness' own pgqueuer
adapter under another name (``pgqueuer-twice``), for issue 25.1.

``pgqueuer ÷ pgqueuer-twice`` of one repetition is what the harness'
per-repetition ratio of two libraries moves by when nothing differs between
them but the minute they ran in (docs/benchmarks-postgres.md, h-pg251).

    LIBS="dumbwaiter-postgres pgqueuer pgqueuer-twice" REPS=3 benchmarks/run.sh
"""

from __future__ import annotations

from peers.adapters.base import Adapter
from peers.adapters.pgqueuer_adapter import PgQueuerAdapter


class PgQueuerTwiceAdapter(PgQueuerAdapter):  # type: ignore[misc]
    """The same enqueue, worker and tables as ``pgqueuer``."""

    name = "pgqueuer-twice"


ADAPTERS: list[Adapter] = [PgQueuerTwiceAdapter()]
