"""The job state machine of the record engines (``brokers/transitions.py``),
as a table: each transition from every stored state, what it leads to, and
what it refuses (a worker whose lease was lost or taken over, a job already
finished).  RabbitMQ and Kafka run these very functions; the SQL and Lua
engines encode the same table in the server (docs/design.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from dumbwaiter.brokers import transitions as T
from dumbwaiter.brokers.record import Record
from dumbwaiter.message import ErrorRecord, Message
from dumbwaiter.state import State

NOW = 1_000.0
TOKEN = 7  # the lease the worker holds in the running records below
ERR = ErrorRecord(time=NOW, type="ValueError", message="boom", worker="w-1", attempt=1)


def record(
    state: State, *, attempt: int = 1, max_attempts: int = 3, run_at: float = NOW - 5.0
) -> Record:
    """A stored record in ``state``: a running one holds lease ``TOKEN``
    (alive for 30 s more); a waiting one is due (``run_at`` past)."""
    msg = Message(
        id="j1", kind="task", name="t", queue="q", attempt=attempt, max_attempts=max_attempts
    )
    running = state is State.RUNNING
    return Record(
        msg=msg,
        state=state,
        ver=4,
        token=TOKEN,
        run_at=run_at,
        updated_at=NOW - 10.0,
        worker="w-1",
        lease_until=NOW + 30.0 if running else 0.0,
    )


def expired(rec: Record) -> Record:
    rec.lease_until = NOW - 1.0
    return rec


@dataclass(frozen=True)
class Case:
    name: str
    #: the transition applied to a record (True or a state: applied)
    apply: Callable[[Record], object]
    #: stored states it applies from; the others are refused
    allowed: frozenset[State]
    #: the state after, and whether a new copy's version was taken
    then: State
    new_version: bool


ALL = frozenset(State) - {State.RETRYING}  # retrying is stored as scheduled
WAITING = frozenset({State.READY, State.SCHEDULED})
RUNNING = frozenset({State.RUNNING})

CASES = [
    Case("lease", lambda r: T.take_lease(r, NOW + 60, "w", NOW), WAITING, State.RUNNING, False),
    Case("succeed", lambda r: T.succeed(r, TOKEN, NOW, b"42"), RUNNING, State.SUCCEEDED, False),
    Case("retry later", lambda r: T.retry(r, TOKEN, NOW + 9, NOW, ERR), RUNNING, State.SCHEDULED,
         True),
    Case("retry now", lambda r: T.retry(r, TOKEN, NOW - 9, NOW, ERR), RUNNING, State.READY, True),
    Case("requeue", lambda r: T.requeue(r, TOKEN, NOW, NOW), RUNNING, State.READY, True),
    Case("bury", lambda r: T.bury(r, TOKEN, NOW, ERR), RUNNING, State.DEAD, True),
    Case("extend", lambda r: T.extend(r, TOKEN, NOW + 90), RUNNING, State.RUNNING, False),
    Case("cancel", lambda r: T.cancel(r, NOW), WAITING, State.CANCELLED, True),
    Case("reschedule", lambda r: T.reschedule(r, NOW + 60, NOW), WAITING, State.SCHEDULED, True),
    Case("replay", lambda r: T.replay(r, NOW), frozenset({State.DEAD}), State.READY, True),
]  # fmt: skip


@pytest.mark.parametrize("state", sorted(ALL))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_each_transition_from_each_state(case: Case, state: State) -> None:
    rec = record(state)
    before = Record.load(rec.dump())
    applied = case.apply(rec)
    if state not in case.allowed:
        assert not applied, f"{case.name} from {state} must be refused"
        assert rec.dump() == before.dump(), "a refusal changes nothing"
        return
    assert applied
    assert rec.state is case.then
    assert rec.ver == before.ver + (1 if case.new_version else 0)
    again = Record.load(rec.dump())  # what is stored reads back the same
    assert again.dump() == rec.dump()


@pytest.mark.parametrize(
    "settle",
    [
        lambda r, t: T.succeed(r, t, NOW),
        lambda r, t: T.retry(r, t, NOW, NOW, ERR),
        lambda r, t: T.requeue(r, t, NOW, NOW),
        lambda r, t: T.bury(r, t, NOW, ERR),
        lambda r, t: T.extend(r, t, NOW + 60),
    ],
    ids=["succeed", "retry", "requeue", "bury", "extend"],
)
def test_a_worker_that_lost_its_lease_settles_nothing(
    settle: Callable[[Record, int], bool],
) -> None:
    """The fence: the lease was rescued and taken by another worker (a new
    token), or the job finished; the old token changes nothing."""
    taken_over = record(State.RUNNING)
    taken_over.token = TOKEN + 1
    finished = record(State.SUCCEEDED)
    for rec in (taken_over, finished):
        before = rec.dump()
        assert not settle(rec, TOKEN)
        assert rec.dump() == before


def test_a_lease_takes_the_next_attempt_and_a_new_token() -> None:
    rec = record(State.READY, attempt=1)
    assert T.take_lease(rec, NOW + 60, "w-2", NOW)
    assert (rec.msg.attempt, rec.token, rec.worker, rec.lease_until) == (
        2,
        TOKEN + 1,
        "w-2",
        NOW + 60,
    )
    assert rec.info(NOW).lease_until == NOW + 60


def test_an_expired_lease_may_be_taken_over_a_live_one_not() -> None:
    live = record(State.RUNNING)
    assert not T.take_lease(live, NOW + 60, "w-2", NOW)
    gone = expired(record(State.RUNNING))
    assert T.lose_lease(gone, NOW, "lost its connection") is State.RUNNING
    assert T.take_lease(gone, NOW + 60, "w-2", NOW)
    assert gone.ver == 4, "the copy that takes it over stays current"
    assert gone.msg.errors[-1].type.endswith("LeaseExpired")


def test_success_keeps_the_result_for_the_longer_of_its_time_and_retention() -> None:
    rec = record(State.RUNNING)
    assert T.succeed(rec, TOKEN, NOW, b"42")
    assert rec.result == b"42" and rec.updated_at == NOW
    assert T.kept_for(60.0, b"42", 3600.0) == 3600.0
    assert T.kept_for(60.0, b"42", 5.0) == 60.0
    assert T.kept_for(60.0, None, 3600.0) == 60.0, "no result: only retention"


def test_a_retry_keeps_the_error_and_shows_retrying_until_due() -> None:
    rec = record(State.RUNNING)
    assert T.retry(rec, TOKEN, NOW + 9, NOW, ERR)
    assert rec.msg.errors == [ERR] and rec.run_at == NOW + 9 and rec.lease_until == 0.0
    assert rec.shown_state(NOW) is State.RETRYING
    assert rec.shown_state(NOW + 9) is State.READY
    assert rec.worker == "w-1", "the last worker that ran it stays, as in the SQL engines"


def test_a_requeue_does_not_count_the_attempt() -> None:
    rec = record(State.RUNNING, attempt=2)
    assert T.requeue(rec, TOKEN, NOW, NOW)
    assert rec.msg.attempt == 1 and rec.msg.errors == []


def test_a_replay_gives_fresh_attempts() -> None:
    rec = record(State.DEAD, attempt=3)
    assert T.replay(rec, NOW)
    assert (rec.msg.attempt, rec.replays, rec.run_at) == (0, 1, NOW)


def test_a_reschedule_to_the_past_is_now() -> None:
    rec = record(State.SCHEDULED, run_at=NOW + 100)
    assert T.reschedule(rec, NOW - 50, NOW)
    assert rec.state is State.READY and rec.run_at == NOW


def test_a_failed_job_waiting_to_retry_can_be_cancelled() -> None:
    rec = record(State.SCHEDULED, run_at=NOW + 100)  # shown as retrying
    assert rec.shown_state(NOW) is State.RETRYING
    assert T.cancel(rec, NOW) and rec.state is State.CANCELLED


@pytest.mark.parametrize(
    ("attempt", "then"), [(1, State.READY), (3, State.DEAD)], ids=["attempts left", "spent"]
)
def test_a_rescue_retries_an_expired_lease_or_buries_its_last_attempt(
    attempt: int, then: State
) -> None:
    rec = expired(record(State.RUNNING, attempt=attempt, max_attempts=3))
    assert T.rescue(rec, NOW) is then
    assert rec.ver == 5, "a new copy (or the dead letter) makes the old copies stale"
    err = rec.msg.errors[-1]
    assert err.type == "dumbwaiter.errors.LeaseExpired" and err.worker == "w-1"
    assert err.message == f"lease expired: worker w-1 stopped heartbeating during attempt {attempt}"


@pytest.mark.parametrize("state", sorted(ALL))
def test_a_rescue_refuses_anything_but_an_expired_lease(state: State) -> None:
    rec = record(state)  # a running one is alive
    before = rec.dump()
    assert T.rescue(rec, NOW) is None and T.lose_lease(rec, NOW) is None
    assert rec.dump() == before


def test_records_written_before_the_shared_transitions_still_load() -> None:
    """A record as the engines wrote it before (RabbitMQ kept the lease's end
    and the worker in a retried record; Kafka cleared them): both load, and
    the transitions apply."""
    old = (
        b'{"m":{"id":"j1","kind":"task","name":"t","queue":"q","attempt":1,'
        b'"max_attempts":3},"s":"scheduled","v":5,"t":7,"r":1009.0,"u":1000.0,'
        b'"w":"w-1","l":1030.0,"p":0}'
    )
    rec = Record.load(old)
    assert rec.shown_state(NOW) is State.RETRYING and rec.info(NOW).lease_until is None
    assert T.take_lease(rec, NOW + 60, "w-2", NOW + 10)
    assert rec.state is State.RUNNING and rec.token == 8


@pytest.mark.parametrize("state", sorted(ALL))
def test_a_copy_is_the_same_record_and_changes_alone(state: State) -> None:
    """``Record.copy`` (what an outcome changes, leaving the held record as
    it was for a call made again) keeps every field; its message is shared,
    so a transition that changes the message gets a copy of that too."""
    rec = record(state)
    rec.result, rec.enq, rec.raw, rec.replays = b"r", "e1", b"\xff", 2
    copy = rec.copy()
    assert copy.dump() == rec.dump()
    copy.msg = rec.msg.copy()
    before = rec.dump()
    changes: tuple[Callable[[Record], object], ...] = (
        lambda r: T.succeed(r, TOKEN, NOW),
        lambda r: T.cancel(r, NOW),
        lambda r: T.replay(r, NOW),
        lambda r: T.take_lease(r, NOW + 60, "w-2", NOW),
    )
    applied = [change(copy) for change in changes]
    assert any(applied) or state in (State.SUCCEEDED, State.CANCELLED)  # final: none applies
    assert rec.dump() == before


def test_a_success_without_a_kept_result_leaves_a_compact_record() -> None:
    """``compact`` (a task without ``keep_result``): the record keeps what
    ``get``, the listing and the ledger's stamp read, not the envelope; the
    record the worker held is left whole (a call made again reads it)."""
    held = record(State.RUNNING, attempt=2)
    held.msg.args, held.msg.headers, held.msg.errors = ["x" * 500], {"trace": "abc"}, [ERR]
    held.enq = "e1"
    rec = held.copy()
    assert T.succeed(rec, TOKEN, NOW, b'{"started":990.0,"finished":999.0}', compact=True)
    assert rec.compact and held.msg.args == ["x" * 500] and not held.compact
    raw = rec.dump()
    assert b"x" * 500 not in raw and b"trace" not in raw and len(raw) < 160
    back = Record.load(raw)
    assert back.compact and back.dump() == raw
    assert (back.state, back.ver, back.token, back.updated_at) == (
        State.SUCCEEDED,
        4,
        TOKEN,
        NOW,
    )
    info = back.info(NOW)
    assert info.compact and info.state is State.SUCCEEDED
    m = info.message
    assert (m.id, m.name, m.queue, m.attempt) == ("j1", "t", "q", 2)
    assert (m.args, m.headers, m.errors) == ([], {}, [])
    # the timing is kept as its start; it finished when the record says
    assert info.outcome() == {"started": 990.0, "finished": NOW}
    assert not T.succeed(back, TOKEN, NOW), "final: a late ack changes nothing"

    other = record(State.RUNNING)  # any other result is kept as it is
    assert T.succeed(other, TOKEN, NOW, b'{"error":"e","started":1.5}', compact=True)
    assert Record.load(other.dump()).info(NOW).outcome() == {"error": "e", "started": 1.5}


def test_a_job_holding_a_unique_key_keeps_its_whole_record() -> None:
    rec = record(State.RUNNING)
    rec.msg.key = "k1"
    assert T.succeed(rec, TOKEN, NOW, None, compact=True)
    assert not rec.compact and Record.load(rec.dump()).msg.key == "k1"


def test_a_succeeded_record_written_whole_before_still_loads() -> None:
    """A succeeded record as the engines wrote it before compact records
    (the whole envelope) loads whole, its arguments shown."""
    old = (
        b'{"m":{"id":"j1","kind":"task","name":"t","queue":"q","args":["a"],"attempt":1,'
        b'"max_attempts":3},"s":"succeeded","v":4,"t":7,"r":990.0,"u":1000.0,'
        b'"w":"w-1","l":1030.0,"p":0,"x":"{\\"started\\":995.0,\\"finished\\":999.0}"}'
    )
    rec = Record.load(old)
    info = rec.info(NOW)
    assert not rec.compact and not info.compact and info.message.args == ["a"]
    assert info.state is State.SUCCEEDED and info.worker == "w-1"
    assert info.outcome()["finished"] == 999.0


@pytest.mark.parametrize("state", list(State))
def test_waiting_since_reads_the_run_time_of_a_waiting_record_only(state: State) -> None:
    """The reconcile's light read agrees with a full load: the run time of
    a ready or scheduled record, None for any other state or a compact one."""
    rec = Record(msg=Message(id="j1", kind="task", name="t", queue="q"), state=state, run_at=42.5)
    want = 42.5 if state in T.WAITING else None
    assert Record.waiting_since(rec.dump()) == want
    rec.compact = True
    assert Record.waiting_since(rec.dump()) is None
