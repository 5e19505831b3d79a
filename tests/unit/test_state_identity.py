"""What tells one state store from another (``brokers/identity.py``), the
default RabbitMQ state store's place, and the ``multi_host`` each broker
reports: no server needed."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from dumbwaiter.brokers import from_url
from dumbwaiter.brokers.identity import absolute_url, identity_of, state_dir
from dumbwaiter.brokers.rabbitmq.broker import RabbitMQBroker

AMQP = "amqp://guest:guest@127.0.0.1:5672/%2F"


def test_the_default_state_store_is_one_absolute_file_from_any_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default used to be ``sqlite:///dumbwaiter-state.db``: relative,
    so two services of one machine in two directories split it."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    seen = set()
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        monkeypatch.chdir(tmp_path / d)
        seen.add(RabbitMQBroker(f"{AMQP}?prefix=shop").state_url)
    [url] = seen
    assert url is not None and url.startswith(f"sqlite:///{tmp_path}/xdg/dumbwaiter/")
    # one file per broker namespace: host, port, vhost, prefix
    others = {
        RabbitMQBroker(u).state_url
        for u in (
            f"{AMQP}?prefix=mail",
            "amqp://guest:guest@10.0.0.7:5672/%2F?prefix=shop",
            "amqp://guest:guest@127.0.0.1:5673/%2F?prefix=shop",
            "amqp://guest:guest@127.0.0.1:5672/staging?prefix=shop",
        )
    }
    assert len(others) == 4 and url not in others


def test_the_state_directory_follows_xdg_and_falls_back_to_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    assert state_dir() == tmp_path / "home" / ".local" / "state" / "dumbwaiter"
    monkeypatch.setenv("XDG_STATE_HOME", "relative/dir")  # invalid by the XDG spec: ignored
    assert state_dir() == tmp_path / "home" / ".local" / "state" / "dumbwaiter"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert state_dir() == tmp_path / "xdg" / "dumbwaiter"


def test_a_relative_state_url_is_made_absolute_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert (
        absolute_url("sqlite:///s.db?busy_timeout=3") == f"sqlite:///{tmp_path}/s.db?busy_timeout=3"
    )
    assert absolute_url("sqlite:////srv/s.db") == "sqlite:////srv/s.db"
    assert absolute_url("redis://h:6379/0") == "redis://h:6379/0"
    b = RabbitMQBroker(f"{AMQP}?state=sqlite%3A%2F%2F%2Fs.db")
    assert b.state_url == f"sqlite:///{tmp_path}/s.db"


async def test_a_single_host_store_is_another_store_on_another_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One SQLite file, seen from two hosts (a copied image, a network
    share): one store id, two identities.  A server store's identity is its
    id alone, whatever the host."""
    store = from_url(f"sqlite:///{tmp_path}/s.db")
    again = from_url(f"sqlite:///{tmp_path}/s.db")
    try:
        monkeypatch.setattr(socket, "gethostname", lambda: "web-1")
        one = await identity_of(store)
        assert (await identity_of(again)).key == one.key  # the same file, the same host
        monkeypatch.setattr(socket, "gethostname", lambda: "web-2")
        two = await identity_of(again)
        assert two.store_id == one.store_id and two.key != one.key
        assert "on host web-1" in one.describe() and f"{tmp_path}/s.db" in one.describe()
        other = from_url(f"sqlite:///{tmp_path}/other.db")
        assert (await identity_of(other)).store_id != one.store_id
        await other.close()
    finally:
        await store.close()
        await again.close()


@pytest.mark.parametrize(
    ("url", "multi_host"),
    [
        ("memory://", False),
        ("sqlite:///x.db", False),
        ("redis://127.0.0.1:6379/0", True),
        ("postgresql://u@127.0.0.1:5432/db", True),
        ("nats://127.0.0.1:4222", True),
        (f"{AMQP}?state=sqlite%3A%2F%2F%2Fx.db", False),
        (f"{AMQP}?state=memory%3A%2F%2F", False),
        (f"{AMQP}", False),  # the default state store: one machine's
        (f"{AMQP}?state=redis%3A%2F%2F127.0.0.1%3A6379%2F0", True),
        (f"{AMQP}?state=postgresql%3A%2F%2Fu%40127.0.0.1%3A5432%2Fdb", True),
    ],
)
def test_every_broker_reports_a_truthful_multi_host(url: str, multi_host: bool) -> None:
    broker = from_url(url)
    assert broker.capabilities.multi_host is multi_host
    # a RabbitMQ app names its state store; the others keep the state themselves
    assert (broker.state_url is not None) is url.startswith("amqp")
