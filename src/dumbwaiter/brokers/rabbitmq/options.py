"""The options of an ``amqp://`` URL: dumbwaiter's own, and aiormq's, which
``parse_url`` lets through (docs/rabbitmq.md lists them)."""

from __future__ import annotations

from urllib.parse import urlencode, urlsplit, urlunsplit

from ...errors import InvalidURL
from ...redact import mask_url
from .. import urlopts

#: finished jobs' records are kept this long (seconds) unless a result is kept longer
DEFAULT_RETENTION = 3600.0
_EXCHANGE_TYPES = ("topic", "direct", "headers", "fanout")

_TLS = ("amqps",)
STATE = urlopts.text(
    "state",
    None,
    "URL of the state store (URL-encoded); default: a SQLite file of this machine, "
    "~/.local/state/dumbwaiter/rabbitmq-HOST-PORT-VHOST-PREFIX-*.db",
)
PREFIX = urlopts.text("prefix", "dw", "first word of every queue, exchange and record name")
QUEUE_TYPE = urlopts.choice("queue_type", "quorum", ("quorum", "classic"), "type of every queue")
DELAYS = urlopts.text("delays", "dw.delay", "name of the delay cascade")
EXCHANGE_TYPE = urlopts.choice(
    "exchange_type", "topic", _EXCHANGE_TYPES, "type of the events exchange"
)
RETENTION = urlopts.seconds("retention", DEFAULT_RETENTION, "seconds finished jobs' records stay")
RECONNECT = urlopts.seconds(
    "reconnect", 30.0, "seconds an enqueue keeps trying while RabbitMQ is unreachable"
)
PREFETCH = urlopts.integer("prefetch", 0, "consumer prefetch (0: follows the drain rate)")
#: ours, then what aiormq reads from the URL's query (it ignores any other key)
OPTIONS = urlopts.Table(
    "amqp",
    [
        STATE,
        PREFIX,
        QUEUE_TYPE,
        DELAYS,
        EXCHANGE_TYPE,
        RETENTION,
        RECONNECT,
        PREFETCH,
        urlopts.integer(
            "heartbeat", 60, "seconds between heartbeats (0: none)", high=65535, passthrough=True
        ),
        urlopts.choice("auth", "plain", ("plain", "external"), "SASL mechanism", passthrough=True),
        *(
            urlopts.text(name, None, help, passthrough=True, schemes=_TLS)
            for name, help in (
                ("cafile", "CA bundle file"),
                ("capath", "directory of CA certificates"),
                ("cadata", "CA certificates, base64"),
                ("certfile", "client certificate file"),
                ("keyfile", "client key file"),
            )
        ),
        urlopts.flag(
            "no_verify_ssl",
            False,
            "skip the server certificate check",
            passthrough=True,
            schemes=_TLS,
        ),
    ],
    client="aiormq",
)


def parse_url(url: str) -> tuple[str, urlopts.Values]:
    """Check the URL; split off dumbwaiter's options (the rest is aiormq's)."""
    parts = urlsplit(url)
    if parts.scheme not in ("amqp", "amqps"):
        raise InvalidURL(f"not an AMQP URL: {mask_url(url)!r}")
    opts = OPTIONS.parse(url)
    path = parts.path or "/"
    rest = urlunsplit(parts._replace(path=path, query=urlencode(opts.client)))
    return rest, opts
