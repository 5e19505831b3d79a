"""``dumbwaiter dashboard``: serve the web dashboard with uvicorn.

Bound to 127.0.0.1 by default.  On any other address it refuses to start
without an auth setting (``--token`` or ``--basic-auth``): a dashboard can
replay and purge dead letters, so it is never open to a network by accident.
"""

from __future__ import annotations

import logging

import click

from ..errors import MissingDependency
from ..redact import mask_url
from .common import app_options, log_level_option, resolve_app, setup_logging

log = logging.getLogger("dumbwaiter.cli")

TOKEN_ENV = "DUMBWAITER_DASHBOARD_TOKEN"
BASIC_ENV = "DUMBWAITER_DASHBOARD_AUTH"


@click.command()
@app_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--token",
    envvar=TOKEN_ENV,
    help="Require this bearer token (16+ characters; a login form sets a cookie) "
    f"[env {TOKEN_ENV}].",
)
@click.option(
    "--basic-auth",
    metavar="USER:PASSWORD",
    envvar=BASIC_ENV,
    help=f"Require HTTP Basic auth [env {BASIC_ENV}].",
)
@click.option("--alerts", is_flag=True, help="Also evaluate the app's alert rules in this process.")
@click.option(
    "--refresh",
    type=click.FloatRange(min=0.5),
    default=2.0,
    show_default=True,
    help="Seconds queue stats are reused between requests.",
)
@log_level_option
def dashboard(
    app_spec: str | None,
    url: str | None,
    host: str,
    port: int,
    token: str | None,
    basic_auth: str | None,
    alerts: bool,
    refresh: float,
    log_level: str,
) -> None:
    """Serve the dashboard: queues, jobs, dead letters (replay, purge), workers,
    schedules, alerts and /metrics."""
    setup_logging(log_level)
    try:
        import uvicorn

        from ..dashboard import create_app
        from ..dashboard.security import Auth, is_loopback
    except ImportError as exc:
        raise click.UsageError(
            f"the dashboard needs {getattr(exc, 'name', None) or exc}: "
            "pip install 'dumbwaiter[dashboard]'"
        ) from exc
    if token and basic_auth:
        raise click.UsageError("give --token or --basic-auth, not both")
    try:
        auth = Auth(token=token) if token else Auth.basic(basic_auth) if basic_auth else None
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    if auth is None and not is_loopback(host):
        raise click.UsageError(
            f"refusing to serve the dashboard on {host} without authentication: anyone who "
            f"reaches it could replay or purge jobs. Give --token (or ${TOKEN_ENV}) or "
            f"--basic-auth USER:PASSWORD, or bind to 127.0.0.1."
        )
    app = resolve_app(app_spec, url)
    try:
        star = create_app(app, auth=auth, alerts=alerts, refresh=refresh)
    except MissingDependency as exc:
        raise click.UsageError(str(exc)) from exc
    log.info(
        "dashboard of %s on http://%s:%d/ (%s)",
        mask_url(app.url),
        host,
        port,
        f"auth: {auth.scheme}" if auth else "loopback clients only",
    )
    uvicorn.run(star, host=host, port=port, log_level=log_level.lower(), access_log=False)
