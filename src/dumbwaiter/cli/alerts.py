"""``dumbwaiter alerts rules|check``: the alert rules, as a table, as a
Prometheus rules file, or evaluated once against the broker."""

from __future__ import annotations

import click
from rich.text import Text

from ..alerts import (
    AlertService,
    LogNotifier,
    config_of,
    effective_config,
)
from ..promrules import prometheus_rules, to_yaml
from .admin import call
from .common import app_options, resolve_app
from .output import console, duration, note, print_json, table


@click.group()
def alerts() -> None:
    """Alert rules: list them, export them for Prometheus, evaluate them once."""


@alerts.command("rules")
@app_options
@click.option(
    "--prometheus",
    is_flag=True,
    help="Write the rules as a Prometheus alerting rules file (YAML) over dumbwaiter's metrics.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True),
    help="Write to this file instead of stdout.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
def rules(
    app_spec: str | None, url: str | None, prometheus: bool, output: str | None, as_json: bool
) -> None:
    """The rules of the app (``dumbwaiter.alerts.configure``), or the defaults."""
    app = resolve_app(app_spec, url)
    cfg = effective_config(app)
    if prometheus:
        text = (
            "# Prometheus alerting rules for dumbwaiter, from `dumbwaiter alerts rules "
            "--prometheus`.\n# The same rules the workers' --alerts evaluate; load with "
            "rule_files: [this file].\n" + to_yaml(prometheus_rules(cfg)) + "\n"
        )
        if output:
            with open(output, "w", encoding="utf-8") as fh:
                fh.write(text)
            note(f"wrote {output}")
        else:
            click.echo(text, nl=False)
        return
    rows = [
        {
            "rule": r.name,
            "enabled": r.enabled,
            "severity": r.severity,
            "for": r.for_,
            "fires_when": r.describe(),
            "per_queue": {q: dict(o) for q, o in r.per_queue.items()},
        }
        for r in cfg.rules
    ]
    if as_json:
        print_json(
            {
                "configured": config_of(app) is not None,
                "rules": rows,
                "webhooks": len(cfg.webhooks),
                "interval": cfg.interval,
            }
        )
        return
    t = table("rule", "fires when", "severity", "per queue")
    for r in cfg.rules:
        if r.enabled:
            per = "; ".join(f"{q}: {dict(o)}" for q, o in r.per_queue.items())
            t.add_row(Text(r.name), Text(r.describe()), Text(r.severity), Text(per))
    console().print(t)
    if config_of(app) is None:
        note("the app configures no alerts: these are the defaults (dumbwaiter.alerts.configure)")
    note(
        f"{len(cfg.webhooks)} webhook(s); evaluated every {duration(cfg.interval)} "
        "by workers with --alerts"
    )


@alerts.command("check")
@app_options
@click.option("--notify", is_flag=True, help="Send notifications (webhooks) for what fires.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
def check(app_spec: str | None, url: str | None, notify: bool, as_json: bool) -> None:
    """Evaluate the rules once against the broker and print what fires.

    Without --notify nothing is sent (only the log); exit status 1 when
    anything is firing, so it can run from cron or a health check."""
    app = resolve_app(app_spec, url)
    cfg = effective_config(app)
    service = AlertService(app, cfg, notifiers=None if notify else [LogNotifier()])

    async def go(_broker: object) -> list[dict[str, object]]:
        await service.evaluate()
        from ..alerts import active_alerts

        return [a.to_dict() for a in await active_alerts(app.broker)]

    firing = call(app, go)
    if as_json:
        print_json({"firing": firing})
    elif not firing:
        click.echo("nothing firing")
    else:
        t = table("rule", "subject", "severity", "summary")
        for a in firing:
            t.add_row(
                Text(str(a["rule"])),
                Text(str(a["subject"])),
                Text(str(a["severity"])),
                Text(str(a["summary"])),
            )
        console().print(t)
    raise SystemExit(1 if firing else 0)
