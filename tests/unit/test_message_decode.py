"""Bodies that are not envelopes: the reason says what is wrong in the sender's terms."""

from __future__ import annotations

import pytest

from dumbwaiter.errors import MessageDecodeError
from dumbwaiter.message import decode, undecodable


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'{"id": "\xff"}', "not valid UTF-8 (byte 0xff at offset 8: invalid start byte)"),
        (b"ab\xc3(", "not valid UTF-8 (byte 0xc3 at offset 2: invalid continuation byte)"),
        (b'{"id": "\xe2\x82', "not valid UTF-8 (byte 0xe2 at offset 8: unexpected end of data)"),
        # text a client decoded with errors="surrogateescape": the same bytes
        ('{"id": "\udcff"}', "not valid UTF-8 (byte 0xff at offset 8: invalid start byte)"),
        (b"{not json", "message body is not JSON"),
    ],
)
def test_decode_names_what_is_wrong_with_the_body(raw: bytes | str, reason: str) -> None:
    """Brokers that decode with ``decode`` (RabbitMQ, listings) say so at once."""
    with pytest.raises(MessageDecodeError) as caught:
        decode(raw)
    assert reason in str(caught.value)
    assert "surrogates not allowed" not in str(caught.value)


def test_a_brokers_own_reason_is_replaced_only_for_bytes_that_are_not_utf8() -> None:
    """What the worker dead-letters with, whatever parser the broker used."""
    orjsons = "str is not valid UTF-8: surrogates not allowed: line 1 column 1 (char 0)"
    assert undecodable(b"\x80", orjsons).startswith(
        "message body is not valid UTF-8 (byte 0x80 at offset 0: invalid start byte)"
    )
    assert undecodable(b"{not json", "not JSON here") == "not JSON here"
    assert undecodable(None, None) == "undecodable message body"
