"""Job states, named once (DESIGN §2, lifecycle)."""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    """Where a job is in its lifecycle.

    ``scheduled`` (eta in the future) -> ``ready`` -> ``running`` (leased) ->
    ``succeeded``, or ``retrying`` (scheduled again after a failed attempt),
    or ``dead``; ``cancelled`` from any state before ``running``, or from
    ``running`` when its handler stops on a cancel request (``dumbwaiter.cancel``).
    A StrEnum, so ``job.status() == "succeeded"`` works.
    """

    SCHEDULED = "scheduled"
    READY = "ready"
    RUNNING = "running"
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"


#: states a job never leaves by itself
FINAL_STATES = frozenset({State.SUCCEEDED, State.DEAD, State.CANCELLED})
#: states a job may still be cancelled from
CANCELLABLE_STATES = frozenset({State.SCHEDULED, State.READY, State.RETRYING})
