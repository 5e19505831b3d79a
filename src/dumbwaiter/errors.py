"""One exception hierarchy for everything dumbwaiter raises.

Each class also derives from the built-in exception a caller would expect
(``TypeError`` for arguments JSON cannot carry, ``ValueError`` for a payload
that is too large, ``TimeoutError`` for timeouts), so code that already
catches the built-in keeps working.
"""

from __future__ import annotations


class DumbwaiterError(Exception):
    """Base class of every error dumbwaiter raises itself."""


class ConfigurationError(DumbwaiterError, ValueError):
    """The app, a task or a broker was configured with a value that cannot work."""


class StateStoreConflict(ConfigurationError):
    """This process would keep its job state in another store than the
    processes already sharing its broker namespace (RabbitMQ: the vhost and
    prefix).  Two stores for one namespace split the truth: each sees half
    the jobs' records, locks, limits and unique keys, and nothing else
    warns.  A configuration error, not a ``BrokerError``: trying again
    cannot help, and a worker must stop rather than back off and retry.
    The message names both stores (passwords masked) and the fix;
    ``ours`` and ``theirs`` are those descriptions (``theirs`` is None when
    the announcement could not be read)."""

    def __init__(self, message: str, *, ours: str = "", theirs: str | None = None) -> None:
        super().__init__(message)
        self.ours = ours
        self.theirs = theirs


class InvalidURL(ConfigurationError):
    """A broker URL that names no supported scheme or cannot be parsed."""


class MissingDependency(ConfigurationError, ImportError):
    """A broker's optional dependency is not installed; the message names the pip line."""


class SerializationError(DumbwaiterError, TypeError):
    """A value JSON cannot carry was passed to enqueue or publish (the message names it)."""


class PayloadTooLarge(DumbwaiterError, ValueError):
    """An encoded message is larger than the configured maximum."""


class InvalidArguments(DumbwaiterError, TypeError):
    """The arguments do not match the task function's signature."""


class UnknownTask(DumbwaiterError, LookupError):
    """A message names a task this process has not registered."""


class MessageDecodeError(DumbwaiterError, ValueError):
    """A message body is not a valid dumbwaiter envelope."""


class JobTimeout(DumbwaiterError, TimeoutError):
    """A job ran longer than its task's ``timeout``."""


class LeaseExpired(DumbwaiterError):
    """The worker holding a job stopped heartbeating (it was killed or stalled)."""


class JobFailed(DumbwaiterError):
    """``Job.result()`` of a job that ended in the dead-letter queue."""


class WorkflowFailed(JobFailed):
    """``Workflow.result()`` of a workflow that cannot finish: one of its steps
    is dead (or was cancelled).  The message names the step, its task, its
    error and the dead job; the same facts are attributes, for code."""

    def __init__(
        self,
        message: str,
        *,
        workflow_id: str = "",
        step: str = "",
        task: str = "",
        job_id: str = "",
        error_type: str | None = None,
        error: str | None = None,
    ) -> None:
        super().__init__(message)
        self.workflow_id = workflow_id
        #: the step's place: ``"1"`` (the second step), ``"1.3"`` (member 3 of
        #: the group that is step 1), ``"1.then"`` (that chord's callback)
        self.step = step
        self.task = task
        self.job_id = job_id
        #: the last attempt's exception type and message (None: cancelled)
        self.error_type = error_type
        self.error = error


class JobCancelled(DumbwaiterError):
    """``Job.result()`` of a cancelled job; also what ``ctx.raise_if_cancelled()``
    raises inside a handler whose job a user asked to cancel while it ran."""


class ResultNotKept(DumbwaiterError):
    """``Job.result()`` of a job whose task does not keep results (``keep_result``)."""


class ResultTimeout(DumbwaiterError, TimeoutError):
    """``Job.result(timeout=...)`` waited and the job had not finished."""


class JobNotFound(DumbwaiterError, LookupError):
    """No job with this id is stored (never enqueued, or pruned after its retention)."""


class BrokerError(DumbwaiterError):
    """The broker failed an operation (connection lost, server error).

    Every failure a broker call can meet is one of these (the client
    library's own exception is its ``__cause__``); the subclasses below say
    whether trying again can help.  ``server`` names the server (its URL
    without password or options) where the broker knows it."""

    server: str | None = None


class BrokerUnavailable(BrokerError, ConnectionError):
    """The broker could not be reached within the call's deadline: refused,
    timed out, restarting, or (SQLite) its file locked by another writer.

    The same call may succeed later.  A producer call (``enqueue``,
    ``publish``...) raises it after ``App(enqueue_timeout=...)`` seconds;
    docs/guarantees.md says, per broker, whether its jobs may have been
    stored."""


class QueueFull(BrokerError):
    """The queue holds ``max_ready`` waiting jobs (ready, scheduled or
    retrying) already: this call's jobs were not enqueued, none of them.

    Raised to the producer, never a silent drop.  A ``BrokerError`` on
    purpose: code that already backs off or answers 503 on
    ``except dw.BrokerError`` handles a full queue the same way, and the
    same call may succeed later, once workers drained some jobs.  With
    ``when_full="wait"`` the call waits for room up to its deadline
    (``enqueue_timeout``) before raising it.  ``queue``, ``limit``,
    ``waiting`` (jobs counted when refused) and ``asked`` (jobs this call
    tried to add) are attributes, for code."""

    def __init__(self, queue: str, limit: int, waiting: int, asked: int) -> None:
        super().__init__(
            f"queue {queue!r} is full: {waiting} job(s) wait and max_ready={limit}, so "
            f"{asked} more cannot be enqueued (nothing was stored). Add workers for "
            f"{queue!r} (dumbwaiter stats shows its backlog and desired workers), slow "
            "the producer and retry later, use when_full='wait', or raise max_ready"
        )
        self.queue = queue
        self.limit = limit
        self.waiting = waiting
        self.asked = asked


class BrokerConfigError(BrokerError):
    """The broker was reached and refuses what the URL asks, for good: a
    database or vhost that does not exist, a file that is not a database.
    Raised at the first call, never retried: fix the URL or the server."""


class BrokerAuthError(BrokerConfigError):
    """The broker refused the URL's credentials (unknown user, wrong password)."""
