"""Tasks: functions registered with ``@app.task``, and the ways to enqueue them.

Everything a caller can get wrong is checked here, at the call that made the
mistake: arguments that do not fit the function's signature, arguments JSON
cannot carry, a message over the size limit, a bad ``eta``.  The worker
checks the signature again, because the code it runs may be newer than the
producer's.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Sized
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, overload

from . import keys
from .blocking import warn_if_loop_running
from .brokers import deadline
from .context import caused_headers, context_param, current_context
from .errors import ConfigurationError, InvalidArguments
from .flow import Flow, digest
from .job import Job
from .message import TASK, Message, check_json, uuid7, uuid7_many
from .retry import Retry
from .typevars import P, R
from .workflow import Signature

if TYPE_CHECKING:
    from .context import Context
    from .ports import Runtime

#: the decorated function's parameters and result (``TaskDecorator``), and the
#: result of a job (``enqueue``'s self type: an async function's awaited value)
_P = ParamSpec("_P")
_R = TypeVar("_R")

#: ``keep_result=True`` keeps results this long (seconds)
DEFAULT_RESULT_TTL = 86400.0


def _epoch(value: datetime | float | int, what: str) -> float:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ConfigurationError(
                f"{what} is a naive datetime; pass a timezone-aware one "
                "(datetime.now(timezone.utc) + ...), so no server clock setting can shift it"
            )
        return value.timestamp()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise ConfigurationError(f"{what} must be an aware datetime or epoch seconds, got {value!r}")


def _seconds(value: float | timedelta, what: str) -> float:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise ConfigurationError(f"{what} must be seconds or a timedelta, got {value!r}")


@dataclass(frozen=True, slots=True)
class SendOptions:
    """Per-call options: ``task.options(delay=..., priority=...)``."""

    delay: float | None = None
    eta: float | None = None
    priority: int | None = None
    key: str | None = None
    queue: str | None = None
    headers: dict[str, Any] | None = None
    #: this call's producer deadline (None: the App's ``enqueue_timeout``)
    enqueue_timeout: float | None = None

    @classmethod
    def make(
        cls,
        delay: float | timedelta | None = None,
        eta: datetime | float | None = None,
        priority: int | None = None,
        key: str | None = None,
        queue: str | None = None,
        headers: dict[str, Any] | None = None,
        enqueue_timeout: float | timedelta | None = None,
    ) -> SendOptions:
        if delay is not None and eta is not None:
            raise ConfigurationError("give delay= or eta=, not both")
        d = None if delay is None else _seconds(delay, "delay")
        if d is not None and d < 0:
            raise ConfigurationError(f"delay must not be negative, got {delay!r}")
        if priority is not None and (not isinstance(priority, int) or isinstance(priority, bool)):
            raise ConfigurationError(f"priority must be an integer, got {priority!r}")
        if key is not None and (not isinstance(key, str) or not key):
            raise ConfigurationError(f"key must be a non-empty string, got {key!r}")
        if queue is not None and (not isinstance(queue, str) or not queue):
            raise ConfigurationError(f"queue must be a non-empty string, got {queue!r}")
        if headers is not None:
            check_json(headers, "headers")
        timeout = None if enqueue_timeout is None else _seconds(enqueue_timeout, "enqueue_timeout")
        if timeout is not None and timeout <= 0:
            raise ConfigurationError(f"enqueue_timeout must be positive, got {enqueue_timeout!r}")
        return cls(
            delay=d,
            eta=None if eta is None else _epoch(eta, "eta"),
            priority=priority,
            key=key,
            queue=queue,
            headers=headers,
            enqueue_timeout=timeout,
        )


_NO_OPTIONS = SendOptions()
#: argument types JSON carries as they are (floats need the NaN check, ints the
#: range check, strings the ASCII one: a lone surrogate cannot be UTF-8)
_SCALARS = frozenset({bool, type(None)})
#: the integers JSON carries here (the range ``check_json`` accepts)
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1
#: ids ``messages`` takes from ``uuid7_many`` at a time
_ID_CHUNK = 512


class Task(Generic[P, R]):
    """A registered function.  Calling it runs it here and now; ``enqueue`` runs it
    on a worker.

    ``Task[P, R]`` has the function's parameters ``P`` and return type ``R``
    (for an async function, its coroutine), so a type checker checks the
    arguments of ``enqueue`` and knows what ``job.result()`` returns.  A task
    whose function takes a ``dw.Context`` is ``Task[..., R]``: a checker
    cannot take that parameter out of the signature, so its arguments are not
    checked (see ``TaskDecorator``).
    """

    def __init__(
        self,
        app: Runtime,
        fn: Callable[..., R],
        *,
        name: str,
        queue: str,
        retry: Retry,
        timeout: float | None,
        priority: int,
        keep_result: float | None,
        options: dict[str, Any],
        flow: Flow | None = None,
    ) -> None:
        self.app = app
        self.fn = fn
        self.name = name
        self.queue = queue
        self.retry = retry
        self.timeout = timeout
        self.priority = priority
        self.keep_result = keep_result
        self.extra = options
        #: rate/concurrency limits, unique, debounce (see flow.py)
        self.flow = flow
        self.is_async = inspect.iscoroutinefunction(fn)
        self.context_param, self.signature = _split_signature(fn)
        self._positional = _positional_shape(self.signature)
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", name)
        self.__wrapped__ = fn

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.queue}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    # -- producing ---------------------------------------------------------

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """A signature for workflows: this call, not made yet; in a chain it
        gets the previous step's result as its first argument."""
        return Signature(self, args, kwargs)

    def si(self, *args: P.args, **kwargs: P.kwargs) -> Signature:
        """An immutable signature: it does not receive the previous result."""
        return Signature(self, args, kwargs, immutable=True)

    def options(self, **kw: Any) -> BoundTask[P, R]:
        """``task.options(delay=, eta=, priority=, key=, queue=, headers=,
        enqueue_timeout=)`` (an unknown keyword raises ``TypeError``)."""
        return BoundTask(self, SendOptions.make(**kw))

    # Each way to enqueue is typed twice: for an async function (``R`` is its
    # coroutine) the job's result is what the coroutine returns; for a sync
    # one, what the function returns.

    @overload
    def enqueue(
        self: Task[P, Coroutine[Any, Any, _R]], *args: P.args, **kwargs: P.kwargs
    ) -> Job[_R]: ...
    @overload
    def enqueue(self: Task[P, _R], *args: P.args, **kwargs: P.kwargs) -> Job[_R]: ...
    def enqueue(self, *args: Any, **kwargs: Any) -> Job[Any]:
        """Run on a worker: store the job and return its handle (sync callers).

        Raises ``BrokerUnavailable`` if the broker cannot be reached within
        the App's ``enqueue_timeout`` (see docs/guarantees.md for whether
        the job may be stored then)."""
        return self._enqueue_one(self.message(args, kwargs, _NO_OPTIONS))

    @overload
    async def aenqueue(
        self: Task[P, Coroutine[Any, Any, _R]], *args: P.args, **kwargs: P.kwargs
    ) -> Job[_R]: ...
    @overload
    async def aenqueue(self: Task[P, _R], *args: P.args, **kwargs: P.kwargs) -> Job[_R]: ...
    async def aenqueue(self, *args: Any, **kwargs: Any) -> Job[Any]:
        """``enqueue`` for async callers."""
        msg = self.message(args, kwargs, _NO_OPTIONS)
        app = self.app
        token = deadline.start(app.enqueue_timeout)
        try:
            if self._direct(msg):
                # _aenqueue_one, inlined: one coroutine less
                return Job(app, (await app.broker.enqueue([msg]))[0])
            return (await self._asender()([msg]))[0]
        finally:
            deadline.end(token)

    # A single enqueue is what a web request makes, so it goes straight to the
    # broker when nothing needs the general path: no flow control (``flow``),
    # no enqueue hook (``MiddlewareStack.enqueue_hooks``), no eager mode (``App.eager``).
    # That skips the sender lookup, the hook checks and the lists
    # ``App._send`` builds for a batch (what that saves per call:
    # docs/benchmarks.md, "Figures behind the core's choices").

    # Every producer call opens its deadline (brokers/deadline.py) around
    # what it asks of the broker: ``timeout``, the call's own, else the
    # App's ``enqueue_timeout``.

    def _enqueue_one(self, msg: Message, timeout: float | None = None) -> Job[Any]:
        warn_if_loop_running(self, "enqueue", 3)
        token = deadline.start(self.app.enqueue_timeout if timeout is None else timeout)
        try:
            return self._enqueue_now(msg)
        finally:
            deadline.end(token)

    async def _aenqueue_one(self, msg: Message, timeout: float | None = None) -> Job[Any]:
        token = deadline.start(self.app.enqueue_timeout if timeout is None else timeout)
        try:
            return await self._aenqueue_now(msg)
        finally:
            deadline.end(token)

    def _direct(self, msg: Message) -> bool:
        """``msg`` may go straight to the broker: no flow control, no
        enqueue hook, no eager mode, no bound on its queue (``max_ready``)."""
        app = self.app
        return (
            self.flow is None
            and not app.middleware.enqueue_hooks
            and not app.eager
            and msg.queue not in app.max_ready
        )

    def _enqueue_now(self, msg: Message) -> Job[Any]:
        app = self.app
        if self._direct(msg):
            broker = app.broker
            if broker.capabilities.sync_enqueue:
                return Job(app, broker.enqueue_sync([msg])[0])
            return Job(app, app._call(broker.enqueue([msg]))[0])
        return self._sender()([msg])[0]

    async def _aenqueue_now(self, msg: Message) -> Job[Any]:
        app = self.app
        if self._direct(msg):
            return Job(app, (await app.broker.enqueue([msg]))[0])
        return (await self._asender()([msg]))[0]

    def _enqueue_many(self, msgs: Iterable[Message], timeout: float | None) -> list[Job[Any]]:
        token = deadline.start(self.app.enqueue_timeout if timeout is None else timeout)
        try:
            return self._sender()(msgs)
        finally:
            deadline.end(token)

    async def _aenqueue_many(
        self, msgs: Iterable[Message], timeout: float | None
    ) -> list[Job[Any]]:
        token = deadline.start(self.app.enqueue_timeout if timeout is None else timeout)
        try:
            return await self._asender()(list(msgs))
        finally:
            deadline.end(token)

    def _sender(self) -> Callable[[Iterable[Message]], list[Job[Any]]]:
        f = self.flow
        if f is not None and (f.debounce is not None or isinstance(f.unique, float)):
            return self.app._send_flow_sync
        return self.app._send_sync

    def _asender(self) -> Callable[[list[Message]], Awaitable[list[Job[Any]]]]:
        f = self.flow
        if f is not None and (f.debounce is not None or isinstance(f.unique, float)):
            return self.app._send_flow
        return self.app._send

    @overload
    def enqueue_many(
        self: Task[..., Coroutine[Any, Any, _R]], calls: Iterable[Any]
    ) -> list[Job[_R]]: ...
    @overload
    def enqueue_many(self: Task[..., _R], calls: Iterable[Any]) -> list[Job[_R]]: ...
    def enqueue_many(self, calls: Iterable[Any]) -> list[Job[Any]]:
        """Enqueue many jobs in one round trip.

        Each item is a tuple of positional arguments, a dict of keyword
        arguments, or any other value as the single argument:
        ``send.enqueue_many([(1,), (2,)])`` or ``send.enqueue_many([1, 2])``.
        """
        warn_if_loop_running(self, "enqueue_many", 2)
        return self._enqueue_many(self.messages(calls, _NO_OPTIONS), None)

    @overload
    async def aenqueue_many(
        self: Task[..., Coroutine[Any, Any, _R]], calls: Iterable[Any]
    ) -> list[Job[_R]]: ...
    @overload
    async def aenqueue_many(self: Task[..., _R], calls: Iterable[Any]) -> list[Job[_R]]: ...
    async def aenqueue_many(self, calls: Iterable[Any]) -> list[Job[Any]]:
        return await self._aenqueue_many(self.messages(calls, _NO_OPTIONS), None)

    def messages(self, calls: Iterable[Any], opts: SendOptions) -> Iterator[Message]:
        """The envelopes of ``enqueue_many``, made one at a time as the broker
        takes them (a bad item raises before anything is stored).

        The same envelopes as ``message`` makes for each call, built cheaper:
        what is the same for the whole batch (queue, eta, priority, the
        headers' cause...) is worked out once, ids come ``_ID_CHUNK`` at a
        time from ``uuid7_many``, and a single plain argument is checked
        inline.  Every message still gets its own ``headers`` dict and
        ``args`` list: flow control, middleware and workflows write into them.
        """
        now = time.time()
        name, max_attempts, key, flow = self.name, self.retry.attempts, opts.key, self.flow
        queue = opts.queue or self.queue
        eta = opts.eta if opts.eta is not None else (now + opts.delay if opts.delay else None)
        priority = self.priority if opts.priority is None else opts.priority
        base = caused_headers(opts.headers)
        fast = self._positional
        # one positional argument fits the signature: a plain one needs no walk
        single = fast is not None and fast[0] <= 1 <= len(fast[1])
        chunk = _ID_CHUNK
        if isinstance(calls, Sized):
            chunk = max(1, min(chunk, len(calls)))
        ids: list[str] = []
        next_id = 0
        kwargs: dict[str, Any]
        for call in calls:
            t = type(call)
            if t is tuple:
                args, kwargs = call, {}
                self.check_arguments(args, kwargs)
                arglist = list(args)
            elif t is dict:
                args, kwargs = (), call
                self.check_arguments(args, kwargs)
                arglist = []
            else:
                args, kwargs = (call,), {}
                if not (
                    single
                    and (
                        call.isascii()
                        if t is str
                        else t in _SCALARS or (t is int and _INT_MIN <= call <= _INT_MAX)
                    )
                ):
                    self.check_arguments(args, kwargs)
                arglist = [call]
            if next_id == len(ids):
                ids, next_id = uuid7_many(chunk), 0
            msg = Message(
                ids[next_id],
                TASK,
                name,
                queue,
                arglist,
                kwargs,
                None,
                dict(base) if base else {},
                0,
                max_attempts,
                now,
                eta,
                priority,
                key,
                [],
            )
            next_id += 1
            if flow is not None:
                self._apply_flow(msg, args, kwargs, now)
            yield msg

    def message(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        opts: SendOptions = _NO_OPTIONS,
        now: float | None = None,
    ) -> Message:
        """Check the arguments and build the envelope (raises at the caller)."""
        self.check_arguments(args, kwargs)
        if now is None:
            now = time.time()
        if opts is _NO_OPTIONS:  # a plain enqueue: the task's defaults, as they are
            eta, queue, priority = None, self.queue, self.priority
            headers = {} if current_context() is None else caused_headers(None)
        else:
            eta = opts.eta if opts.eta is not None else (now + opts.delay if opts.delay else None)
            queue = opts.queue or self.queue
            priority = self.priority if opts.priority is None else opts.priority
            headers = caused_headers(opts.headers)
        msg = Message(  # by position, in the fields' order: cheaper than by keyword
            uuid7(),
            TASK,
            self.name,
            queue,
            list(args),
            kwargs,
            None,
            headers,
            0,
            self.retry.attempts,
            now,
            eta,
            priority,
            opts.key,
            [],
        )
        if self.flow is not None:
            self._apply_flow(msg, args, kwargs, now)
        return msg

    def _apply_flow(
        self, msg: Message, args: tuple[Any, ...], kwargs: dict[str, Any], now: float
    ) -> None:
        """Stamp a message with what its task's flow control needs."""
        f = self.flow
        assert f is not None
        arguments = self.arguments(args, kwargs)
        if f.limit_key is not None:
            try:
                msg.headers["limit_key"] = str(f.limit_key(arguments))
            except Exception as exc:
                raise InvalidArguments(f"limit_key of {self.name} failed: {exc!r}") from exc
        if f.unique is None and f.debounce is None:
            return
        base = keys.DEBOUNCE if f.debounce is not None else keys.UNIQUE
        key = msg.key or f"{base}{self.name}:{digest(arguments)}"
        if f.debounce is not None:
            msg.key, msg.eta = key, now + f.debounce
            msg.headers["unique"] = "queued"
            msg.headers["debounce"] = f.debounce
        elif f.unique == "active":
            msg.key = key
            msg.headers["unique"] = "active"
        else:
            msg.headers["unique_window"] = f.unique
            msg.headers["unique_key"] = key

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The call's arguments by parameter name (what ``limit_key`` receives)."""
        fast = self._positional
        if not kwargs and fast is not None:
            return dict(zip(fast[1], args, strict=False))
        return dict(self.signature.bind(*args, **kwargs).arguments)

    def bind(self, msg: Message) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The call a worker makes from a message (``InvalidArguments`` if its
        arguments no longer fit the signature, e.g. after a deploy changed it)."""
        args, kwargs = msg.args, msg.kwargs
        fast = self._positional
        if not kwargs and fast is not None and fast[0] <= len(args) <= len(fast[1]):
            return tuple(args), {}
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise InvalidArguments(f"{self.name}(): {exc}") from None
        return bound.args, dict(bound.kwargs)

    def check_arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Raise unless ``args``/``kwargs`` fit the signature and are JSON."""
        fast = self._positional
        if not kwargs and fast is not None and fast[0] <= len(args) <= len(fast[1]):
            # the common call, f(1, "x"), without inspect's general (slow) bind
            for pname, value in zip(fast[1], args, strict=False):
                t = type(value)  # plain values need no walk
                if t is str:
                    if value.isascii():  # a non-ASCII one may hold a lone surrogate
                        continue
                elif t in _SCALARS or (t is int and _INT_MIN <= value <= _INT_MAX):
                    continue
                check_json(value, f"argument {pname!r} of {self.name}()")
            return
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise InvalidArguments(f"{self.name}(): {exc}") from None
        for pname, value in bound.arguments.items():
            check_json(value, f"argument {pname!r} of {self.name}()")


class BoundTask(Generic[P, R]):
    """A task with per-call options bound (``task.options(...)``), typed as its task."""

    def __init__(self, task: Task[P, R], opts: SendOptions) -> None:
        self.task = task
        self.opts = opts

    @overload
    def enqueue(
        self: BoundTask[P, Coroutine[Any, Any, _R]], *args: P.args, **kwargs: P.kwargs
    ) -> Job[_R]: ...
    @overload
    def enqueue(self: BoundTask[P, _R], *args: P.args, **kwargs: P.kwargs) -> Job[_R]: ...
    def enqueue(self, *args: Any, **kwargs: Any) -> Job[Any]:
        msg = self.task.message(args, kwargs, self.opts)
        return self.task._enqueue_one(msg, self.opts.enqueue_timeout)

    @overload
    async def aenqueue(
        self: BoundTask[P, Coroutine[Any, Any, _R]], *args: P.args, **kwargs: P.kwargs
    ) -> Job[_R]: ...
    @overload
    async def aenqueue(self: BoundTask[P, _R], *args: P.args, **kwargs: P.kwargs) -> Job[_R]: ...
    async def aenqueue(self, *args: Any, **kwargs: Any) -> Job[Any]:
        msg = self.task.message(args, kwargs, self.opts)
        return await self.task._aenqueue_one(msg, self.opts.enqueue_timeout)

    @overload
    def enqueue_many(
        self: BoundTask[..., Coroutine[Any, Any, _R]], calls: Iterable[Any]
    ) -> list[Job[_R]]: ...
    @overload
    def enqueue_many(self: BoundTask[..., _R], calls: Iterable[Any]) -> list[Job[_R]]: ...
    def enqueue_many(self, calls: Iterable[Any]) -> list[Job[Any]]:
        warn_if_loop_running(self.task, "enqueue_many", 2)
        msgs = self.task.messages(calls, self.opts)
        return self.task._enqueue_many(msgs, self.opts.enqueue_timeout)

    @overload
    async def aenqueue_many(
        self: BoundTask[..., Coroutine[Any, Any, _R]], calls: Iterable[Any]
    ) -> list[Job[_R]]: ...
    @overload
    async def aenqueue_many(self: BoundTask[..., _R], calls: Iterable[Any]) -> list[Job[_R]]: ...
    async def aenqueue_many(self, calls: Iterable[Any]) -> list[Job[Any]]:
        msgs = self.task.messages(calls, self.opts)
        return await self.task._aenqueue_many(msgs, self.opts.enqueue_timeout)


def full_name(app: Runtime, name: str) -> str:
    """The stored name a task name given by a person means.

    A name registered as it is (a task, or an event type with a handler)
    means itself; otherwise the one task whose name ends in ``.name``, so
    ``send_welcome`` finds ``myproject.jobs.send_welcome`` wherever a task
    name is taken (``enqueue``, the job and dead-letter filters, the
    dashboard).  Several such tasks: ``ConfigurationError`` naming them.  A
    name that matches nothing is returned as given: dead letters of a task
    no longer registered still carry its name.
    """
    if name in app.tasks or any(t == name for _, t in app.subscriptions):
        return name
    matches = sorted(n for n in app.tasks if n.rsplit(".", 1)[-1] == name)
    if len(matches) > 1:
        raise ConfigurationError(
            f"task {name!r} is ambiguous: {', '.join(matches)}; give the full name"
        )
    return matches[0] if matches else name


class TaskDecorator(Protocol):
    """What ``@app.task(...)`` with options returns: it makes a function a
    ``Task`` typed with the function's parameters and return type.

    A function that takes a ``dw.Context`` (first, or last after up to four
    other positional parameters) becomes ``Task[..., R]``: its return type is
    kept, its arguments are not checked, because a type checker cannot remove
    the context from the signature.  Reach the context with
    ``dw.Context.current()`` instead to have them checked.
    """

    @overload
    def __call__(self, fn: Callable[Concatenate[Context, ...], _R], /) -> Task[..., _R]: ...
    @overload
    def __call__(self, fn: Callable[[Any, Context], _R], /) -> Task[..., _R]: ...
    @overload
    def __call__(self, fn: Callable[[Any, Any, Context], _R], /) -> Task[..., _R]: ...
    @overload
    def __call__(self, fn: Callable[[Any, Any, Any, Context], _R], /) -> Task[..., _R]: ...
    @overload
    def __call__(self, fn: Callable[[Any, Any, Any, Any, Context], _R], /) -> Task[..., _R]: ...
    @overload
    def __call__(self, fn: Callable[_P, _R], /) -> Task[_P, _R]: ...


def _positional_shape(sig: inspect.Signature) -> tuple[int, tuple[str, ...]] | None:
    """(required count, names) when every parameter is plain positional-or-keyword
    (no ``*args``, ``**kwargs`` or keyword-only ones), else None."""
    params = list(sig.parameters.values())
    if any(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params):
        return None
    required = sum(1 for p in params if p.default is inspect.Parameter.empty)
    if any(p.default is inspect.Parameter.empty for p in params[required:]):
        return None
    return required, tuple(p.name for p in params)


def _split_signature(fn: Callable[..., Any]) -> tuple[str | None, inspect.Signature]:
    """The name of the parameter that takes a ``Context`` (if any), and the
    signature a caller must match (without that parameter)."""
    sig = inspect.signature(fn)
    ctx_param = context_param(fn)
    if ctx_param is None:
        return None, sig
    params = [p for p in sig.parameters.values() if p.name != ctx_param]
    return ctx_param, sig.replace(parameters=params)
