"""Event contracts: schema, lock, check (the CI gate), and the events CLI."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner, Result

import dumbwaiter as dw
from dumbwaiter.cli import main
from dumbwaiter.contracts import check, compare, lock_document
from dumbwaiter.testing import drain
from tests.apps import eventsapp


class PlacedV1(dw.Event, type="contract.placed_before"):
    order_id: str
    total: int
    note: str | None = None


class PlacedRemoved(dw.Event, type="contract.placed_removed"):
    order_id: str
    note: str | None = None


class PlacedRetyped(dw.Event, type="contract.placed_retyped"):
    order_id: str
    total: str
    note: str | None = None


class PlacedRequired(dw.Event, type="contract.placed_required"):
    order_id: str
    total: int
    note: str | None = None
    currency: str


class PlacedOptional(dw.Event, type="contract.placed_optional"):
    order_id: str
    total: int
    note: str | None = None
    currency: str = "EUR"
    """A field's description is cosmetic."""


def _lock_of(cls: type[dw.Event]) -> dict[str, object]:
    return lock_document({("contract.placed", 1): cls})


@pytest.mark.parametrize(
    ("now", "problem"),
    [
        (PlacedRemoved, "field 'total' was removed or renamed"),
        (PlacedRetyped, "field 'total' changed type (integer -> string)"),
        (PlacedRequired, "new required field 'currency'"),
    ],
)
def test_incompatible_changes_without_a_bump_fail(now: type[dw.Event], problem: str) -> None:
    report = check(_lock_of(PlacedV1), {("contract.placed", 1): now})
    assert not report.ok
    assert any(problem in p and "without a version bump" in p for p in report.problems)


def test_compatible_changes_and_version_bumps_pass() -> None:
    assert check(_lock_of(PlacedV1), {("contract.placed", 1): PlacedOptional}).ok
    bumped = check(
        _lock_of(PlacedV1),
        {("contract.placed", 1): PlacedV1, ("contract.placed", 2): PlacedRetyped},
    )
    assert bumped.ok
    assert "contract.placed version 2 is new" in bumped.notes
    assert compare(PlacedV1.model_json_schema(), PlacedV1.model_json_schema()) == []


def test_a_version_never_goes_down() -> None:
    lock = lock_document({("contract.placed", 3): PlacedV1})
    report = check(lock, {("contract.placed", 2): PlacedV1})
    assert any("versions only go up" in p for p in report.problems)


@pytest.fixture
def url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    u = f"sqlite:///{tmp_path}/events.db"
    monkeypatch.setenv(eventsapp.URL_ENV, u)
    monkeypatch.chdir(tmp_path)
    return u


def cli(*args: str) -> Result:
    return CliRunner().invoke(
        main, [args[0], *args[1:2], "--app", "tests.apps.eventsapp:app", *args[2:]]
    )


def test_events_ls_schema_lock_and_check(url: str, tmp_path: Path) -> None:
    out = cli("events", "ls", "--json")
    assert out.exit_code == 0, out.output
    rows = {r["type"]: r for r in orjson.loads(out.stdout)["events"]}
    assert rows["account.signup_completed"]["versions"] == [1, 2]
    assert rows["account.signup_completed"]["groups"] == ["email"]
    assert rows["billing.invoice_paid"]["groups"] == []

    out = cli("events", "schema", "billing.invoice_paid")
    assert out.exit_code == 0
    schema = orjson.loads(out.stdout)["billing.invoice_paid"]["1"]
    assert schema["required"] == ["invoice_id", "cents"]

    assert cli("events", "lock").exit_code == 0
    lock = tmp_path / "events.lock.json"
    out = cli("events", "check")
    assert out.exit_code == 0 and "event contracts: OK" in out.stdout

    # someone changed the locked contract: the lock had a field the code dropped
    doc = orjson.loads(lock.read_bytes())
    doc["events"]["billing.invoice_paid"]["1"]["properties"]["currency"] = {"type": "string"}
    lock.write_bytes(orjson.dumps(doc))
    out = cli("events", "check")
    assert out.exit_code == 1
    assert (
        "INCOMPATIBLE  billing.invoice_paid version 1: field 'currency' was removed" in out.stdout
    )
    assert "make it version 2 and add an upcaster" in out.stdout

    assert "no lock file" in cli("events", "check", "--file", "missing.json").output


def test_publish_and_replay_from_the_cli(url: str) -> None:
    eventsapp.HANDLED.clear()
    out = cli("publish", "account.signup_completed", "--payload", '{"user_id": 7}', "--json")
    assert out.exit_code == 0, out.output
    assert orjson.loads(out.stdout)["version"] == 2
    bad = cli("publish", "account.signup_completed", "--payload", '{"user_id": "x"}')
    assert bad.exit_code == 2 and "not a valid account.signup_completed" in bad.output

    app = eventsapp.create_app()
    asyncio.run(drain(app))
    assert eventsapp.HANDLED == ["welcome:7"]

    out = cli("events", "replay", "account.signup_completed", "--group", "email")
    assert out.exit_code == 0 and "1 event of account.signup_completed" in out.stdout
    asyncio.run(drain(app))
    assert eventsapp.HANDLED == ["welcome:7"]  # the group's inbox: already handled
    out = cli("events", "replay", "account.signup_completed", "-g", "email", "--force")
    asyncio.run(drain(app))
    assert eventsapp.HANDLED == ["welcome:7", "welcome:7"]


def test_publish_with_only_a_url_needs_no_app_code(url: str) -> None:
    """``publish --help`` offers --url, and it works: without the event class
    the payload is published as given, in the version the caller names, and
    the subscriber validates (and upgrades) it."""
    eventsapp.HANDLED.clear()
    app = eventsapp.create_app()
    asyncio.run(drain(app))  # a worker has bound the group before the event
    assert "--url" in CliRunner().invoke(main, ["publish", "--help"]).stdout

    def bare(*args: str) -> Result:
        return CliRunner().invoke(main, ["publish", "account.signup_completed", *args])

    unversioned = bare("--payload", '{"user_id": 7}', "--url", url)
    assert unversioned.exit_code == 2 and "give --event-version N" in unversioned.stderr
    out = bare("--payload", '{"user_id": 7}', "--event-version", "1", "--url", url, "--json")
    assert out.exit_code == 0, out.output
    assert orjson.loads(out.stdout)["version"] == 1
    asyncio.run(drain(app))
    assert eventsapp.HANDLED == ["welcome:7"]  # upgraded from version 1 and handled
    # with --app a version is checked against the app's classes
    wrong = cli("publish", "account.signup_completed", "--payload", "{}", "--event-version", "3")
    assert (
        wrong.exit_code == 2 and "has no version 3 in this app; its versions: 1, 2" in wrong.stderr
    )
