"""dumbwaiter: background jobs and events for Python.

    import dumbwaiter as dw

    app = dw.App()                       # sqlite:///dumbwaiter.db, or $DUMBWAITER_URL

    @app.task(retry=dw.Retry(attempts=4))
    def send_welcome(user_id: int) -> None: ...

    send_welcome.enqueue(42)

Nothing here starts a thread or opens a connection on import.
"""

from typing import TYPE_CHECKING, Any

from .app import App
from .context import Context
from .durable import (
    AsyncWorkflowContext,
    DurableWorkflow,
    StepFailed,
    WorkflowCancelled,
    WorkflowCodeChanged,
    WorkflowContext,
    WorkflowRun,
)
from .errors import (
    BrokerAuthError,
    BrokerConfigError,
    BrokerError,
    BrokerUnavailable,
    ConfigurationError,
    DumbwaiterError,
    InvalidArguments,
    InvalidURL,
    JobCancelled,
    JobFailed,
    JobNotFound,
    JobTimeout,
    MissingDependency,
    PayloadTooLarge,
    QueueFull,
    ResultNotKept,
    ResultTimeout,
    SerializationError,
    StateStoreConflict,
    UnknownTask,
    WorkflowFailed,
)
from .job import Job
from .message import Message
from .middleware import Middleware
from .retry import Reject, Retry, RetryLater
from .state import State
from .task import Task
from .version import __version__
from .worker import Worker, WorkerConfig
from .workflow import Workflow, chain, chord, group

if TYPE_CHECKING:
    from .event import Event, Subscription


def __getattr__(name: str) -> Any:
    """``dw.Event`` and ``dw.Subscription`` on first use: they bring pydantic
    (about 11 MB and 90 modules), which a worker of tasks alone never needs."""
    if name in ("Event", "Subscription"):
        from . import event

        return getattr(event, name)
    raise AttributeError(f"module 'dumbwaiter' has no attribute {name!r}")


__all__ = [
    "App",
    "AsyncWorkflowContext",
    "BrokerAuthError",
    "BrokerConfigError",
    "BrokerError",
    "BrokerUnavailable",
    "ConfigurationError",
    "Context",
    "DumbwaiterError",
    "DurableWorkflow",
    "Event",
    "InvalidArguments",
    "InvalidURL",
    "Job",
    "JobCancelled",
    "JobFailed",
    "JobNotFound",
    "JobTimeout",
    "Message",
    "Middleware",
    "MissingDependency",
    "PayloadTooLarge",
    "QueueFull",
    "Reject",
    "ResultNotKept",
    "ResultTimeout",
    "Retry",
    "RetryLater",
    "SerializationError",
    "State",
    "StateStoreConflict",
    "StepFailed",
    "Subscription",
    "Task",
    "UnknownTask",
    "Worker",
    "WorkerConfig",
    "Workflow",
    "WorkflowCancelled",
    "WorkflowCodeChanged",
    "WorkflowContext",
    "WorkflowFailed",
    "WorkflowRun",
    "__version__",
    "chain",
    "chord",
    "group",
]
