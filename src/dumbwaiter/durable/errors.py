"""What durable workflows raise.

They join the one hierarchy of ``dumbwaiter.errors``: a failed run's
``result()`` raises ``WorkflowFailed`` (``dumbwaiter.errors``, the class a
failed chain, group or chord raises too), which is a ``JobFailed``, so code
that waits on jobs, pipelines and runs alike catches one class.
"""

from __future__ import annotations

from typing import Any

from ..errors import (
    ConfigurationError,
    DumbwaiterError,
    JobCancelled,
    JobNotFound,
    WorkflowFailed,
)


class StepFailed(DumbwaiterError):
    """Raised inside workflow code when a step failed for good (its retries
    used up, or ``dw.Reject``).

    The original exception cannot be rebuilt when the run replays (only its
    type name and message are checkpointed), so the workflow sees this class
    on the first run and on every replay alike: catch ``StepFailed`` and
    look at ``type`` (the exception's qualified name) to decide.
    """

    def __init__(self, step: str, type: str, message: str) -> None:
        self.step = step
        self.type = type
        self.message = message
        super().__init__(f"step {step!r} failed: {type}: {message}")

    @classmethod
    def from_record(cls, step: str, error: dict[str, Any]) -> StepFailed:
        return cls(step, str(error.get("type", "?")), str(error.get("message", "")))


class StepTimeout(DumbwaiterError, TimeoutError):
    """One attempt of a step ran longer than its ``timeout=``."""


class WorkflowCodeChanged(DumbwaiterError):
    """A replay met a step the run did not record at that place: the code was
    changed under a run in flight (see "Versioning" in
    docs/durable-workflows.md).  The run fails without compensating, so
    ``dumbwaiter workflows retry`` can resume it once the old order is back."""


class WorkflowCancelled(JobCancelled):
    """``WorkflowRun.result()`` of a run that was cancelled."""


class WorkflowNotFound(JobNotFound):
    """No run with this id is stored (never started, or pruned after retention)."""


class WorkflowStateError(ConfigurationError):
    """An operation that the run's state does not allow (retrying a run that
    succeeded, signalling a run that waits for no event...)."""


__all__ = [
    "StepFailed",
    "StepTimeout",
    "WorkflowCancelled",
    "WorkflowCodeChanged",
    "WorkflowFailed",
    "WorkflowNotFound",
    "WorkflowStateError",
]
