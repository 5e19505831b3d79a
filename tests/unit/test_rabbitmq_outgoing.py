"""The RabbitMQ broker's direct publish frames (brokers/rabbitmq/outgoing.py):
the very bytes aiormq's marshalling of pamqp's frames writes, and aiormq's
own path for anything else."""

from __future__ import annotations

import pytest
from aiormq.abc import ChannelFrame, FrameType
from pamqp import commands as spec
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from dumbwaiter.brokers.rabbitmq import outgoing

_P = spec.Basic.Properties


def _aiormqs(channel: int, max_body: int, ex: str, rk: str, body: bytes, props: _P) -> bytes:
    parts: list[FrameType] = [
        spec.Basic.Publish(exchange=ex, routing_key=rk),
        ContentHeader(0, len(body), props),
    ]
    parts += [ContentBody(body[i : i + max_body]) for i in range(0, len(body), max_body)]
    return ChannelFrame.marshall(channel, parts).payload


@pytest.mark.parametrize(
    "props",
    [
        _P(content_type="application/json", delivery_mode=2, message_id="ïd", headers={"dw-v": 0}),
        _P(
            content_type="application/json",
            delivery_mode=2,
            message_id="m",
            headers={"dw-v": 2**40, "dw-e": "ab12", "dw-seen": "1.5", "n": -300, "u": 40000},
        ),
        _P(content_type="application/json", delivery_mode=2, message_id="m", headers={}),
        _P(message_id="m"),
    ],
)
@pytest.mark.parametrize("body", [b"", b"{}", b"x" * 300, bytes(range(256)) * 20])
def test_frames_equal_aiormqs_marshalling(props: _P, body: bytes) -> None:
    args = (3, 1000, "dw.delays.l9", "dw.normal.default", body, props)
    assert outgoing.frames(*args) == _aiormqs(*args)


@pytest.mark.parametrize(
    "props",
    [
        _P(message_id="m", priority=3),
        _P(message_id="m", headers={"b": True}),
        _P(message_id="m", headers={"f": 1.5}),
        _P(message_id="m", expiration="100"),
    ],
)
def test_other_properties_are_aiormqs(props: _P) -> None:
    with pytest.raises(outgoing.Unfit):
        outgoing.frames(1, 1000, "", "q", b"x", props)


def test_a_name_too_long_is_aiormqs() -> None:
    with pytest.raises(outgoing.Unfit):
        outgoing.frames(1, 1000, "", "q" * 256, b"x", _P(message_id="m"))


def test_kept_encodings_are_per_channel_exchange_and_key() -> None:
    props = _P(content_type="text/plain", delivery_mode=2, message_id="m", headers={"dw-v": 1})
    for args in [
        (1, 1000, "", "dw.default.0", b"a", props),
        (2, 1000, "", "dw.default.0", b"a", props),  # another channel
        (1, 1000, "dw.delays.l9", "dw.default.0", b"a", props),  # another exchange
        (1, 1000, "", "dw.default.1", b"a", props),  # another lane
        (1, 1000, "", "dw.default.0", b"a", props),  # the first again
    ]:
        assert outgoing.frames(*args) == _aiormqs(*args)
