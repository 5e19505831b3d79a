"""``dumbwaiter workflows ls|show|cancel|retry|signal`` against a real SQLite file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result

import dumbwaiter as dw
from dumbwaiter.cli import main
from dumbwaiter.testing import drain_sync


class Confirmed(dw.Event, type="durable_cli.order_confirmed", version=1):
    order_id: str


def cli(url: str, *args: str) -> Result:
    return CliRunner().invoke(main, [*args, "--url", url], catch_exceptions=False)


def js(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return orjson.loads(result.stdout)


@pytest.fixture
def url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.delenv("DUMBWAITER_URL", raising=False)
    monkeypatch.delenv("DUMBWAITER_APP", raising=False)
    return f"sqlite:///{tmp_path / 'runs.db'}"


def test_workflows_commands_list_show_retry_signal_and_cancel(url: str) -> None:
    app = dw.App(url, retry=dw.Retry.never())
    broken = {"on": True}
    charged: list[str] = []

    def charge(order_id: str) -> str:
        charged.append(order_id)
        return f"ch-{order_id}"

    def ship(order_id: str) -> str:
        if broken["on"]:
            raise ConnectionError("carrier down")
        return f"parcel-{order_id}"

    @app.workflow(name="shop.order")
    def order(ctx: dw.WorkflowContext, order_id: str) -> str:
        ctx.step("charge", charge, order_id)
        return ctx.step("ship", ship, order_id)

    @app.workflow(name="shop.confirm")
    def confirm(ctx: dw.WorkflowContext, order_id: str) -> str:
        event = ctx.wait_for_event("confirmed", Confirmed, match={"order_id": order_id})
        return "confirmed" if event else "never"

    failed = order.enqueue("o-1")
    waiting = confirm.enqueue("o-2")
    doomed = confirm.enqueue("o-3")
    drain_sync(app)

    runs = js(cli(url, "workflows", "ls", "--json"))["runs"]
    assert {r["id"]: r["status"] for r in runs} == {
        failed.id: "failed",
        waiting.id: "waiting",
        doomed.id: "waiting",
    }
    only = js(cli(url, "workflows", "ls", "--status", "failed", "--json"))["runs"]
    assert [r["id"] for r in only] == [failed.id]
    table = cli(url, "workflows", "ls").stdout
    assert "shop.order" in table and "durable_cli.order_confirmed" in table

    shown = js(cli(url, "workflows", "show", failed.id, "--json"))
    assert [(s["name"], s["status"]) for s in shown["steps"]] == [
        ("charge", "done"),
        ("ship", "failed"),
    ]
    text = cli(url, "workflows", "show", failed.id).stdout
    assert "carrier down" in text and "charge" in text and "at step 'ship'" in text

    broken["on"] = False
    assert cli(url, "workflows", "retry", failed.id).stdout.strip() == f"resumed {failed.id}"
    out = cli(url, "workflows", "signal", waiting.id, "--payload", '{"order_id": "o-2"}')
    assert out.exit_code == 0, out.output
    assert cli(url, "workflows", "cancel", doomed.id).stdout.strip() == f"cancelled {doomed.id}"
    again = cli(url, "workflows", "cancel", doomed.id).stdout.strip()
    assert again == f"{doomed.id} was not cancelled: it is cancelled"
    drain_sync(app)
    assert failed.result(timeout=1) == "parcel-o-1"
    assert charged == ["o-1"]  # resumed at 'ship': the stored 'charge' did not run again
    assert waiting.result(timeout=1) == "confirmed"
    assert doomed.status() == "cancelled"

    refused = CliRunner().invoke(main, ["workflows", "retry", failed.id, "--url", url])
    assert refused.exit_code != 0 and "only a failed run can be retried" in refused.output
    unknown = CliRunner().invoke(main, ["workflows", "show", "nope", "--url", url])
    assert unknown.exit_code != 0 and "no workflow run nope" in unknown.output
    bad = CliRunner().invoke(
        main, ["workflows", "signal", waiting.id, "--payload", "[1]", "--url", url]
    )
    assert bad.exit_code != 0 and "object" in bad.output
    app.close()
