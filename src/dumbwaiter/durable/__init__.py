"""Durable workflows: named steps that survive crashes, sleeps of days and
waits for events (``@app.workflow``; docs/durable-workflows.md).

* ``context``: the ``ctx`` a workflow function receives;
* ``replay``: what each ``ctx`` operation does against checkpoints;
* ``store``: where a run lives (the broker's key-value store);
* ``jobs``: the jobs that carry a run, one segment at a time;
* ``runner``: one segment, from opening the run to parking or ending it;
* ``events``: waiters, and the router that wakes them on published events;
* ``api``: ``@app.workflow``, starting runs, their handles;
* ``admin``: list, describe, cancel, retry, signal (the CLI's operations).
"""

from .api import BoundWorkflow, DurableWorkflow, WorkflowRun
from .context import AsyncWorkflowContext, WorkflowContext
from .errors import (
    StepFailed,
    StepTimeout,
    WorkflowCancelled,
    WorkflowCodeChanged,
    WorkflowFailed,
    WorkflowNotFound,
    WorkflowStateError,
)

__all__ = [
    "AsyncWorkflowContext",
    "BoundWorkflow",
    "DurableWorkflow",
    "StepFailed",
    "StepTimeout",
    "WorkflowCancelled",
    "WorkflowCodeChanged",
    "WorkflowContext",
    "WorkflowFailed",
    "WorkflowNotFound",
    "WorkflowRun",
    "WorkflowStateError",
]
