"""A circuit breaker per endpoint, its state shared in the broker's kv store.

Without one, a partner that is down takes every worker slot it can get:
each delivery waits for its timeout, fails, and comes back on its schedule,
and a thousand queued deliveries make a thousand timeouts a round.  With
one, after ``threshold`` consecutive failures (counted across every worker,
since the state is in the shared store) the endpoint's breaker *opens*:
deliveries to it are deferred to the end of a cool-down without sending
anything and without using up an attempt.  After the cool-down one delivery
is let through as a *probe* (half-open); its success closes the breaker,
its failure opens it again for twice as long (up to ``max_cooldown``).

The decisions are pure functions of the stored state (``admit``,
``record``), applied with ``kv_update`` so two workers cannot both take the
probe.  A closed breaker costs a delivery nothing but the read it shares
with the endpoint's (``Deliverer`` reads both keys at once); only failures,
and the first success after them, write.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import orjson

from .. import keys

PREFIX = keys.WEBHOOK_BREAKER
CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


def key_of(endpoint_id: str) -> str:
    return PREFIX + endpoint_id


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    #: consecutive failures that open the breaker
    threshold: int = 5
    #: seconds an open breaker waits before its probe; doubled after a failed probe
    cooldown: float = 30.0
    max_cooldown: float = 600.0
    #: how long a probe may take before another delivery may probe instead
    #: (its worker may have died); the request timeout plus a margin
    probe_timeout: float = 60.0


def load(raw: bytes | None) -> dict[str, Any]:
    if raw is None:
        return {"state": CLOSED, "failures": 0}
    try:
        d = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {"state": CLOSED, "failures": 0}
    return d if isinstance(d, dict) else {"state": CLOSED, "failures": 0}


def admit(
    state: dict[str, Any], now: float, job_id: str, policy: BreakerPolicy
) -> tuple[dict[str, Any] | None, float]:
    """(new state to store or None, 0.0 to go now or the epoch time to defer to)."""
    s = state.get("state", CLOSED)
    if s == CLOSED:
        return None, 0.0
    if s == OPEN:
        until = float(state.get("opened_at", 0.0)) + float(state.get("cooldown", policy.cooldown))
        if now < until:
            return None, until + random.uniform(0.0, 0.1 * policy.cooldown)
        return {
            **state,
            "state": HALF_OPEN,
            "probe": job_id,
            "probe_until": now + policy.probe_timeout,
        }, 0.0
    # half open: one probe at a time; a probe whose worker died is replaced
    if state.get("probe") == job_id or now >= float(state.get("probe_until", 0.0)):
        return {**state, "probe": job_id, "probe_until": now + policy.probe_timeout}, 0.0
    # others look again after a cool-down (or when the probe's time is up, if
    # sooner): a probe that succeeds has closed the breaker by then
    until = min(float(state["probe_until"]), now + policy.cooldown)
    return None, until + random.uniform(0.0, 0.1 * policy.cooldown)


def record(
    state: dict[str, Any], now: float, ok: bool, policy: BreakerPolicy
) -> dict[str, Any] | None:
    """The state after a delivery's outcome, or None when nothing changes."""
    s = state.get("state", CLOSED)
    failures = int(state.get("failures", 0))
    if ok:
        if s == CLOSED and failures == 0:
            return None
        return {"state": CLOSED, "failures": 0, "closed_at": now}
    failures += 1
    if s == HALF_OPEN:
        cooldown = min(float(state.get("cooldown", policy.cooldown)) * 2, policy.max_cooldown)
        return {"state": OPEN, "failures": failures, "opened_at": now, "cooldown": cooldown}
    if s == OPEN:
        return {**state, "failures": failures}
    if failures >= policy.threshold:
        return {"state": OPEN, "failures": failures, "opened_at": now, "cooldown": policy.cooldown}
    return {"state": CLOSED, "failures": failures}


def dump(state: dict[str, Any]) -> bytes:
    return orjson.dumps(state)
