"""The circuit breaker's decisions (pure functions of the shared state)."""

from __future__ import annotations

from dumbwaiter.webhooks.breaker import CLOSED, HALF_OPEN, OPEN, BreakerPolicy, admit, load, record

P = BreakerPolicy(threshold=3, cooldown=10.0, max_cooldown=25.0, probe_timeout=30.0)


def test_opens_after_threshold_consecutive_failures_and_a_success_resets() -> None:
    s = load(None)
    for _ in range(2):
        s = record(s, 100.0, False, P) or s
    assert s["state"] == CLOSED and s["failures"] == 2
    s = record(s, 100.0, True, P) or s  # a success in between: counting starts again
    assert s == {"state": CLOSED, "failures": 0, "closed_at": 100.0}
    for _ in range(3):
        s = record(s, 100.0, False, P) or s
    assert s["state"] == OPEN and s["opened_at"] == 100.0 and s["cooldown"] == 10.0
    assert record(load(None), 1.0, True, P) is None  # closed and clean: nothing to write


def test_open_defers_until_the_cooldown_then_lets_one_probe_through() -> None:
    s = {"state": OPEN, "failures": 3, "opened_at": 100.0, "cooldown": 10.0}
    new, until = admit(s, 105.0, "job-a", P)
    assert new is None and 110.0 <= until <= 111.0  # deferred to the end (plus jitter)
    new, until = admit(s, 110.5, "job-a", P)
    assert until == 0.0 and new is not None
    assert new["state"] == HALF_OPEN and new["probe"] == "job-a"
    other, until = admit(new, 111.0, "job-b", P)  # the probe is out: others look again later
    assert other is None and 121.0 <= until <= 122.0  # a cool-down, not the probe's whole time
    again, until = admit(new, 111.0, "job-a", P)  # the probe's own rerun (a crash) may go
    assert until == 0.0 and again is not None
    taken, until = admit(new, new["probe_until"] + 1, "job-c", P)  # a lost probe is replaced
    assert until == 0.0 and taken is not None and taken["probe"] == "job-c"


def test_a_failed_probe_reopens_for_longer_and_a_good_one_closes() -> None:
    half = {"state": HALF_OPEN, "failures": 3, "opened_at": 100.0, "cooldown": 20.0}
    s = record(half, 200.0, False, P)
    assert s is not None and s["state"] == OPEN and s["opened_at"] == 200.0
    assert s["cooldown"] == 25.0  # doubled, capped at max_cooldown
    s = record(half, 200.0, True, P)
    assert s is not None and s["state"] == CLOSED and s["failures"] == 0
    assert admit({"state": CLOSED, "failures": 2}, 1.0, "x", P) == (None, 0.0)
