"""Flow control: rate and concurrency limits, unique jobs and debounce.

Everything here is cluster-wide: the counters live in the broker
(``rate_limit``, ``slot_*``, ``kv_add``, enqueue with a unique mode), so the
limits hold across every worker process on every machine.

* ``rate_limit="100/s"`` (``/m``, ``/h``, ``/d``, or ``"5/10s"``): at most that
  many starts in any window of that length (a sliding window, exact).
* ``concurrency=N``: at most N jobs of the task running at once.
* ``limit_key=lambda args: args["tenant"]``: both per key, for fairness
  between tenants (``args`` maps parameter names to the call's values).
* ``unique=True``: no second job with the same arguments (or ``key=``) while
  one is queued or running; ``unique=timedelta(...)``: none within that window
  from the first.
* ``debounce=seconds``: a burst of enqueues with the same arguments runs once,
  ``seconds`` after the last of them.

A job over a limit is not run and does not use up an attempt: the worker
gives it back to run when a permit should be free (a rate limit says exactly
when; for a concurrency limit the worker uses the task's recent run time), so
nothing polls in a loop.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import orjson

from .errors import ConfigurationError

_UNITS = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "hour": 3600.0, "d": 86400.0}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*(?:\.\d+)?)\s*([a-z]+)\s*$")

#: task options this module adds to ``@app.task``
OPTIONS = frozenset({"rate_limit", "concurrency", "limit_key", "unique", "debounce"})


def parse_rate(value: str | tuple[int, float]) -> tuple[int, float]:
    """``"100/s"`` -> (100, 1.0); ``"5/10s"`` -> (5, 10.0); (n, seconds) as is."""
    if isinstance(value, tuple):
        n, per = value
    else:
        m = _RATE.match(str(value).lower())
        if m is None or m.group(3) not in _UNITS:
            raise ConfigurationError(
                f"rate_limit {value!r}: write N/UNIT with UNIT s, m, h or d, e.g. '100/s', "
                "'600/m', '5/10s'"
            )
        n, per = int(m.group(1)), float(m.group(2) or 1) * _UNITS[m.group(3)]
    if int(n) < 1 or float(per) <= 0:
        raise ConfigurationError(f"rate_limit {value!r} must allow at least 1 per positive time")
    return int(n), float(per)


def _seconds(value: float | timedelta, what: str) -> float:
    s = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if s <= 0:
        raise ConfigurationError(f"{what} must be a positive duration, got {value!r}")
    return s


@dataclass(frozen=True, slots=True)
class Flow:
    """A task's flow-control settings (parsed once, at declaration)."""

    rate: tuple[int, float] | None = None
    concurrency: int | None = None
    limit_key: Callable[[Mapping[str, Any]], Any] | None = None
    #: "active" (while queued or running) or a window in seconds
    unique: str | float | None = None
    debounce: float | None = None

    @classmethod
    def from_options(cls, name: str, options: dict[str, Any]) -> Flow | None:
        """Pop this module's options from ``options``; None when there are none."""
        if not OPTIONS & set(options):
            return None
        rate = options.pop("rate_limit", None)
        conc = options.pop("concurrency", None)
        key = options.pop("limit_key", None)
        unique = options.pop("unique", None)
        debounce = options.pop("debounce", None)
        if conc is not None and (not isinstance(conc, int) or isinstance(conc, bool) or conc < 1):
            raise ConfigurationError(f"task {name}: concurrency must be an integer >= 1")
        if key is not None and not callable(key):
            raise ConfigurationError(f"task {name}: limit_key takes a function of the arguments")
        if key is not None and rate is None and conc is None:
            raise ConfigurationError(f"task {name}: limit_key needs rate_limit or concurrency")
        if unique is not None and debounce is not None:
            raise ConfigurationError(f"task {name}: give unique= or debounce=, not both")
        unique_mode: str | float | None
        if unique is None or unique is False:
            unique_mode = None
        elif unique is True:
            unique_mode = "active"
        else:
            unique_mode = _seconds(unique, f"task {name}: unique")
        return cls(
            rate=None if rate is None else parse_rate(rate),
            concurrency=conc,
            limit_key=key,
            unique=unique_mode,
            debounce=None if debounce is None else _seconds(debounce, f"task {name}: debounce"),
        )

    @property
    def limited(self) -> bool:
        return self.rate is not None or self.concurrency is not None


def digest(arguments: Mapping[str, Any]) -> str:
    """A short stable digest of a call's arguments (for unique and debounce keys)."""
    raw = orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(raw, digest_size=10).hexdigest()


def window_wait(times: list[float], at: float, rate: int, per: float) -> float:
    """The sliding-window rule, shared by the brokers.

    ``times`` are the permits already given for a key (sorted; at least those
    in ``(at - per, at + per)``).  A new permit at ``at`` is allowed when
    afterwards no window ``[c, c + per)`` holds more than ``rate`` permits.
    Permits may arrive out of order (workers stamp their own start times), so
    every window that contains ``at`` is checked, not only the one ending
    there.  Returns 0.0 when allowed, else the seconds until it would be.
    """
    import bisect

    lo = bisect.bisect_right(times, at - per)
    hi = bisect.bisect_left(times, at + per)
    near = times[lo:hi]
    # The windows holding ``at`` are (x - per, x] for x in [at, at + per); the
    # count of such a window only grows when x reaches a later permit, so the
    # windows ending at ``at`` and at each later permit are the ones to check.
    for x in [at, *(e for e in near if e > at)]:
        inside = bisect.bisect_right(near, x) - bisect.bisect_right(near, x - per)
        if inside + 1 > rate:
            break
    else:
        return 0.0
    before = [e for e in near if e < at]
    if len(before) >= rate:  # the usual case: wait for the oldest to leave the window
        return max(before[-rate] + per - at, 1e-6)
    return per / rate
