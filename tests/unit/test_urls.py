"""Broker URLs are checked at ``dw.App(url)``, before anything connects.

Every broker (and scheme) rejects an unknown query option, naming it, the
option meant and the known ones; and a value that cannot work, naming the
option and what it takes.  Options handed to the client library keep
working.  A missing extra fails at ``App()`` with the pip line.  No URL shown
anywhere carries the password, and every one keeps the user name.  None of
this needs a server: it all happens before the first connect.
"""

from __future__ import annotations

import importlib
import inspect
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner

import dumbwaiter as dw
from dumbwaiter.cli import main

if TYPE_CHECKING:
    from dumbwaiter.brokers.urlopts import Table

SECRET = "s3cret-pw"
DOCS = Path(__file__).resolve().parents[2] / "docs"


def _sqlite(tmp_path: Path, query: str) -> str:
    return f"sqlite:///{tmp_path}/urls.db?{query}"


#: scheme -> a URL of it with a user and a password (where the scheme has
#: them), ending in "?" or "&" so that one option can be appended
BASES: dict[str, str] = {
    "memory": "memory://urls?",
    "sqlite": "",  # built from tmp_path
    "redis": f"redis://app:{SECRET}@127.0.0.1:6379/7?",
    "rediss": f"rediss://app:{SECRET}@127.0.0.1:6380/0?",
    "postgresql": f"postgresql://app:{SECRET}@127.0.0.1:5432/test?",
    "postgres": f"postgres://app:{SECRET}@127.0.0.1:5432/test?",
    "amqp": f"amqp://app:{SECRET}@127.0.0.1:5672/%2F?state=memory%3A%2F%2Furls&",
    "amqps": f"amqps://app:{SECRET}@127.0.0.1:5671/%2F?state=memory%3A%2F%2Furls&",
    "nats": f"nats://app:{SECRET}@127.0.0.1:4222?",
    "kafka": f"kafka://app:{SECRET}@127.0.0.1:9092?state=redis%3A%2F%2F127.0.0.1%2F0&",
}

#: scheme -> the module that declares its options (``OPTIONS``)
DECLARED: dict[str, str] = {
    "memory": "dumbwaiter.brokers.memory.broker",
    "sqlite": "dumbwaiter.brokers.sqlite.options",
    "redis": "dumbwaiter.brokers.redis.broker",
    "rediss": "dumbwaiter.brokers.redis.broker",
    "postgresql": "dumbwaiter.brokers.postgres.options",
    "postgres": "dumbwaiter.brokers.postgres.options",
    "amqp": "dumbwaiter.brokers.rabbitmq.options",
    "amqps": "dumbwaiter.brokers.rabbitmq.options",
    "nats": "dumbwaiter.brokers.nats.names",
    "kafka": "dumbwaiter.brokers.kafka.options",
}


def _table(scheme: str) -> Table:
    table: Table = importlib.import_module(DECLARED[scheme]).OPTIONS
    return table


def mask_url(url: str) -> str:
    from dumbwaiter.redact import mask_url as mask

    return mask(url)


def _url(scheme: str, query: str, tmp_path: Path) -> str:
    return _sqlite(tmp_path, query) if scheme == "sqlite" else BASES[scheme] + query


def _refused(url: str) -> str:
    with pytest.raises(dw.InvalidURL) as info:
        dw.App(url)
    assert isinstance(info.value, dw.ConfigurationError)
    text = str(info.value)
    assert SECRET not in text
    if "app:" in url:
        assert "app:***@" in text, text  # the user name stays, the password does not
    return text


TYPOS = [
    ("memory", "retentoin=5", "retention"),
    ("sqlite", "busy_timout=1", "busy_timeout"),
    ("redis", "prefx=x", "prefix"),
    ("rediss", "ssl_ca_cert=/etc/ca.pem", "ssl_ca_certs"),
    ("postgresql", "schemma=jobs", "schema"),
    ("postgres", "sslmod=require", "sslmode"),
    ("amqp", "prefx=x", "prefix"),
    ("amqps", "heartbaet=5", "heartbeat"),
    ("nats", "ack_wiat=5", "ack_wait"),
    ("kafka", "partitons=6", "partitions"),
]


@pytest.mark.parametrize(("scheme", "query", "meant"), TYPOS, ids=[t[0] for t in TYPOS])
def test_a_typo_fails_at_app_naming_it_the_option_meant_and_the_known_ones(
    scheme: str, query: str, meant: str, tmp_path: Path
) -> None:
    text = _refused(_url(scheme, query, tmp_path))
    bad = query.partition("=")[0]
    assert f"unknown option {bad!r}" in text
    assert f"Did you mean {meant!r}?" in text
    for name in _table(scheme).options:
        assert name in text


BAD_VALUES = [
    ("memory", "retention=-1", "retention", "0 or more"),
    ("sqlite", "synchronous=maybe", "synchronous", "one of off, normal, full, extra"),
    ("redis", "retention=soon", "retention", "a number of seconds"),
    ("redis", "wait_timeout=0", "wait_timeout", "0.001 or more"),
    ("rediss", "ssl_check_hostname=perhaps", "ssl_check_hostname", "true or false"),
    ("postgresql", "pool_max=lots", "pool_max", "a whole number of 2 or more"),
    ("postgres", "sslmode=always", "sslmode", "one of disable"),
    ("amqp", "heartbeat=-1", "heartbeat", "from 0 to 65535"),
    ("amqps", "no_verify_ssl=maybe", "no_verify_ssl", "true or false"),
    ("nats", "ack_wait=-5", "ack_wait", "greater than 0"),
    ("nats", "tls=ture", "tls", "true or false"),
]


@pytest.mark.parametrize(
    ("scheme", "query", "option", "accepts"), BAD_VALUES, ids=[f"{b[0]}-{b[2]}" for b in BAD_VALUES]
)
def test_a_bad_value_fails_at_app_naming_the_option_and_what_it_takes(
    scheme: str, query: str, option: str, accepts: str, tmp_path: Path
) -> None:
    text = _refused(_url(scheme, query, tmp_path))
    key, _, raw = query.partition("=")
    assert f"{key}={raw!r} is not accepted" in text, text
    assert f"{option} takes" in text and accepts in text, text


BAD_HOSTS = [
    ("redis", f"redis://app:{SECRET}@127.0.0.1:99999/0", "port '99999'"),
    ("redis", f"redis://app:{SECRET}@:6379/0", "empty host"),
    ("redis", f"redis://app:{SECRET}@127.0.0.1:6379/zero", "'zero'"),
    ("postgresql", f"postgresql://app:{SECRET}@127.0.0.1:65536/test", "port '65536'"),
    ("amqp", f"amqp://app:{SECRET}@127.0.0.1:99999/", "port '99999'"),
    ("amqp", f"amqp://app:{SECRET}@127.0.0.1:abc/", "port 'abc'"),
    ("amqps", f"amqps://app:{SECRET}@/", "names no host"),
    ("nats", f"nats://app:{SECRET}@h1:4222,,h2", "empty host"),
    ("nats", f"nats://app:{SECRET}@h1:4222,h2:0", "port '0'"),
    ("kafka", f"kafka://app:{SECRET}@k1:9092,k2:99999?state=redis%3A%2F%2Fr", "port '99999'"),
]


@pytest.mark.parametrize(("scheme", "url", "says"), BAD_HOSTS, ids=[b[2] for b in BAD_HOSTS])
def test_a_bad_host_or_port_fails_at_app(scheme: str, url: str, says: str) -> None:
    text = _refused(url)
    assert says in text, text
    if says.startswith("port"):
        assert "is not a number from 1 to 65535" in text


def test_an_unknown_scheme_or_no_scheme_is_refused_without_the_password() -> None:
    assert "'pulsar'" in _refused(f"pulsar://app:{SECRET}@127.0.0.1:6650")
    assert "no scheme" in _refused(f"app:{SECRET}@127.0.0.1")


def test_an_option_given_twice_or_for_another_scheme_is_refused() -> None:
    assert "given twice" in _refused(BASES["redis"] + "prefix=a&prefix=b")
    assert "applies to rediss:// only" in _refused(BASES["redis"] + "ssl_ca_certs=/etc/ca.pem")
    assert "applies to amqps:// only" in _refused(BASES["amqp"] + "cafile=/etc/ca.pem")


def test_a_bad_state_url_of_rabbitmq_names_both_urls() -> None:
    state = f"redis%3A%2F%2Fst%3A{SECRET}%40127.0.0.1%2F0%3Fprefx%3Dx"
    text = _refused(f"amqp://app:{SECRET}@127.0.0.1/%2F?state={state}")
    assert "state=" in text and "unknown option 'prefx' in redis URL" in text


def test_options_for_the_client_library_still_reach_it() -> None:
    pg = dw.App(
        BASES["postgresql"] + "schema=jobs&sslmode=require&target_session_attrs=read-write"
        "&options=-csearch_path%3Dx&connect_timeout=4"
    ).broker
    conninfo = pg.opts.conninfo  # type: ignore[attr-defined]
    for part in ("sslmode=require", "target_session_attrs=read-write", "connect_timeout=4"):
        assert part in conninfo
    assert "application_name=dumbwaiter" in conninfo and "schema=" not in conninfo
    assert "postgresql:///test?" in dw.App("postgresql:///test").broker.opts.conninfo  # type: ignore[attr-defined]

    r = dw.App(
        BASES["rediss"] + "prefix=p&ssl_ca_certs=/etc/ca.pem&ssl_check_hostname=off&client_name=w"
    ).broker
    kwargs = r.conn.target.sync_kwargs  # type: ignore[attr-defined]
    assert kwargs["ssl_ca_certs"] == "/etc/ca.pem" and kwargs["ssl_check_hostname"] is False
    assert kwargs["client_name"] == "w" and "prefix" not in kwargs

    a = dw.App(BASES["amqps"] + "heartbeat=5&no_verify_ssl=false&cafile=/etc/ca.pem").broker
    amqp_url = a.amqp_url  # type: ignore[attr-defined]
    # aiormq verifies only when no_verify_ssl is exactly "0": "false" must not turn it off
    assert "heartbeat=5" in amqp_url and "no_verify_ssl=0" in amqp_url
    assert "state=" not in amqp_url


def _init_params(cls: type) -> set[str]:
    """Keyword parameters a class' constructor takes, following ``**kwargs`` up the MRO."""
    out: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters.values()
        out |= {
            p.name for p in params if p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD
        }
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return out


def test_every_option_passed_to_redis_py_is_one_its_connections_take() -> None:
    from redis import connection as sync_connection
    from redis.asyncio import connection as async_connection

    table = _table("redis")
    for name in table.passed:
        opt = table.options[name]
        tls = opt.schemes == ("rediss",)
        for module in (sync_connection, async_connection):
            cls = module.SSLConnection if tls else module.Connection
            assert name in _init_params(cls), (name, cls)


def test_libpq_parameters_are_checked_by_libpq_s_own_list() -> None:
    # the keys come from libpq (psycopg.pq.Conninfo.get_defaults), so this
    # libpq's parameters all pass and a misspelt one is refused
    from dumbwaiter.brokers.postgres.options import _libpq_keys

    assert "target_session_attrs" in _libpq_keys()
    text = _refused(BASES["postgresql"] + "target_sesion_attrs=any")
    assert "Did you mean 'target_session_attrs'?" in text


# -- missing extras ------------------------------------------------------------------

EXTRAS = [
    ("redis://127.0.0.1:6379/0", ["redis"], "redis"),
    ("rediss://127.0.0.1:6380/0", ["redis"], "redis"),
    ("postgresql://127.0.0.1/test", ["psycopg"], "postgres"),
    ("postgres://127.0.0.1/test", ["psycopg_pool"], "postgres"),
    ("amqp://127.0.0.1/", ["aiormq"], "rabbitmq"),
    ("amqps://127.0.0.1/", ["pamqp"], "rabbitmq"),
    ("nats://127.0.0.1:4222", ["nats"], "nats"),
    ("kafka://127.0.0.1:9092?state=redis%3A%2F%2F127.0.0.1%2F0", ["aiokafka"], "kafka"),
]


@pytest.mark.parametrize(("url", "blocked", "extra"), EXTRAS, ids=[e[0] for e in EXTRAS])
def test_a_missing_extra_fails_at_app_with_the_pip_line(
    url: str, blocked: list[str], extra: str
) -> None:
    """Run in a fresh interpreter where the extra's package cannot be imported
    (``sys.modules[name] = None`` makes any import of it fail)."""
    code = textwrap.dedent(
        f"""
        import sys
        for name in {blocked!r}:
            sys.modules[name] = None
        import dumbwaiter as dw
        try:
            app = dw.App({url!r})
        except dw.MissingDependency as exc:
            print("MissingDependency:", exc)
        else:
            print("built", app)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("MissingDependency:"), out.stdout
    assert f"pip install 'dumbwaiter[{extra}]'" in out.stdout
    assert f"needs {blocked[0]!r}" in out.stdout


# -- the password never shows --------------------------------------------------------

SHOWN = [
    f"redis://app:{SECRET}@127.0.0.1:6379/7?prefix=p",
    f"rediss://app:{SECRET}@127.0.0.1:6380/0?prefix=p",
    f"postgresql://app:{SECRET}@127.0.0.1:5432/test?schema=s",
    f"postgres://app:{SECRET}@127.0.0.1:5432/test?sslpassword={SECRET}",
    f"amqp://app:{SECRET}@127.0.0.1:5672/%2F?state=redis%3A%2F%2Fst%3A{SECRET}%40127.0.0.1%2F0",
    f"amqps://app:{SECRET}@127.0.0.1:5671/%2F?state=memory%3A%2F%2Fx",
    f"nats://app:{SECRET}@127.0.0.1:4222?token={SECRET}",
    f"kafka://app:{SECRET}@127.0.0.1:9092?state=redis%3A%2F%2Fst%3A{SECRET}%40127.0.0.1%2F0",
]


@pytest.mark.parametrize("url", SHOWN, ids=[u.partition(":")[0] for u in SHOWN])
def test_repr_of_the_app_and_its_broker_masks_the_password_only(url: str) -> None:
    app = dw.App(url)
    assert "app:***@127.0.0.1" in repr(app)
    for text in (repr(app), repr(app.broker), mask_url(url)):
        assert SECRET not in text, text


def test_mask_url_keeps_a_user_name_without_a_password() -> None:
    assert mask_url("postgresql://app@db/app") == "postgresql://app@db/app"
    assert mask_url("postgresql://app:pw@db/app") == "postgresql://app:***@db/app"
    assert mask_url(f"nats://app:{SECRET}@h1,h2:4223/ns") == "nats://app:***@h1,h2:4223/ns"
    masked = mask_url(f"amqp://h/?state=redis%3A%2F%2Fu%3A{SECRET}%40r%2F0&prefix=p")
    assert SECRET not in masked and "redis://u:***@r/0" in masked and "prefix=p" in masked


def test_the_cli_shows_a_bad_url_in_one_line_without_the_password() -> None:
    r = CliRunner().invoke(main, ["stats", "--url", BASES["redis"] + "prefx=x"])
    assert r.exit_code == 2, r.output
    assert SECRET not in r.output and "app:***@127.0.0.1" in r.output
    assert "unknown option 'prefx'" in r.output and "Did you mean 'prefix'?" in r.output
    assert "Traceback" not in r.output


# -- the docs list what the tables declare --------------------------------------------

PAGES = {
    "sqlite.md": "sqlite",
    "redis.md": "redis",
    "postgres.md": "postgresql",
    "rabbitmq.md": "amqp",
    "nats.md": "nats",
    "kafka.md": "kafka",
}


def _documented(page: str) -> dict[str, str]:
    """The option table of a broker page (the first whose header starts with
    ``| option |``): every backticked name of a row's first cell -> its
    default cell."""
    rows: dict[str, str] = {}
    in_table = False
    for line in (DOCS / page).read_text().splitlines():
        if line.startswith("| option |"):
            in_table = True
            continue
        if in_table:
            if not line.startswith("|"):
                break
            cells = [c.strip() for c in line.strip("|").split("|")]
            if set(cells[0]) <= {"-", " ", ":"}:
                continue
            for name in re.findall(r"`([^`]+)`", cells[0]):
                rows[name] = cells[1]
    return rows


@pytest.mark.parametrize("page", list(PAGES))
def test_each_broker_page_documents_exactly_its_declared_options(page: str) -> None:
    table = _table(PAGES[page])
    documented = _documented(page)
    assert set(documented) == set(table.options), page
    for name, default in documented.items():
        literal = re.fullmatch(r"`([^`]*)`", default)
        if literal:  # a plain default must be the declared one
            assert literal.group(1) == table.options[name].shown_default, (page, name)


def test_every_option_has_help_and_a_default_its_own_check_accepts() -> None:
    for scheme in DECLARED:
        table = _table(scheme)
        for opt in table.options.values():
            assert opt.help, (table.label, opt.name)
            if opt.default is not None and opt.shown_default:
                assert opt.convert(opt.shown_default) == opt.default, (table.label, opt.name)
