"""The demo's mail server: a ``dumbwaiter.mail`` backend that writes each mail
as an ``.eml`` file (the MIME message SMTP would carry) into a folder.

The demo must run on a fresh machine with no mail server, and its workers
are separate processes, so the in-process ``Memory`` backend cannot show
what they sent; a folder can, and any mail client opens the files.  The
file is named after the Message-ID and written under a temporary name then
renamed, so a second delivery of one mail replaces the file instead of
adding one, and a reader never sees half a message.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from pathlib import Path

from ..mail.backends import Backend, Sent
from ..mail.message import Email
from ..mail.mime import build

_UNSAFE = re.compile(r"[^A-Za-z0-9_.@-]+")


def file_name(message_id: str) -> str:
    """``<receipt-o-1@shop.example.com>`` -> ``receipt-o-1@shop.example.com.eml``."""
    return _UNSAFE.sub("_", message_id.strip("<>")) + ".eml"


class MailFolder(Backend):
    """Accepts every e-mail and writes it to ``folder/<Message-ID>.eml``."""

    name = "folder"

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    async def send(self, email: Email) -> Sent:
        data = build(email).as_bytes()
        await asyncio.to_thread(self._write, file_name(email.message_id or email.id), data)
        return Sent(provider_id=email.message_id)

    def _write(self, name: str, data: bytes) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / f".{name}.{uuid.uuid4().hex}.tmp"
        tmp.write_bytes(data)
        tmp.replace(self.folder / name)
