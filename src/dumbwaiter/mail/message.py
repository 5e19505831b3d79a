"""``Email``: one message, as composed by the caller and carried by its job.

It is plain data with a JSON form (``to_json`` / ``from_json``), so the job
holds everything a worker needs: rendered subject and bodies, recipients,
attachments (or references to them), and the two ids that make a retried
job recognisable: ``id`` (a UUIDv7 made when the mail is composed) and
``message_id`` (the ``Message-ID`` header, ``<id@domain>``), both the same on
every attempt of the job.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .address import bare, check_address, check_addresses
from .attachments import Attachment
from .errors import InvalidEmail

#: headers set from their own parameters; ``headers=`` may not override them
RESERVED_HEADERS = frozenset(
    {
        "from",
        "to",
        "cc",
        "bcc",
        "reply-to",
        "subject",
        "message-id",
        "date",
        "mime-version",
        "content-type",
        "content-transfer-encoding",
    }
)
_HEADER_NAME = re.compile(r"^[!-9;-~]+$")  # printable ASCII without ':' or space
_MESSAGE_ID = re.compile(r"^<[^<>@\s]+@[^<>@\s]+>$")
#: the JSON form's version, so a newer worker can read an older job
FORMAT = 1


@dataclass(frozen=True, slots=True)
class Email:
    """A composed e-mail.  Build it with ``Mailer.compose`` (which renders
    templates and assigns the ids); the constructor checks every field."""

    sender: str
    to: tuple[str, ...]
    subject: str
    text: str | None = None
    html: str | None = None
    cc: tuple[str, ...] = ()
    bcc: tuple[str, ...] = ()
    reply_to: tuple[str, ...] = ()
    headers: Mapping[str, str] = field(default_factory=dict)
    attachments: tuple[Attachment, ...] = ()
    #: provider tags / metadata (SendGrid custom_args, Postmark Metadata,
    #: Resend tags, SES EmailTags); SMTP ignores them
    tags: Mapping[str, str] = field(default_factory=dict)
    #: the delivery id (UUIDv7), the same on every attempt
    id: str = ""
    #: the Message-ID header, ``<id@domain>``, the same on every attempt
    message_id: str = ""
    #: the Date header (RFC 5322 text), fixed when composed
    date: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "sender", check_address(self.sender, "sender"))
        for name in ("to", "cc", "bcc", "reply_to"):
            object.__setattr__(self, name, check_addresses(getattr(self, name), name))
        if not self.to:
            raise InvalidEmail("an e-mail needs at least one 'to' recipient")
        if not isinstance(self.subject, str):
            raise InvalidEmail(f"subject must be text, got {self.subject!r}")
        # one line: a line break in a subject would start a header of its own
        object.__setattr__(self, "subject", " ".join(self.subject.split()))
        if self.text is None and self.html is None:
            raise InvalidEmail("an e-mail needs a text or an html body (or both)")
        for body in ("text", "html"):
            value = getattr(self, body)
            if value is not None and not isinstance(value, str):
                raise InvalidEmail(f"{body} must be text, got {type(value).__name__}")
        object.__setattr__(self, "headers", _check_headers(self.headers))
        object.__setattr__(self, "tags", _check_tags(self.tags))
        atts = tuple(self.attachments)
        for a in atts:
            if not isinstance(a, Attachment):
                raise InvalidEmail(f"attachments take dumbwaiter.mail.Attachment, got {a!r}")
        object.__setattr__(self, "attachments", atts)
        if self.message_id and not _MESSAGE_ID.match(self.message_id):
            raise InvalidEmail(
                f"message_id {self.message_id!r} is not '<unique@domain>' (RFC 5322 msg-id)"
            )

    @property
    def recipients(self) -> tuple[str, ...]:
        """Every envelope recipient (to, cc, bcc), bare addresses, in order."""
        seen: dict[str, None] = {}
        for a in (*self.to, *self.cc, *self.bcc):
            seen.setdefault(bare(a), None)
        return tuple(seen)

    def without(self, addresses: Iterable[str]) -> Email:
        """This e-mail minus ``addresses`` (bare) in to, cc and bcc."""
        drop = set(addresses)

        def keep(values: tuple[str, ...]) -> tuple[str, ...]:
            return tuple(v for v in values if bare(v) not in drop)

        return replace(self, to=keep(self.to), cc=keep(self.cc), bcc=keep(self.bcc))

    # -- JSON, as the job carries it ---------------------------------------------

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "v": FORMAT,
            "id": self.id,
            "message_id": self.message_id,
            "date": self.date,
            "from": self.sender,
            "to": list(self.to),
            "subject": self.subject,
        }
        for key, value in (
            ("cc", list(self.cc)),
            ("bcc", list(self.bcc)),
            ("reply_to", list(self.reply_to)),
            ("text", self.text),
            ("html", self.html),
            ("headers", dict(self.headers)),
            ("tags", dict(self.tags)),
            ("attachments", [a.to_json() for a in self.attachments]),
        ):
            if value:
                out[key] = value
        return out

    @classmethod
    def from_json(cls, d: Any) -> Email:
        """The e-mail a job carries; ``InvalidEmail`` if it is not one."""
        if not isinstance(d, dict):
            raise InvalidEmail(f"a mail job carries an e-mail object, got {type(d).__name__}")
        version = d.get("v", FORMAT)
        if version != FORMAT:
            raise InvalidEmail(f"mail job format {version!r}; this worker reads {FORMAT}")
        try:
            return cls(
                sender=d["from"],
                to=tuple(d["to"]),
                subject=d.get("subject", ""),
                text=d.get("text"),
                html=d.get("html"),
                cc=tuple(d.get("cc", ())),
                bcc=tuple(d.get("bcc", ())),
                reply_to=tuple(d.get("reply_to", ())),
                headers=d.get("headers") or {},
                attachments=tuple(Attachment.from_json(a) for a in d.get("attachments", ())),
                tags=d.get("tags") or {},
                id=str(d.get("id", "")),
                message_id=str(d.get("message_id", "")),
                date=str(d.get("date", "")),
            )
        except (KeyError, TypeError) as exc:
            raise InvalidEmail(f"a mail job's e-mail is malformed: {exc!r}") from None


def _check_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in (headers or {}).items():
        if not isinstance(name, str) or not _HEADER_NAME.match(name):
            raise InvalidEmail(f"header name {name!r} is not a valid header field name")
        if name.lower() in RESERVED_HEADERS:
            raise InvalidEmail(
                f"header {name!r} is set by the mailer; use its own parameter "
                "(sender, to, cc, bcc, reply_to, subject, message_id)"
            )
        if not isinstance(value, str) or "\r" in value or "\n" in value:
            raise InvalidEmail(
                f"header {name!r}: the value must be one line of text, got {value!r}"
            )
        out[name] = value
    return out


def _check_tags(tags: Mapping[str, str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in (tags or {}).items():
        if not isinstance(name, str) or not isinstance(value, str) or not name:
            raise InvalidEmail(f"tags map text to text, got {name!r}: {value!r}")
        out[name] = value
    return out
