"""Flask with ``dumbwaiter.contrib.flask``, driven by Flask's test client: an
application factory calls ``init_app``, a view enqueues in a request, and the
jobs are stored and run by a worker."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from flask import Blueprint, Flask, jsonify, request
from flask.typing import ResponseReturnValue

import dumbwaiter as dw
from dumbwaiter.contrib.flask import Dumbwaiter, get_app
from dumbwaiter.testing import drain_sync
from tests.integration.redis.server import new_prefix
from tests.integration.redis.server import url as redis_url


@dataclass
class Project:
    """What a Flask project's ``jobs.py`` and ``create_app`` hold."""

    url: str
    mailed: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.jobs = jobs = dw.App(self.url)
        self.extension = Dumbwaiter(jobs)

        @jobs.task
        def send_receipt(order_id: str) -> None:
            self.mailed.append(order_id)

        @jobs.task(keep_result=True)
        def invoice(order_id: str, total_cents: int) -> str:
            return f"invoice {order_id}: {total_cents / 100:.2f}"

        bp = Blueprint("orders", __name__)

        @bp.post("/orders")
        def create_order() -> ResponseReturnValue:
            order = request.get_json()
            mail = send_receipt.enqueue(order["id"])  # a sync view: the sync API
            bill = get_app().tasks[invoice.name].enqueue(order["id"], order["total_cents"])
            return jsonify(mail=mail.id, invoice=bill.id), 201

        self.blueprint = bp

    def create_app(self, config: dict[str, Any] | None = None) -> Flask:
        app = Flask(__name__)
        app.config.from_mapping(config or {})
        self.extension.init_app(app)
        app.register_blueprint(self.blueprint)
        return app


@pytest.fixture(params=["sqlite", "redis"])
def project(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    url = f"sqlite:///{tmp_path}/jobs.db" if request.param == "sqlite" else redis_url(new_prefix())
    p = Project(url)
    yield p
    p.jobs.close()


def test_a_view_enqueues_in_a_request_and_the_jobs_run(project: Project) -> None:
    client = project.create_app({"TESTING": True}).test_client()
    r = client.post("/orders", json={"id": "o-1", "total_cents": 1250})
    assert r.status_code == 201, r.text
    ids = r.get_json()
    mail, bill = project.jobs.job(ids["mail"]), project.jobs.job(ids["invoice"])
    assert mail.status() == "ready" and bill.status() == "ready"  # stored, not run yet
    assert project.mailed == []

    worker = drain_sync(project.jobs)
    assert project.mailed == ["o-1"]
    assert bill.result(timeout=5) == "invoice o-1: 12.50"
    assert worker.counts["succeeded"] == 2


def test_every_app_of_the_factory_gets_the_extension(project: Project) -> None:
    first, second = project.create_app(), project.create_app({"TESTING": True})
    for app in (first, second):
        assert app.extensions["dumbwaiter"] is project.extension
        with app.app_context():
            assert get_app() is project.jobs
        assert app.make_shell_context()["jobs"] is project.jobs
    # the config may name the App's own broker, nothing else
    project.create_app({"DUMBWAITER_URL": project.url})
    with pytest.raises(dw.ConfigurationError, match=r"DUMBWAITER_URL.*built for") as err:
        project.create_app({"DUMBWAITER_URL": "redis://u:s3cret@elsewhere:6379/0"})
    assert "s3cret" not in str(err.value)


def test_get_app_without_the_extension_names_the_fix() -> None:
    with Flask("bare").app_context(), pytest.raises(dw.ConfigurationError, match="init_app"):
        get_app()
