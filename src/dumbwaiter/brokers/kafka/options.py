"""The options of a ``kafka://`` URL and the aiokafka settings they make."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

from ...errors import InvalidURL
from ...redact import mask_url
from .. import urlopts

#: Kafka's default port
PORT = 9092
#: finished jobs' records are kept this long (seconds) unless a result is kept longer
DEFAULT_RETENTION = 3600.0

STATE = urlopts.text(
    "state",
    None,
    "URL of the state store (URL-encoded; required): Redis, PostgreSQL or NATS",
)
PREFIX = urlopts.text(
    "prefix",
    "dw",
    "first word of every topic, group and record name",
    pattern=r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}",
    accepts="letters, digits, '.', '_' and '-' (at most 100)",
)
PARTITIONS = urlopts.integer(
    "partitions",
    3,
    "partitions of each queue and event topic, fixed when it is made (more later re-keys)",
    low=1,
    high=10000,
)
REPLICATION = urlopts.integer(
    "replication",
    1,
    "replication factor of the topics dumbwaiter makes (production: 3)",
    low=1,
    high=32,
)
RETENTION = urlopts.seconds("retention", DEFAULT_RETENTION, "seconds finished jobs' records stay")
SINGLE_HOST = urlopts.flag(
    "single_host",
    False,
    "allow a SQLite or memory state store: every process runs on this one machine",
)
FETCH_WAIT = urlopts.seconds(
    "fetch_wait",
    0.1,
    "seconds the cluster holds an empty fetch (fetch.max.wait.ms)",
    positive=True,
)
STRANDED = urlopts.seconds(
    "stranded",
    600.0,
    "seconds a due job may wait before its copy is written again (a lost copy)",
    positive=True,
)
RECONNECT = urlopts.seconds(
    "reconnect",
    30.0,
    "seconds a write of copies keeps trying while the cluster is unreachable",
)
SESSION_TIMEOUT = urlopts.seconds(
    "session_timeout",
    10.0,
    "seconds without a heartbeat before a consumer's partitions go to others",
    positive=True,
)
OPTIONS = urlopts.Table(
    "kafka",
    [
        STATE,
        PREFIX,
        PARTITIONS,
        REPLICATION,
        RETENTION,
        SINGLE_HOST,
        FETCH_WAIT,
        SESSION_TIMEOUT,
        STRANDED,
        RECONNECT,
        urlopts.choice(
            "security_protocol",
            "plaintext",
            ("plaintext", "ssl", "sasl_plaintext", "sasl_ssl"),
            "how to reach the cluster",
            passthrough=True,
        ),
        urlopts.choice(
            "sasl_mechanism",
            "plain",
            ("plain", "scram-sha-256", "scram-sha-512"),
            "SASL mechanism (user and password from the URL)",
            passthrough=True,
        ),
        urlopts.text("ssl_cafile", None, "CA bundle file", passthrough=True),
        urlopts.text("ssl_certfile", None, "client certificate file", passthrough=True),
        urlopts.text("ssl_keyfile", None, "client key file", passthrough=True),
        urlopts.text("client_id", None, "client id the cluster sees", passthrough=True),
    ],
    client="aiokafka",
    several=True,
)


def client_config(url: str, opts: urlopts.Values) -> dict[str, Any]:
    """What every aiokafka client of this URL is made with."""
    parts = urlsplit(url)
    hostinfo = parts.netloc.rpartition("@")[2]
    servers = []
    for one in hostinfo.split(","):
        host, _, port = one.rpartition(":") if one.rpartition(":")[2].isdigit() else (one, "", "")
        servers.append(f"{host or one}:{port or PORT}")
    config: dict[str, Any] = {"bootstrap_servers": servers}
    passed = dict(opts.client)
    ssl_files = {
        k: passed.pop(k) for k in ("ssl_cafile", "ssl_certfile", "ssl_keyfile") if k in passed
    }
    if "security_protocol" in passed:
        config["security_protocol"] = passed.pop("security_protocol").upper()
    if "sasl_mechanism" in passed:
        config["sasl_mechanism"] = passed.pop("sasl_mechanism").upper()
    config.update(passed)
    if parts.username is not None:
        config["sasl_plain_username"] = unquote(parts.username)
        config["sasl_plain_password"] = unquote(parts.password or "")
        config.setdefault("security_protocol", "SASL_PLAINTEXT")
    if ssl_files or config.get("security_protocol", "").endswith("SSL"):
        from aiokafka.helpers import create_ssl_context

        config["ssl_context"] = create_ssl_context(
            cafile=ssl_files.get("ssl_cafile"),
            certfile=ssl_files.get("ssl_certfile"),
            keyfile=ssl_files.get("ssl_keyfile"),
        )
        config.setdefault("security_protocol", "SSL")
    return config


def parse(url: str) -> urlopts.Values:
    if urlsplit(url).scheme.lower() != "kafka":
        raise InvalidURL(f"not a kafka URL: {mask_url(url)!r}")
    return OPTIONS.parse(url)
