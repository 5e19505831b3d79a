"""Coordination on RabbitMQ: the state store's, and which store that is.

RabbitMQ has no key-value store, no locks and no index of jobs, so a
companion *state store* (any other dumbwaiter broker, named by ``state=``)
keeps them: locks, the key-value store, rate limits and slots are its own,
forwarded as they are by ``StateDelegation`` (brokers/base.py), and every
job has a record there (ledger.py).  This module picks the store: the URL's
``state=``, or a SQLite file of this machine named after the broker's
namespace.  Every process of an app must use the same one, so each new
connection first claims the vhost's word that it is the app's
(announce.py, ``RabbitMQConnection._claim``); until then the store sits
behind a gate (gate.py) that lets no call through.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from dataclasses import replace
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

from ...errors import InvalidURL
from ...redact import mask_url
from .. import from_url, identity
from ..base import Broker
from ..types import Capabilities

log = logging.getLogger("dumbwaiter.rabbitmq")

#: the file of the state store when the URL names none (one machine only):
#: under the user's state directory (``identity.state_dir``), named after
#: the broker's host, port, vhost and prefix (``default_state_url``)
DEFAULT_STATE_NAME = "rabbitmq-{host}-{port}-{vhost}-{prefix}"
#: the default of versions before it, relative to the working directory
OLD_DEFAULT_STATE = "dumbwaiter-state.db"


def state_store(url: str, amqp_url: str, given: str | None, prefix: str) -> tuple[Broker, str]:
    """The state store of the broker at ``url`` (``amqp_url``: the same
    without dumbwaiter's options), and its URL, absolute (a relative SQLite
    path is resolved now: every message names the file)."""
    state_url = identity.absolute_url(given or default_state_url(amqp_url, prefix))
    if urlsplit(state_url).scheme in ("amqp", "amqps"):
        raise InvalidURL("the state store of an amqp:// broker cannot be RabbitMQ itself")
    try:
        store = from_url(state_url)
    except InvalidURL as exc:
        raise InvalidURL(f"the state= of amqp URL {mask_url(url)!r}: {exc}") from None
    return store, state_url


def with_store(caps: Capabilities, store: Broker) -> Capabilities:
    """The broker's capabilities with ``store``'s flow control and sharing:
    limits, several processes and several hosts are what the state store
    offers (the class default claims them, each instance says its own)."""
    own = type(store).capabilities
    return replace(
        caps, limits=own.limits, multi_process=own.multi_process, multi_host=own.multi_host
    )


def default_state_url(amqp_url: str, prefix: str) -> str:
    """The state store of a URL that names none: a SQLite file under the
    user's state directory, one per broker namespace (host, port, vhost,
    prefix), so every process of this machine finds the same one whatever
    its working directory.  Other machines have files of their own: the
    announcement (``announce.py``) refuses the second one."""
    parts = urlsplit(amqp_url)
    port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    label = DEFAULT_STATE_NAME.format(
        host=(parts.hostname or "localhost").lower(), port=port, vhost=vhost, prefix=prefix
    )
    digest = hashlib.sha256(label.encode()).hexdigest()[:8]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", label)[:100]
    return f"sqlite:///{identity.state_dir() / f'{slug}-{digest}.db'}"


def make_state_dir(path: Path, state_url: str) -> None:
    """Make the default state store's directory (private to the user), and
    say so when the old default file sits in the working directory: its
    records are not read any more."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if os.path.exists(OLD_DEFAULT_STATE):
        log.warning(
            "%s is the default state store of earlier versions; the default is now %s "
            "(the same from every working directory): move the file there, with every "
            "process stopped, to keep its records",
            os.path.abspath(OLD_DEFAULT_STATE),
            mask_url(state_url),
        )


def state_url_option(state_url: str) -> str:
    """``state_url`` quoted for the ``state=`` option of an amqp:// URL."""
    return quote(state_url, safe="")
