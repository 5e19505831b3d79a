"""Log formats: the text line people read and JSON lines machines read.

The worker logs one line per finished job (see ``Worker._finished``) with
its facts as ``extra`` fields on the record (``JOB_FIELDS``), so any
formatter can pick them up: ``JsonFormatter`` here writes them with stable
keys, one JSON object per line, and a user's own JSON formatter (they read a
record's extra attributes) finds them under the same names.

The command line sets the format for the whole process (``dumbwaiter worker
--log-format json``): every line, a library's warning included, is then
JSON, so a log shipper never meets a line it cannot parse.  A ``Worker``
embedded in a program leaves logging to that program unless its
``WorkerConfig.log_format`` asks for a format (``install``).
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from typing import Any, Final

import orjson

#: the formats ``--log-format`` and ``WorkerConfig.log_format`` take
FORMATS: Final = ("text", "json")
#: the environment variable of ``--log-format``
FORMAT_ENV: Final = "DUMBWAITER_LOG_FORMAT"
#: the text format: the pid tells the processes of ``--processes N`` (and
#: replicas on one host) apart
TEXT_FORMAT: Final = "%(asctime)s %(levelname)-7s %(name)s [%(process)d] %(message)s"

#: ``event`` of the line a worker writes when a job finished
JOB_FINISHED: Final = "job_finished"
#: what a finished-job line carries, on the record and in JSON (None: not
#: applicable, e.g. ``error_type`` of a success); ``retry_in_s`` is set when
#: ``outcome`` is ``retrying``
JOB_FIELDS: Final = (
    "task",
    "job_id",
    "queue",
    "attempt",
    "max_attempts",
    "duration_ms",
    "outcome",
    "retry_in_s",
    "error_type",
    "error",
)
#: outcomes of a finished job (``cancelled``: for a running job cancelled
#: cooperatively, which no worker path reports yet)
SUCCEEDED, RETRYING, DEAD, CANCELLED = "succeeded", "retrying", "dead", "cancelled"


class JsonFormatter(logging.Formatter):
    """One JSON object per line.

    Every line has ``ts`` (ISO 8601, UTC, milliseconds), ``level``,
    ``logger``, ``event`` (``job_finished`` for a finished job, the line's
    ``action`` for the worker's other lines, else ``log``), ``message`` (the
    text line) and ``pid``; a finished job's line also has every key of
    ``JOB_FIELDS``; a line logged with an exception has ``exc`` (the
    traceback).  orjson writes it: no line can break the JSON, whatever the
    message holds.
    """

    def format(self, record: logging.LogRecord) -> str:
        attrs = record.__dict__
        event = attrs.get("event") or attrs.get("action") or "log"
        out: dict[str, Any] = {
            "ts": _iso(record.created),
            "level": record.levelname,
            "logger": record.name,
            "event": event,
            "message": record.getMessage(),
            "pid": record.process,
        }
        if event == JOB_FINISHED:
            for key in JOB_FIELDS:
                out[key] = attrs.get(key)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        return orjson.dumps(out, default=str).decode()


def _iso(created: float) -> str:
    whole = int(created)
    ms = int((created - whole) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{ms:03d}Z"


def formatter(fmt: str) -> logging.Formatter:
    """The formatter of ``fmt`` (``text`` or ``json``)."""
    if fmt == "json":
        return JsonFormatter()
    if fmt == "text":
        return logging.Formatter(TEXT_FORMAT)
    raise ValueError(f"unknown log format {fmt!r}; use one of {', '.join(FORMATS)}")


def setup(level: str, fmt: str = "text") -> None:
    """The log setup of a long-running command: ``level`` and ``fmt`` for
    every logger of the process, on stderr (as ``logging.basicConfig``:
    nothing changes if the root logger has handlers already)."""
    logging.basicConfig(level=level.upper(), handlers=[_handler(fmt)])


@dataclass(slots=True)
class Installed:
    """A handler ``install`` added, and what it changed, to put back."""

    handler: logging.Handler
    propagate: bool
    level: int

    def remove(self) -> None:
        logger = logging.getLogger("dumbwaiter")
        logger.removeHandler(self.handler)
        logger.propagate = self.propagate
        logger.setLevel(self.level)


def install(fmt: str) -> Installed:
    """Write the ``dumbwaiter`` loggers' lines to stderr in ``fmt`` (an
    embedded worker whose ``WorkerConfig.log_format`` is set): INFO and up
    unless the logger has a level, and no longer passed on to the program's
    own handlers, which would write them a second time.  ``remove()`` on the
    result undoes it."""
    logger = logging.getLogger("dumbwaiter")
    done = Installed(_handler(fmt), logger.propagate, logger.level)
    logger.addHandler(done.handler)
    logger.propagate = False
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    return done


def _handler(fmt: str) -> logging.Handler:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(fmt))
    return handler
