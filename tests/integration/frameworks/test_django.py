"""Django's Tasks framework (the ``django-tasks`` backport, Django 5.2) on
``dumbwaiter.contrib.django.DumbwaiterBackend``, in a minimal Django project
configured here: a SQLite database and a SQLite broker in a temporary folder.

What a Django user relies on: a task enqueued in a committed transaction
runs, one in a rolled-back transaction (or savepoint) never does, results
and failures come back through Django's ``TaskResult`` API, arguments are
checked at the call, and ``manage.py dumbwaiter_worker`` (run as a real
process) relays the outbox and runs the jobs until SIGTERM."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import django
import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

import dumbwaiter as dw
from tests.integration.redis.server import new_prefix
from tests.integration.redis.server import url as redis_url
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]
SHOP = "tests.integration.frameworks.django_shop"


@dataclass
class Site:
    folder: Path
    database: Path
    broker: str

    def tasks_setting(self, **options: Any) -> dict[str, Any]:
        return {
            "default": {
                "BACKEND": "dumbwaiter.contrib.django.DumbwaiterBackend",
                "QUEUES": ["default", "email"],
                "OPTIONS": {"url": self.broker, "retry": dw.Retry(attempts=1), **options},
            }
        }


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    folder = tmp_path_factory.mktemp("django")
    s = Site(folder, folder / "site.db", f"sqlite:///{folder}/jobs.db")
    if settings.configured:  # pragma: no cover - one configuration per process
        pytest.skip("Django settings were configured by another test module")
    settings.configure(
        USE_TZ=True,
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(s.database)}},
        INSTALLED_APPS=["django_tasks", "dumbwaiter.contrib.django", SHOP],
        TASKS=s.tasks_setting(),
    )
    django.setup()
    with connection.cursor() as cur:
        cur.execute("CREATE TABLE shop_receipts (order_id TEXT NOT NULL)")
    yield s
    from django_tasks import default_task_backend

    default_task_backend.app.close()  # type: ignore[attr-defined]


def backend() -> Any:
    from django_tasks import default_task_backend

    return default_task_backend


def drain() -> str:
    """``manage.py dumbwaiter_worker --drain``, in this process."""
    out = io.StringIO()
    call_command("dumbwaiter_worker", "--drain", "--log-level", "WARNING", stdout=out)
    return out.getvalue()


def receipts() -> list[str]:
    with connection.cursor() as cur:
        cur.execute("SELECT order_id FROM shop_receipts ORDER BY rowid")
        return [r[0] for r in cur.fetchall()]


class Rollback(Exception):
    pass


def test_a_task_enqueued_in_a_committed_transaction_runs(site: Site) -> None:
    from django_tasks import TaskResultStatus

    from tests.integration.frameworks.django_shop.tasks import send_receipt

    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("CREATE TABLE IF NOT EXISTS shop_orders (id TEXT)")
            cur.execute("INSERT INTO shop_orders (id) VALUES ('o-1')")
        result = send_receipt.enqueue("o-1")
        assert result.status == TaskResultStatus.READY
        # part of the transaction: the broker has nothing yet, but this
        # transaction sees its own outbox row
        assert backend().app.job(result.id).info() is None
        assert send_receipt.get_result(result.id).status == TaskResultStatus.READY
    assert backend().app.job(result.id).info() is None  # committed, waiting for the relay
    assert send_receipt.get_result(result.id).status == TaskResultStatus.READY

    out = drain()
    assert "relaying the outbox of database 'default'" in out
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    assert result.return_value == "receipt for o-1"
    assert result.finished_at is not None and result.attempts == 1
    assert "o-1" in receipts()  # the task wrote through Django's connection in the worker
    info = backend().app.job(result.id).info()
    assert info.message.name == f"{SHOP}.tasks.send_receipt" and info.message.queue == "email"


def test_a_rolled_back_transaction_or_savepoint_sends_nothing(site: Site) -> None:
    from django_tasks.exceptions import TaskResultDoesNotExist

    from tests.integration.frameworks.django_shop.tasks import send_receipt

    with pytest.raises(Rollback), transaction.atomic():
        lost = send_receipt.enqueue("o-2")
        raise Rollback
    with transaction.atomic():
        kept = send_receipt.enqueue("o-3")
        with pytest.raises(Rollback), transaction.atomic():  # a savepoint
            inner = send_receipt.enqueue("o-4")
            raise Rollback
    drain()
    assert "o-3" in receipts()
    assert "o-2" not in receipts() and "o-4" not in receipts()
    assert send_receipt.get_result(kept.id).return_value == "receipt for o-3"
    for result in (lost, inner):
        with pytest.raises(TaskResultDoesNotExist):
            send_receipt.get_result(result.id)
        assert backend().app.job(result.id).info() is None


def test_outside_a_transaction_the_job_goes_straight_to_the_broker(site: Site) -> None:
    from tests.integration.frameworks.django_shop.tasks import add, shout, which_attempt

    result = add.enqueue(2, 3)
    info = backend().app.job(result.id).info()
    assert info is not None and str(info.state) == "ready"
    assert info.message.priority == 10 and info.message.args == [2, 3]
    later = add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(4, 5)
    assert str(backend().app.job(later.id).status()) == "scheduled"
    loud = asyncio.run(shout.aenqueue("hello"))  # Django's async API
    ctx = which_attempt.enqueue("x")

    drain()
    assert add.get_result(result.id).return_value == 5
    shouted: object = shout.get_result(loud.id).return_value  # the awaited value
    assert shouted == "HELLO"
    assert which_attempt.get_result(ctx.id).return_value == {
        "label": "x",
        "attempt": 1,
        "id": ctx.id,
    }
    assert add.get_result(later.id).status == "READY"  # waits for its run_after


def test_a_failure_comes_back_as_failed_with_its_error(site: Site) -> None:
    from django_tasks import TaskResultStatus

    from tests.integration.frameworks.django_shop.tasks import boom

    result = boom.enqueue("no stock for o-5")
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class is ValueError
    assert "no stock for o-5" in error.traceback
    with pytest.raises(ValueError, match="failed"):
        result.return_value  # noqa: B018


def test_bad_arguments_fail_at_the_call(site: Site) -> None:
    from tests.integration.frameworks.django_shop.tasks import add, send_receipt

    with pytest.raises(dw.InvalidArguments, match="missing a required argument: 'b'"):
        add.enqueue(1)  # type: ignore[call-arg]
    with pytest.raises(dw.SerializationError, match="argument 'order_id'"):
        send_receipt.enqueue({1, 2})  # type: ignore[arg-type]


def test_with_the_broker_in_djangos_own_database_the_transaction_stores_the_job(
    site: Site,
) -> None:
    """Same SQLite file: the job row is inserted by the transaction itself,
    so there is no outbox table and no relay, and a rollback leaves no job."""
    from django_tasks import TaskResultStatus

    from tests.integration.frameworks.django_shop.tasks import add

    with override_settings(TASKS=site.tasks_setting(url=f"sqlite:///{site.database}")):
        with transaction.atomic():
            result = add.enqueue(20, 22)
        with pytest.raises(Rollback), transaction.atomic():
            lost = add.enqueue(1, 1)
            raise Rollback
        assert str(backend().app.job(result.id).status()) == "ready"  # no relay needed
        assert backend().app.job(lost.id).info() is None
        assert backend().outbox_url() is None
        assert "no relay" in drain()
        assert add.get_result(result.id).status == TaskResultStatus.SUCCESSFUL
        assert add.get_result(result.id).return_value == 42
        backend().app.close()


def test_on_redis_a_committed_transaction_is_relayed_and_run(site: Site) -> None:
    from tests.integration.frameworks.django_shop.tasks import send_receipt

    with override_settings(TASKS=site.tasks_setting(url=redis_url(new_prefix()))):
        with transaction.atomic():
            result = send_receipt.enqueue("o-6")
        with pytest.raises(Rollback), transaction.atomic():
            send_receipt.enqueue("o-7")
            raise Rollback
        drain()
        assert send_receipt.get_result(result.id).return_value == "receipt for o-6"
        assert "o-6" in receipts() and "o-7" not in receipts()
        backend().app.close()


def test_the_management_command_runs_as_a_worker_until_sigterm(site: Site) -> None:
    """``python -m django dumbwaiter_worker`` in its own process, with the
    same settings in a module: it discovers the app's tasks, relays the
    outbox of Django's database and runs the job; SIGTERM stops it cleanly."""
    from django_tasks import TaskResultStatus

    from tests.integration.frameworks.django_shop.tasks import send_receipt

    (site.folder / "dw_site_settings.py").write_text(
        "import dumbwaiter as dw\n"
        "USE_TZ = True\n"
        f"DATABASES = {{'default': {{'ENGINE': 'django.db.backends.sqlite3', "
        f"'NAME': {str(site.database)!r}}}}}\n"
        f"INSTALLED_APPS = ['django_tasks', 'dumbwaiter.contrib.django', {SHOP!r}]\n"
        "TASKS = {'default': {'BACKEND': 'dumbwaiter.contrib.django.DumbwaiterBackend',\n"
        "    'QUEUES': ['default', 'email'],\n"
        f"    'OPTIONS': {{'url': {site.broker!r}, 'retry': dw.Retry(attempts=1)}}}}}}\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site.folder), str(ROOT), str(ROOT / "src")])
    env["DJANGO_SETTINGS_MODULE"] = "dw_site_settings"
    log = site.folder / "worker.log"
    with log.open("w") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "django", "dumbwaiter_worker", "-c", "4"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        with transaction.atomic():
            result = send_receipt.enqueue("o-8")

        def finished() -> bool:
            assert worker.poll() is None, log.read_text()
            result.refresh()
            return result.status == TaskResultStatus.SUCCESSFUL

        wait_until(finished, "the worker process to run the committed task")
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=60)
    text = log.read_text()
    assert code == 0, text
    assert "queues default, email" in text and "relaying the outbox" in text
    assert "o-8" in receipts()
