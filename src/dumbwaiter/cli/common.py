"""What every command shares: finding the app, running coroutines, output."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable, Coroutine
from types import ModuleType
from typing import Any, TypeVar

import click

from ..app import URL_ENV, App
from ..errors import ConfigurationError

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

APP_ENV = "DUMBWAITER_APP"
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def load_app(spec: str) -> App:
    """Import ``module:attr`` (the current directory is on the path, as for
    ``python -m``) and return the App it names.

    Nothing found there is called: a factory form is not documented, and
    calling whatever callable the user named ran their code inside the CLI
    (``--app side:wipe_cache`` wiped the cache).  Anything but an App is a
    usage error that names what it is and where the App is.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise click.UsageError(
            f"--app {spec!r}: expected module:attribute, e.g. myproject.jobs:app"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.UsageError(f"--app {spec!r}: cannot import {module_name!r}: {exc}") from exc
    obj: Any = module
    for part in (attr or "app").split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise click.UsageError(
                f"--app {spec!r}: module {module_name!r} has no attribute {attr or 'app'!r}"
                f"; {_where_the_app_is(module)}"
            ) from None
    if not isinstance(obj, App):
        from ..task import Task

        called = (
            " (--app calls nothing to find one)"
            if callable(obj) and not isinstance(obj, Task)
            else ""
        )
        raise click.UsageError(
            f"{module_name}:{attr or 'app'} is {_what(obj)}, not a dumbwaiter App{called}; "
            + _where_the_app_is(module)
        )
    return obj


def _what(obj: Any) -> str:
    """``obj`` in a few words: a Task, a function, a class..."""
    from ..task import Task

    if isinstance(obj, Task):
        return "a Task"
    if inspect.isclass(obj):
        return f"the class {obj.__qualname__}"
    if inspect.isroutine(obj):
        return "a function"
    if inspect.ismodule(obj):
        return "a module"
    return f"a {type(obj).__name__}"


def _where_the_app_is(module: ModuleType) -> str:
    """Point at the module's App(s), or say what one looks like."""
    name = module.__name__
    apps = sorted(k for k, v in vars(module).items() if isinstance(v, App))
    if apps:
        return "point --app at the App, e.g. " + " or ".join(f"{name}:{a}" for a in apps)
    return (
        f"point --app at a module-level App, e.g. {name}:app for "
        "`app = dumbwaiter.App(...)` in that module"
    )


def app_options(fn: F) -> F:
    """``--app`` and ``--url`` on a command that works from either (admin
    commands need no task code); it receives ``app_spec`` and ``url``."""
    fn = click.option(
        "--url",
        envvar=URL_ENV,
        help=f"Broker URL, when no --app is given [env {URL_ENV}].",
    )(fn)
    return _app_spec(fn)


def app_option(fn: F) -> F:
    """``--app`` alone, on a command that needs the app's code (its tasks,
    event classes, schedules): a bare broker URL would give it nothing to
    run, so it is not offered.  The command receives ``app_spec``; a
    ``--url`` given anyway is refused saying why (a hidden option, so the
    help does not offer it)."""

    def no_url(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
        if value is not None:
            raise click.UsageError(
                f"{ctx.command_path} runs the app's code, which a broker URL does not "
                f"have: give --app MODULE:ATTR (or ${APP_ENV}); the app names its broker",
                ctx,
            )

    fn = click.option("--url", hidden=True, expose_value=False, callback=no_url)(fn)
    return _app_spec(fn)


def _app_spec(fn: F) -> F:
    return click.option(
        "--app",
        "app_spec",
        envvar=APP_ENV,
        metavar="MODULE:ATTR",
        help=f"The dumbwaiter.App to use [env {APP_ENV}].",
    )(fn)


def resolve_app(app_spec: str | None, url: str | None) -> App:
    """The App of ``--app``, else one on the ``--url`` broker."""
    if app_spec:
        return load_app(app_spec)
    try:
        return App(url)
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from exc


def require_app(app_spec: str | None) -> App:
    """The App of ``--app``, for a command that cannot work without its code."""
    if not app_spec:
        raise click.UsageError(f"this command needs --app MODULE:ATTR (or ${APP_ENV})")
    return load_app(app_spec)


def run(coro: Coroutine[Any, Any, T]) -> T:
    import asyncio

    return asyncio.run(coro)


def log_level_option(fn: F) -> F:
    """``--log-level`` on a long-running command; the command receives ``log_level``."""
    return click.option(
        "--log-level",
        default="INFO",
        show_default=True,
        type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    )(fn)


def log_format_option(fn: F) -> F:
    """``--log-format text|json``; the command receives ``log_format``."""
    from ..logs import FORMAT_ENV, FORMATS

    return click.option(
        "--log-format",
        type=click.Choice(FORMATS),
        default="text",
        show_default=True,
        envvar=FORMAT_ENV,
        help="Log lines for people (text) or one JSON object per line with stable keys "
        f"(json) [env {FORMAT_ENV}].",
    )(fn)


def setup_logging(level: str, fmt: str = "text") -> None:
    """One log format for every long-running command (``logs.setup``): the
    pid tells the processes of ``--processes N`` (and replicas on one host)
    apart; ``json`` makes every line one JSON object."""
    from ..logs import setup

    setup(level, fmt)


def loop_option(fn: F) -> F:
    """``--loop`` on a long-running command; the command receives ``loop``."""
    from ..loop import LOOP_ENV, LOOPS

    return click.option(
        "--loop",
        "loop",
        type=click.Choice(LOOPS),
        default="auto",
        show_default=True,
        envvar=LOOP_ENV,
        help=f"Event loop: uvloop when installed (auto), or asyncio's own [env {LOOP_ENV}].",
    )(fn)


def serve(coro: Coroutine[Any, Any, T], loop: str) -> T:
    """Run a long-running command's coroutine on the ``--loop`` it chose.

    Everything imported and built so far (the app, its modules, pydantic's
    schemas: a few hundred thousand objects) lives as long as the process, so
    it is moved out of the garbage collector's reach first (``gc.freeze``).
    Otherwise the first full collection, soon after the first fetched batch
    allocates, walks all of it: a 30-60 ms pause of the event loop in which
    every running job's timers wait (seen as one slow wave in each W4 run:
    fifty 10 ms sleeps taking 40-60 ms; with the freeze, none over 13 ms).
    """
    import gc

    from ..errors import ConfigurationError, MissingDependency
    from ..loop import run as run_on

    gc.collect()
    gc.freeze()
    try:
        return run_on(coro, loop)
    except MissingDependency as exc:
        coro.close()
        raise click.UsageError(str(exc)) from None
    except ConfigurationError as exc:
        # a refusal at start (another state store announced for the broker
        # namespace, a schema not migrated): its message says what to change
        raise click.ClickException(str(exc)) from None
