"""How the Kafka broker sorts aiokafka's errors into dumbwaiter's.

A cluster that refuses the credentials, the SASL mechanism or an ACL will
refuse them again: the caller must get ``BrokerAuthError`` at once, never a
``BrokerUnavailable`` that producers retry until their deadline.  (The test
server, tansu, takes no credentials, so the refusals are fed in here.)
"""

from __future__ import annotations

import pytest
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    NotLeaderForPartitionError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    UnsupportedSaslMechanismError,
)

import dumbwaiter as dw
from dumbwaiter.brokers.kafka.broker import KafkaBroker

URL = "kafka://user:secret@127.0.0.1:9092?state=redis%3A%2F%2F127.0.0.1%3A6379%2F0"


@pytest.mark.parametrize(
    "exc",
    [
        SaslAuthenticationFailed("bad password"),
        UnsupportedSaslMechanismError(),
        TopicAuthorizationFailedError(),
        GroupAuthorizationFailedError(),
    ],
)
def test_a_refusal_is_an_auth_error_naming_the_server(exc: Exception) -> None:
    err = KafkaBroker(URL).failure(exc)
    assert isinstance(err, dw.BrokerAuthError)
    assert "127.0.0.1:9092" in str(err) and "secret" not in str(err)


@pytest.mark.parametrize("exc", [KafkaConnectionError("down"), NotLeaderForPartitionError()])
def test_a_passing_failure_is_unavailable(exc: Exception) -> None:
    assert isinstance(KafkaBroker(URL).failure(exc), dw.BrokerUnavailable)
