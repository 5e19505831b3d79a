"""Attachments: carried in the job, or by reference and fetched at send time.

An attachment given as bytes travels inside the job, base64 in its JSON, so
it counts against the broker's message size limit (1 MiB by default, a
third more as base64; ``Mailer.compose`` raises ``MailTooLarge`` beyond it).
Larger files are attached by reference: ``Attachment.from_path`` (a file
every worker can read, e.g. on shared storage) or ``Attachment.from_url`` (an
HTTP(S) URL, e.g. a pre-signed object-store link), read by the worker when it
sends, so the job stays small and the bytes are read only once per attempt.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import mimetypes
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .errors import InvalidEmail, MailDeferred, MailRejected

if TYPE_CHECKING:
    import httpx

#: the largest attachment fetched by URL (bytes): a link to a huge file fails
#: the job with a clear reason instead of filling the worker's memory
MAX_FETCHED = 40 * 1024 * 1024


def guess_type(filename: str) -> str:
    return mimetypes.guess_type(filename)[0] or "application/octet-stream"


@dataclass(frozen=True, slots=True)
class Attachment:
    """A file attached to an e-mail: ``Attachment("receipt.pdf", data,
    "application/pdf")`` (the type is guessed from the name when omitted), or
    by reference with ``from_path`` / ``from_url``."""

    filename: str
    data: bytes | None = None
    content_type: str = ""
    #: read by the worker at send time (absolute: workers do not share a cwd)
    path: str | None = None
    #: fetched by the worker at send time (http or https)
    url: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.filename, str) or not self.filename.strip():
            raise InvalidEmail(f"an attachment needs a file name, got {self.filename!r}")
        if any(c in self.filename for c in '\r\n"\\/'):
            raise InvalidEmail(f'attachment file name {self.filename!r}: no / \\ " or line breaks')
        given = sum(x is not None for x in (self.data, self.path, self.url))
        if given != 1:
            raise InvalidEmail(
                f"attachment {self.filename!r}: give exactly one of data, path or url"
            )
        data: object = self.data
        if data is not None and not isinstance(data, bytes):
            if not isinstance(data, bytearray | memoryview):
                raise InvalidEmail(
                    f"attachment {self.filename!r}: data must be bytes, got {type(data).__name__}"
                )
            object.__setattr__(self, "data", bytes(data))
        if self.url is not None and not self.content_type:
            return  # the response's Content-Type, or a guess, at send time
        ctype = self.content_type or guess_type(self.filename)
        main, _, sub = ctype.partition("/")
        if not main or not sub or any(c.isspace() for c in ctype):
            raise InvalidEmail(
                f"attachment {self.filename!r}: content type {ctype!r} is not type/subtype"
            )
        object.__setattr__(self, "content_type", ctype)

    @classmethod
    def from_path(
        cls, path: str | os.PathLike[str], filename: str | None = None, content_type: str = ""
    ) -> Attachment:
        """The file at ``path``, read by the worker when it sends (every
        worker must be able to read it).  The path must be absolute."""
        p = Path(path)
        if not p.is_absolute():
            raise InvalidEmail(
                f"attachment path {str(path)!r} is relative; workers run in other "
                "directories (and machines): give an absolute path on shared storage"
            )
        return cls(filename or p.name, path=str(p), content_type=content_type)

    @classmethod
    def from_url(cls, url: str, filename: str, content_type: str = "") -> Attachment:
        """The body of ``url`` (http or https), fetched by the worker when it
        sends.  The type is the response's ``Content-Type`` unless given."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise InvalidEmail(f"attachment URL {url!r}: only http(s) URLs can be fetched")
        return cls(filename, url=url, content_type=content_type)

    @property
    def inline_size(self) -> int:
        """Bytes this attachment adds to the job (its base64), 0 by reference."""
        return 0 if self.data is None else (len(self.data) + 2) // 3 * 4

    # -- JSON, as the job carries it -------------------------------------------

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"filename": self.filename, "content_type": self.content_type}
        if self.data is not None:
            out["data"] = base64.b64encode(self.data).decode("ascii")
        elif self.path is not None:
            out["path"] = self.path
        else:
            out["url"] = self.url
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Attachment:
        data = d.get("data")
        raw = None
        if data is not None:
            try:
                raw = base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError, TypeError) as exc:
                raise InvalidEmail(f"attachment {d.get('filename')!r}: bad base64: {exc}") from None
        return cls(
            filename=d.get("filename", ""),
            data=raw,
            content_type=d.get("content_type", ""),
            path=d.get("path"),
            url=d.get("url"),
        )

    # -- at send time -----------------------------------------------------------

    async def resolve(self, client: httpx.AsyncClient | None) -> Attachment:
        """This attachment with its bytes: read from ``path`` or fetched from
        ``url``.  A file that cannot be read, or a URL that fails for now,
        defers the delivery (storage may be catching up); a URL answering
        404/410/403 or a body over ``MAX_FETCHED`` rejects it."""
        if self.data is not None:
            return self
        if self.path is not None:
            try:
                data = await asyncio.to_thread(Path(self.path).read_bytes)
            except OSError as exc:
                raise MailDeferred(
                    f"attachment {self.filename!r}: cannot read {self.path}: {exc}"
                ) from None
            return Attachment(self.filename, data, self.content_type)
        assert self.url is not None and client is not None
        return await self._fetch(client)

    async def _fetch(self, client: httpx.AsyncClient) -> Attachment:
        import httpx

        url = self.url
        assert url is not None
        try:
            async with client.stream("GET", url) as resp:
                if resp.status_code in (401, 403, 404, 410):
                    raise MailRejected(
                        f"attachment {self.filename!r}: {url} answered {resp.status_code}"
                    )
                if resp.status_code >= 300:
                    raise MailDeferred(
                        f"attachment {self.filename!r}: {url} answered {resp.status_code}"
                    )
                chunks: list[bytes] = []
                size = 0
                async for chunk in resp.aiter_bytes():
                    size += len(chunk)
                    if size > MAX_FETCHED:
                        raise MailRejected(
                            f"attachment {self.filename!r}: {url} is over "
                            f"{MAX_FETCHED // (1024 * 1024)} MiB"
                        )
                    chunks.append(chunk)
                header = resp.headers.get("content-type", "").split(";")[0].strip()
                if header.count("/") != 1 or any(c.isspace() for c in header):
                    header = ""  # a malformed type: guess from the file name instead
                ctype = self.content_type or header or guess_type(self.filename)
        except httpx.HTTPError as exc:
            raise MailDeferred(
                f"attachment {self.filename!r}: fetching {url} failed: {exc!r}"
            ) from None
        return Attachment(self.filename, b"".join(chunks), ctype)
