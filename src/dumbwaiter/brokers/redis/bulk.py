"""Enqueue: encoding, pipelining, staging, retries, for sync and async callers.

The seam's rule is that a batch is stored whole or not at all when a message
is too large or the caller's iterator raises, and a producer must not block
for long on one encoding pass before anything reaches the server.  So:

* one job without a key (the usual ``task.enqueue``) is one call of
  ``enqueue_one.lua``, the same transition in fewer server-side calls;
* a batch of at most ``CHUNK`` jobs is encoded, then sent as one enqueue
  script call;
* a bigger batch is **staged**: each chunk is sent as soon as it is encoded
  (the server stores it while the next one is encoded, which is what makes a
  bulk enqueue fast on a small machine), into no set a worker reads; one
  commit script then publishes them all.  If the iterator raises, the staged
  jobs are deleted (``unstage``) and the error re-raised.  Chunks with unique
  keys are not staged (a staged key would be visible to other producers):
  they are sent after the commit, once everything is encoded;
* a connection lost on the way (or a script the server forgot) turns a bulk
  enqueue into the plain form: undo what was staged, send every chunk in one
  pipeline, and retry that with backoff until the producer's deadline (or
  for ``reconnect`` seconds, see ``deadline.py``).  Resending is safe: a job
  is never stored twice (same id, same key).

The steps are written once, as a plan (a generator of I/O requests: send a
command, read a reply, sleep, drop the connection) that ``drive`` runs on a
sync or an asyncio link (``events.publish`` is a plan too).  The usual single
job skips the plan: its one script call is made directly, and only a failed
call continues as a plan (``Enqueue.after_failure``), which retries it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Coroutine, Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from redis.exceptions import MovedError, NoScriptError, RedisError

from ...message import TASK, Message, encode_checked, encode_checked_text, uuid7
from ..clock import ServerClock
from ..deadline import Backoff
from .connection import TRANSIENT, Arg, AsyncLink, Connection, SyncLink, checked
from .lua import Script

log = logging.getLogger("dumbwaiter.redis")
T = TypeVar("T")

#: what a plan asks its driver for: ("send", command), ("read",), ("reset",)
#: (drop the connection, take another), ("sleep", seconds); the reply (or
#: None) is sent back in
Request = tuple[Any, ...]
Plan = Generator[Request, Any, T]

#: jobs per enqueue script call
CHUNK = 1000
#: seconds a producer may take between staging a bulk enqueue and committing
#: it; after that the rescuer deletes what it staged (the producer died)
STAGE_TTL = 600.0


@dataclass(slots=True)
class Chunk:
    """Up to ``CHUNK`` encoded jobs: groups of (count, queue, name, priority,
    run_at, scheduled, max_attempts, keyed) then id, [key, unique,] body per
    job (``unique``: the ``unique`` header, see enqueue.lua), and the jobs'
    ids in order (the script names only the jobs that got another id);
    ``more``: another message followed it (so the batch is staged)."""

    args: list[Arg]
    keyed: bool
    ids: list[str]
    more: bool = False


#: a clock never read from a server: this host's (``encode`` without a connection)
HOST_CLOCK = ServerClock()


def encode(
    msgs: Iterable[Message], limit: int | None, clock: ServerClock = HOST_CLOCK
) -> Iterator[Chunk]:
    """The messages as enqueue script arguments, one chunk at a time.

    Consecutive jobs that share queue, task, priority, run time and attempts
    form one group: one header, then id and body per job (a bulk enqueue of
    one task is one group), which keeps both the packing here and the parsing
    on the server short.  Encoding size-checks each message.  Run times are
    on the server's ``clock``.
    """
    now = clock.now()
    snow = repr(now)
    args: list[Arg] = []
    ids: list[str] = []
    keyed = False
    group: tuple[Any, ...] | None = None
    head = count = size = 0
    for m in msgs:
        # kept as text, one copy of orjson's result (see encode_checked:
        # holding thousands of orjson's own objects is dear); the same
        # bytes travel
        body = encode_checked_text(m, limit)
        eta = None if m.eta is None else clock.to_server(m.eta)
        if eta is not None and eta > now:
            sched, ra = b"1", repr(eta)
        else:
            sched, ra = b"0", snow
        key = m.key if m.key is not None and m.kind == "task" else None
        g = (m.queue, m.name, m.priority, ra, sched, m.max_attempts, key is not None)
        if size == CHUNK:
            args[head] = count
            yield Chunk(args, keyed, ids, True)
            args, ids, keyed, group, size = [], [], False, None, 0
        if g != group:
            if group is not None:
                args[head] = count
            head, count, group = len(args), 0, g
            args += (0, *g[:6], b"0" if key is None else b"1")
        if key is None:
            args += (m.id, body)
        else:
            unique = m.headers.get("unique", "") if m.headers else ""
            args += (m.id, key, unique if unique in ("active", "queued") else "", body)
            keyed = True
        ids.append(m.id)
        count += 1
        size += 1
    if group is not None:
        args[head] = count
        yield Chunk(args, keyed, ids)


class _SourceFailed(Exception):
    """The caller's iterator (or an encoding) raised: re-raise it as it was."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _next_chunk(chunks: Iterator[Chunk]) -> Chunk | None:
    try:
        return next(chunks)
    except StopIteration:
        return None
    except BaseException as exc:
        raise _SourceFailed(exc) from exc


def ids_of(reply: Any, sent: list[str]) -> list[str]:
    """The ids of the jobs ``sent`` in one enqueue script call: their own,
    except where the reply names the job that holds the same key
    (position, id pairs; see enqueue.lua)."""
    if isinstance(reply, BaseException):
        raise reply
    if not reply:
        return sent
    ids = list(sent)
    for k in range(0, len(reply), 2):
        ids[int(reply[k]) - 1] = reply[k + 1].decode()
    return ids


def _staged_elsewhere(reply: Any, chunk: Chunk) -> set[int]:
    """Positions (1-based) that a staging call's reply names with the job's
    own id: jobs another open bulk enqueue had staged (see enqueue.lua)."""
    if not reply:
        return set()
    pairs = ((int(reply[k]), reply[k + 1]) for k in range(0, len(reply), 2))
    return {p for p, i in pairs if i.decode() == chunk.ids[p - 1]}


def _regroup(chunk: Chunk, positions: set[int]) -> list[Arg]:
    """Enqueue script arguments for the jobs at ``positions`` of ``chunk``,
    each a group of its own (count, the seven group fields, id, body)."""
    if not positions:
        return []
    a = chunk.args
    out: list[Arg] = []
    i = pos = 0
    while i < len(a):
        count, head = int(a[i]), a[i + 1 : i + 8]
        step = 4 if head[6] == b"1" else 2
        i += 8
        for _ in range(count):
            pos += 1
            if pos in positions:
                out += (1, *head, *a[i : i + step])
            i += step
    return out


class Enqueue:
    """One enqueue call's steps (see the module docstring)."""

    def __init__(self, conn: Connection, msgs: Iterable[Message], limit: int | None) -> None:
        self.conn = conn
        self.lua = conn.lua
        self.tag = conn.keys.tag
        self.source = encode(msgs, limit, conn.clock)
        self.chunks: list[Chunk] = []
        #: replies the server still owes on the connection (staged way)
        self.unread = 0

    def _cmd(self, chunk: Chunk, mode: bytes = b"", call: str = "") -> tuple[Arg, ...]:
        s = self.lua.enqueue
        now = self.conn.clock.now()
        deadline = repr(now + STAGE_TTL) if mode == b"stage1" else ""
        return (b"EVALSHA", s.sha, 1, self.tag, repr(now), mode, call, deadline,
                *chunk.args)  # fmt: skip

    def _script(self, name: str, *args: Arg) -> tuple[Arg, ...]:
        s = getattr(self.lua, name)
        return (b"EVALSHA", s.sha, 1, self.tag, *args)

    def plan(self) -> Plan[list[str]]:
        try:
            first = _next_chunk(self.source)
        except _SourceFailed as failed:  # nothing was sent
            raise failed.exc from None
        if first is not None:
            self.chunks.append(first)
        if first is None or not first.more:
            return (yield from self._plain(None))
        # a chunk is yielded once the next message is seen: more are coming,
        # so the first is staged now, while the second is encoded
        call = uuid7()
        self.unread = 0
        try:
            return (yield from self._staged(call))
        except _SourceFailed as failed:
            # read what the server still owes on this connection first, so
            # the undo runs after every chunk it stored
            try:
                while self.unread:
                    self.unread -= 1
                    yield ("read",)
            except (RedisError, OSError):
                yield ("reset",)
            yield from self._undo(call)
            raise failed.exc from None
        except (RedisError, OSError) as exc:
            log.info("bulk enqueue: staging failed (%s); sending it the plain way", exc)
            yield ("reset",)
        # the staged way failed (connection lost, script flushed, MOVED...):
        # encode the rest, then undo and send it all the plain way, retrying
        while (chunk := _next_chunk(self.source)) is not None:
            self.chunks.append(chunk)
        return (yield from self._plain(call))

    def _send(self, cmd: tuple[Arg, ...]) -> Generator[Request, Any, None]:
        yield ("send", cmd)
        self.unread += 1

    def _read(self) -> Generator[Request, Any, Any]:
        reply = yield ("read",)
        self.unread -= 1
        return checked(reply)

    def _staged(self, call: str) -> Plan[list[str]]:
        """Stage chunks as they are encoded (one reply outstanding at most),
        then commit, then send the keyed chunks."""
        replies: dict[int, Any] = {}
        sent: list[int] = []
        # make sure the server knows the scripts: then NOSCRIPT cannot cut
        # the stream short (unless they are flushed meanwhile: the plain way)
        scripts = (self.lua.enqueue, self.lua.commit, self.lua.unstage)
        for s in scripts:
            yield from self._send((b"SCRIPT", b"LOAD", s.source))
        i = 0
        loaded = 0
        while True:
            if i == len(self.chunks):
                chunk = _next_chunk(self.source)
                if chunk is None:
                    break
                self.chunks.append(chunk)
            if not self.chunks[i].keyed:
                mode = b"stage" if sent else b"stage1"
                yield from self._send(self._cmd(self.chunks[i], mode, call))
                sent.append(i)
                while loaded < len(scripts):
                    yield from self._read()
                    loaded += 1
                if len(sent) - len(replies) > 1:
                    replies[sent[len(replies)]] = yield from self._read()
            i += 1
        while loaded < len(scripts):
            yield from self._read()
            loaded += 1
        while len(replies) < len(sent):
            replies[sent[len(replies)]] = yield from self._read()
        return (yield from self._commit(call, sent, replies))

    def _commit(self, call: str, sent: list[int], replies: dict[int, Any]) -> Plan[list[str]]:
        """Publish what ``call`` staged (chunks ``sent``, whose ``replies``
        are read), then send the keyed chunks; the ids of the batch."""
        keyed = [k for k, c in enumerate(self.chunks) if c.keyed]
        # jobs another open bulk enqueue had staged: published only if that
        # one commits, so sent again the plain way after this commit (never
        # before: this batch must not be half visible if it fails)
        again = [
            a
            for k in sent
            for a in _regroup(self.chunks[k], _staged_elsewhere(replies[k], self.chunks[k]))
        ]
        yield ("send", self._script("commit", repr(self.conn.clock.now()), call))
        if again:
            yield ("send", self._cmd(Chunk(again, False, [])))
        for k in keyed:
            yield ("send", self._cmd(self.chunks[k]))
        if self.conn.wait_replicas:
            yield ("send", self.conn.wait())
        checked((yield ("read",)))
        if again:
            checked((yield ("read",)))  # names nothing: no key in a staged chunk
        for k in keyed:
            replies[k] = checked((yield ("read",)))
        if self.conn.wait_replicas:
            self._confirmed((yield ("read",)))
        return [i for k, c in enumerate(self.chunks) for i in ids_of(replies[k], c.ids)]

    def _confirmed(self, reply: Any) -> None:
        self.conn.confirmed(reply, "enqueue", "enqueueing the same jobs")

    def _undo(self, call: str) -> Generator[Request, Any, None]:
        """Delete what ``call`` staged; if the server is gone, the rescuer
        does it after STAGE_TTL."""
        try:
            yield ("send", self._script("unstage", call))
            if isinstance((yield ("read",)), NoScriptError):
                yield ("send", (b"EVAL", self.lua.unstage.source, 1, self.tag, call))
                yield ("read",)
        except (RedisError, OSError) as exc:
            log.warning("could not undo a failed bulk enqueue now (%s); it expires by itself", exc)

    def after_failure(self, exc: BaseException) -> Plan[list[str]]:
        """The plan of a single-job call that failed with ``exc`` (one of
        ``TRANSIENT``): wait as after any failed try, then go on as the
        plain way."""
        backoff = Backoff(self.conn.reconnect)
        yield ("sleep", self.conn.pause_or_raise(backoff, exc, "enqueue"))
        while (chunk := _next_chunk(self.source)) is not None:
            self.chunks.append(chunk)
        return (yield from self._plain(None, backoff))

    def _plain(self, staged: str | None, backoff: Backoff | None = None) -> Plan[list[str]]:
        """Every chunk in one pipeline (after undoing ``staged``), retried
        with backoff while the server is unreachable or restarting."""
        backoff = backoff or Backoff(self.conn.reconnect)
        while True:
            try:
                cmds = [self._cmd(c) for c in self.chunks]
                if staged is not None:
                    cmds.insert(0, self._script("unstage", staged))
                if self.conn.wait_replicas:
                    cmds.append(self.conn.wait())
                for cmd in cmds:
                    yield ("send", cmd)
                replies = []
                for _ in cmds:
                    replies.append((yield ("read",)))
                waited = replies.pop() if self.conn.wait_replicas else None
                redirect = next((r for r in replies if isinstance(r, MovedError)), None)
                if redirect is not None:
                    self.conn.target.moved(redirect.host, redirect.port)
                    yield ("reset",)
                    continue
                if any(isinstance(r, NoScriptError) for r in replies):
                    for s in (self.lua.enqueue, self.lua.unstage):
                        yield ("send", (b"SCRIPT", b"LOAD", s.source))
                        checked((yield ("read",)))
                    continue  # everything again: resending is safe
                if staged is not None:
                    checked(replies.pop(0))
                ids = [
                    i for r, c in zip(replies, self.chunks, strict=True) for i in ids_of(r, c.ids)
                ]
                if waited is not None:
                    self._confirmed(waited)
                return ids
            except TRANSIENT as exc:
                yield ("reset",)
                yield ("sleep", self.conn.pause_or_raise(backoff, exc, "enqueue"))
            except RedisError as exc:
                raise self.conn.failure(exc, "enqueue") from exc


# -- the driver ----------------------------------------------------------------


async def drive(link: AsyncLink | SyncLink, plan: Plan[T]) -> T:
    """Run ``plan`` on one of ``link``'s connections.  An I/O error is thrown
    into the plan at the request that failed (the connection is dropped)."""
    conn = await link.checkout()
    value: Any = None
    error: BaseException | None = None
    try:
        while True:
            try:
                req = plan.send(value) if error is None else plan.throw(error)
            except StopIteration as stop:
                link.checkin(conn)
                result: T = stop.value
                return result
            value = error = None
            op = req[0]
            try:
                if op == "send":
                    await link.send(conn, req[1])
                elif op == "read":
                    value = await link.read(conn)
                elif op == "reset":
                    await link.discard(conn)
                    conn = await link.checkout()
                elif op == "sleep":
                    await link.sleep(req[1])
            except (RedisError, OSError) as exc:
                await link.discard(conn)  # its state is unknown: never reuse it
                link.target.unreachable(exc)
                conn = await link.checkout()
                error = exc
    except BaseException:
        await link.discard(conn)
        raise
    finally:
        plan.close()


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``drive`` on a ``SyncLink`` to its end in this thread: its steps
    never suspend, so one ``send`` finishes the coroutine."""
    try:
        coro.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    coro.close()
    raise RuntimeError("a SyncLink step suspended: only a SyncLink may be driven by run_sync")


def single(
    conn: Connection, msgs: Iterable[Message], limit: int | None
) -> tuple[Message, Script, list[Arg]] | None:
    """For the usual ``task.enqueue`` (a list of one job, no ``wait_replicas``
    to confirm): the job and the one script call that stores it,
    ``enqueue_one.lua`` for a job without a key, ``enqueue.lua`` otherwise.
    None for anything else, which takes a plan."""
    if type(msgs) is not list or len(msgs) != 1 or conn.wait_replicas:
        return None
    m: Message = msgs[0]
    if m.key is not None and m.kind == TASK:
        [chunk] = encode([m], limit, conn.clock)
        return m, conn.lua.enqueue, [repr(conn.clock.now()), b"", "", "", *chunk.args]
    body = encode_checked(m, limit)
    now = conn.clock.now()
    snow = repr(now)
    eta = None if m.eta is None else conn.clock.to_server(m.eta)
    args: list[Arg]
    if eta is not None and eta > now:
        args = [snow, m.queue, m.name, m.priority, repr(eta), m.max_attempts, m.id, body]
    else:
        # ready now: the ready set's score and member as _core.lua's
        # ready_score and member would make them (the same double, floored)
        member = f"{math.floor(now * 1000000):016d}{m.id}"
        pr, id = m.priority, m.id
        args = [snow, m.queue, m.name, pr, snow, m.max_attempts, id, body, -pr, member]
    return m, conn.lua.enqueue_one, args


__all__ = ["CHUNK", "Enqueue", "Plan", "drive", "encode", "ids_of", "run_sync", "single"]
