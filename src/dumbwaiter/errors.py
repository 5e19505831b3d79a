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
    """The broker failed an operation (connection lost, server error)."""
