"""The NATS protocol as dumbwaiter reads and writes it: the errors a
request can end in, replies and JetStream's publish acknowledgements (read
without JSON on the usual answers), raw header blocks, the ``PUB``/``HPUB``
commands, and the parser that takes over one client's ``_ps`` (``wire.py``
says when and why).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NamedTuple

import orjson
from nats.errors import ProtocolError

from ...errors import BrokerError, BrokerUnavailable

log = logging.getLogger("dumbwaiter.nats")

#: (subject, reply, header block or None, payload) -> None; must not block
Handler = Callable[[bytes, bytes, "bytes | None", bytes], None]


class Unavailable(BrokerUnavailable):
    """The connection to NATS is down (the client is reconnecting)."""


def refused_login(exc: BaseException) -> bool:
    """Whether nats-py's ``exc`` is the server refusing the credentials
    (``-ERR 'Authorization Violation'``, an expired or revoked user): no
    retry mends that."""
    from nats.errors import AuthorizationError

    text = str(exc).lower()
    return isinstance(exc, AuthorizationError) or "authoriz" in text or "authentica" in text


class JetStreamError(BrokerError):
    """JetStream refused a request; ``code``/``err_code`` say why."""

    def __init__(self, description: str, code: int = 0, err_code: int = 0) -> None:
        super().__init__(description)
        self.code = code
        self.err_code = err_code


#: JetStream's error code for a failed ``Nats-Expected-Last-Subject-Sequence``
WRONG_LAST_SEQUENCE = 10071
#: stream or consumer not found
STREAM_NOT_FOUND = 10059
CONSUMER_NOT_FOUND = 10014
#: a stream with this name exists with another configuration
STREAM_NAME_IN_USE = 10058


class Reply(NamedTuple):
    """A received message: header block (raw, or None) and payload."""

    hdr: bytes | None
    data: bytes

    @property
    def status(self) -> int:
        """The NATS status code of a status message (404, 408, 503...), else 0."""
        h = self.hdr
        if h is None or len(h) < 12 or h[8:9] != b" ":
            return 0
        try:
            return int(h[9:12])
        except ValueError:
            return 0


class PubAck(NamedTuple):
    seq: int
    duplicate: bool


_new_ack = tuple.__new__


def pub_ack(r: Reply, what: str) -> PubAck:
    """Decode a JetStream publish acknowledgement; raise on its error.

    Two or three of these per job (enqueue, claim, settle), so the usual
    answers are read without JSON: ``{"stream":"S","seq":N}`` and
    ``{"stream":"S","seq":N,"duplicate": true}`` (nats-server writes an
    error first, ``{"error":...``, so it never takes these paths; a
    ``"domain"`` before ``"seq"`` does no harm).  Anything else goes
    through JSON."""
    d = r[1]
    if d[:10] == b'{"stream":':
        i = d.find(b'"seq":', 10)
        if i > 0:
            j = d.find(b",", i)
            if j < 0:  # "seq" is the last field: the common answer
                n = d[i + 6 : -1]
                if n.isdigit():
                    return _new_ack(PubAck, (int(n), False))
            elif b'"error"' not in d:
                n = d[i + 6 : j]
                if n.isdigit():
                    k = d.find(b'"duplicate":', j)  # nats-server writes '"duplicate": true'
                    dup = k > 0 and d[k + 12 :].lstrip()[:1] == b"t"
                    return _new_ack(PubAck, (int(n), dup))
    return _pub_ack_slow(r, what)


def _pub_ack_slow(r: Reply, what: str) -> PubAck:
    if r.status == 503:  # JetStream is (re)starting, or no stream takes the subject
        raise Unavailable(f"{what}: no stream answered (503 no responders)")
    try:
        d = orjson.loads(r.data)
    except orjson.JSONDecodeError:
        raise JetStreamError(f"{what}: unexpected reply {r.data[:200]!r}") from None
    err = d.get("error")
    if err is not None:
        if int(err.get("code", 0)) == 503:
            raise Unavailable(f"{what}: {err.get('description', err)}")
        raise JetStreamError(
            f"{what}: {err.get('description', err)}",
            int(err.get("code", 0)),
            int(err.get("err_code", 0)),
        )
    return PubAck(int(d["seq"]), bool(d.get("duplicate", False)))


def header(hdr: bytes | None, name: bytes) -> bytes | None:
    """The value of header ``name`` (exact case) in a raw header block."""
    if not hdr:
        return None
    key = b"\r\n" + name + b":"
    i = hdr.find(key)
    if i < 0:
        return None
    i += len(key)
    j = hdr.find(b"\r\n", i)
    return hdr[i:j].strip() if j >= 0 else hdr[i:].strip()


def headers(*pairs: tuple[bytes, bytes | str | int | float]) -> bytes:
    """A raw header block (``NATS/1.0``) from (name, value) pairs."""
    out = [b"NATS/1.0\r\n"]
    for k, v in pairs:
        out += (k, b": ", v if isinstance(v, bytes) else str(v).encode(), b"\r\n")
    out.append(b"\r\n")
    return b"".join(out)


def header_dict(hdr: bytes | None) -> dict[str, str] | None:
    """A raw header block as the dictionary nats-py's ``publish`` takes."""
    if not hdr:
        return None
    out: dict[str, str] = {}
    for line in hdr.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            out[name.decode()] = value.strip().decode()
    return out


def header_block(parsed: dict[str, str] | None) -> bytes | None:
    """nats-py's parsed headers of a received message as the raw block the
    handlers read (``header``, ``Reply.status``): an inline status (``Status``,
    ``Description``) on the first line, as the server wrote it."""
    if not parsed:
        return None
    first = b"NATS/1.0"
    status = parsed.get("Status")
    if status:
        first += b" " + status.encode()
        desc = parsed.get("Description")
        if desc:
            first += b" " + desc.encode()
    pairs = [(k.encode(), v) for k, v in parsed.items() if k not in ("Status", "Description")]
    out = [first, b"\r\n"]
    for k, v in pairs:
        out += (k, b": ", v.encode(), b"\r\n")
    out.append(b"\r\n")
    return b"".join(out)


def pub_cmd(subject: bytes, data: bytes, reply: bytes = b"", hdr: bytes | None = None) -> bytes:
    """The protocol command publishing ``data`` (with an optional header block)."""
    if hdr is None:
        if reply:
            return b"PUB %s %s %d\r\n%s\r\n" % (subject, reply, len(data), data)
        return b"PUB %s %d\r\n%s\r\n" % (subject, len(data), data)
    if reply:
        return b"HPUB %s %s %d %d\r\n%s%s\r\n" % (
            subject, reply, len(hdr), len(hdr) + len(data), hdr, data,
        )  # fmt: skip
    return b"HPUB %s %d %d\r\n%s%s\r\n" % (subject, len(hdr), len(hdr) + len(data), hdr, data)


class _Parser:
    """NATS protocol parser that takes over ``Client._ps`` (see the module doc)."""

    def __init__(self, nc: Any, fast: dict[int, Handler]) -> None:
        self.nc = nc
        self.fast = fast
        self.buf = bytearray()

    def reset(self) -> None:
        self.buf = bytearray()

    async def parse(self, data: bytes = b"") -> None:  # noqa: C901 - one protocol loop
        buf = self.buf
        buf += data
        n = len(buf)
        pos = 0
        fast = self.fast
        nc = self.nc
        try:
            while pos < n:
                e = buf.find(b"\r\n", pos)
                if e < 0:
                    break
                c = buf[pos]
                if c == 77 or c == 72:  # MSG / HMSG
                    parts = bytes(buf[pos:e]).split()
                    if c == 77:
                        hsize = 0
                        if len(parts) == 5:
                            subject, sid, reply, size = parts[1], parts[2], parts[3], int(parts[4])
                        else:
                            subject, sid, size, reply = parts[1], parts[2], int(parts[3]), b""
                    elif len(parts) == 6:
                        subject, sid, reply = parts[1], parts[2], parts[3]
                        hsize, size = int(parts[4]), int(parts[5])
                    else:
                        subject, sid, reply = parts[1], parts[2], b""
                        hsize, size = int(parts[3]), int(parts[4])
                    start = e + 2
                    end = start + size
                    if end + 2 > n:
                        break  # the payload has not fully arrived
                    hdr = bytes(buf[start : start + hsize]) if hsize else None
                    payload = bytes(buf[start + hsize : end])
                    pos = end + 2
                    isid = int(sid)
                    handler = fast.get(isid)
                    if handler is not None:
                        try:
                            handler(subject, reply, hdr, payload)
                        except Exception:
                            log.exception("nats: handler of subscription %d failed", isid)
                    else:
                        await nc._process_msg(isid, subject, reply, payload, hdr)
                    continue
                line = bytes(buf[pos:e])
                pos = e + 2
                if line.startswith(b"PING"):
                    await nc._process_ping()
                elif line.startswith(b"PONG"):
                    await nc._process_pong()
                elif line.startswith(b"+OK"):
                    pass
                elif line.startswith(b"-ERR"):
                    await nc._process_err(line[4:].strip().decode(errors="replace").lower())
                elif line.startswith(b"INFO"):
                    await nc._process_info(orjson.loads(line[4:].strip()))
                elif line:
                    raise _protocol_error(f"nats: unknown protocol line {line[:80]!r}")
        finally:
            del buf[:pos]


def _protocol_error(text: str) -> Exception:
    return ProtocolError(text)
