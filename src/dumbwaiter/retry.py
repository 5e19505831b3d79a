"""Retry policy and the two exceptions a task raises to steer its own fate.

The default schedule is the proven one (DESIGN §3): 4 attempts, waits of
5 s, 30 s and 5 min between them, each spread by jitter so a thousand jobs
that failed together against the same outage do not all come back in the
same second.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta

from .errors import ConfigurationError

ExcTypes = tuple[type[BaseException], ...]


def _seconds(value: float | timedelta, what: str) -> float:
    s = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if s < 0:
        raise ConfigurationError(f"{what} must not be negative, got {value!r}")
    return s


@dataclass(frozen=True, slots=True)
class Retry:
    """How often a failing job is tried again, and how long to wait in between.

    ``attempts`` counts every run, the first included (``attempts=1``: never
    retried).  ``backoff`` gives the wait after the 1st, 2nd, ... failure; the
    last value repeats when there are more attempts than waits.  ``jitter`` is a
    fraction: each wait is multiplied by a random factor in ``[1 - jitter,
    1 + jitter]``.  Exceptions in ``dead_on`` dead-letter at once; others are
    retried only if they are instances of ``retry_on``.
    """

    attempts: int = 4
    backoff: tuple[float, ...] = (5.0, 30.0, 300.0)
    jitter: float = 0.2
    retry_on: ExcTypes = (Exception,)
    dead_on: ExcTypes = field(default=())

    def __init__(
        self,
        attempts: int = 4,
        backoff: float | timedelta | Iterable[float | timedelta] = (5.0, 30.0, 300.0),
        jitter: float = 0.2,
        retry_on: type[BaseException] | Iterable[type[BaseException]] = (Exception,),
        dead_on: type[BaseException] | Iterable[type[BaseException]] = (),
    ) -> None:
        if not isinstance(attempts, int) or attempts < 1:
            raise ConfigurationError(f"Retry(attempts=) must be an integer >= 1, got {attempts!r}")
        waits = (backoff,) if isinstance(backoff, int | float | timedelta) else tuple(backoff)
        if not waits:
            raise ConfigurationError("Retry(backoff=) needs at least one wait")
        if not 0.0 <= float(jitter) <= 1.0:
            raise ConfigurationError(f"Retry(jitter=) is a fraction in [0, 1], got {jitter!r}")
        object.__setattr__(self, "attempts", attempts)
        object.__setattr__(self, "backoff", tuple(_seconds(w, "a Retry wait") for w in waits))
        object.__setattr__(self, "jitter", float(jitter))
        object.__setattr__(self, "retry_on", _exc_tuple(retry_on, "retry_on"))
        object.__setattr__(self, "dead_on", _exc_tuple(dead_on, "dead_on"))

    @classmethod
    def never(cls) -> Retry:
        """One attempt; a failure goes straight to the dead-letter queue."""
        return cls(attempts=1)

    def wait(self, attempt: int) -> float:
        """Seconds to wait after attempt ``attempt`` (1-based) failed, jitter applied."""
        base = self.backoff[min(attempt, len(self.backoff)) - 1]
        if self.jitter and base:
            base *= random.uniform(1.0 - self.jitter, 1.0 + self.jitter)
        return base

    def should_retry(self, exc: BaseException, attempt: int, max_attempts: int) -> bool:
        """Whether a job whose attempt ``attempt`` raised ``exc`` gets another one."""
        if attempt >= max_attempts:
            return False
        if self.dead_on and isinstance(exc, self.dead_on):
            return False
        return isinstance(exc, self.retry_on)


def _exc_tuple(value: object, what: str) -> ExcTypes:
    items = (value,) if isinstance(value, type) else tuple(value)  # type: ignore[arg-type]
    for item in items:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise ConfigurationError(f"Retry({what}=) takes exception classes, got {item!r}")
    return items


class JobControl(Exception):
    """Base of the exceptions a task raises to choose its own outcome."""


class RetryLater(JobControl):
    """Raised inside a task: try this job again ``after`` seconds from now.

    It uses up one attempt like a failure does (so a task cannot loop
    forever), and it is recorded in the job's history with its reason.
    """

    def __init__(self, after: float | timedelta = 0.0, reason: str = "") -> None:
        self.after = _seconds(after, "RetryLater(after=)")
        self.reason = reason
        super().__init__(reason or f"retry requested in {self.after:g} s")


class Reject(JobControl):
    """Raised inside a task: this job can never succeed; dead-letter it now."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)
