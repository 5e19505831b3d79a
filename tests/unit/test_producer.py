"""The producer API: what enqueue accepts, and the errors it gives at the call."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import dumbwaiter as dw
from dumbwaiter.brokers import REGISTRY
from dumbwaiter.state import State


@pytest.fixture
def app(tmp_path: Path) -> Iterator[dw.App]:
    a = dw.App(f"sqlite:///{tmp_path}/jobs.db")
    yield a
    a.close()


def test_enqueue_returns_a_job_the_broker_holds(app: dw.App) -> None:
    @app.task
    def send_welcome(user_id: int) -> None: ...

    job = send_welcome.enqueue(42)
    assert job.status() == State.READY == "ready"  # type: ignore[comparison-overlap]
    info = job.info()
    assert info is not None and info.message.args == [42]
    assert info.message.name.startswith(__name__) and info.message.name.endswith(".send_welcome")
    assert info.message.max_attempts == 4  # the default Retry


def test_non_json_argument_fails_naming_it(app: dw.App) -> None:
    @app.task
    def remind(user_id: int, when: object, extra: dict[str, object] | None = None) -> None: ...

    with pytest.raises(dw.SerializationError, match=r"argument 'when' of .*remind\(\).*datetime"):
        remind.enqueue(1, datetime.now(UTC))
    with pytest.raises(dw.SerializationError, match=r"argument 'extra'.*\['tags'\]\[1\].*set"):
        remind.enqueue(1, "x", extra={"tags": ["a", {"b"}]})
    with pytest.raises(dw.SerializationError, match="nan"):
        remind.enqueue(1, math.nan)
    with pytest.raises(dw.SerializationError, match="key 3 is a int"):
        remind.enqueue(1, {3: "x"})
    with pytest.raises(TypeError):  # also a TypeError, for code that catches that
        remind.enqueue(1, object())
    assert app.broker.capabilities.sync_enqueue  # nothing was stored by the failed calls
    assert dw.App(app.url).tasks == {}


def test_a_lone_surrogate_fails_naming_the_argument_and_where(app: dw.App) -> None:
    """A str UTF-8 cannot encode (a lone surrogate, as errors='surrogateescape'
    leaves) is a SerializationError naming the argument and the path to it,
    not orjson's bare TypeError; on the one-call, bulk and event paths."""

    class Named(dw.Event, type="producer.named"):
        name: str

    @app.task
    def greet(name: str, user: dict[str, object] | None = None) -> None: ...

    lone = re.escape("lone surrogate '\\udce9' at index 2, which UTF-8 (and so JSON) cannot encode")
    with pytest.raises(dw.SerializationError, match=rf"argument 'name' of .*greet\(\).*{lone}"):
        greet.enqueue("Zo\udce9")
    with pytest.raises(dw.SerializationError, match=rf"argument 'user' .* at \['name'\] .*{lone}"):
        greet.enqueue("x", user={"name": "Zo\udce9"})
    with pytest.raises(dw.SerializationError, match=r"argument 'user' .* at \['tags'\]\[1\]"):
        greet.enqueue("x", {"tags": ["a", "\ud800"]})
    with pytest.raises(dw.SerializationError, match=r"the key '\\ud800' has a lone surrogate"):
        greet.enqueue("x", {"\ud800": 1})
    with pytest.raises(dw.SerializationError, match=rf"argument 'name' .*{lone}"):
        greet.enqueue_many(["fine", "Zo\udce9"])
    with pytest.raises(dw.SerializationError, match=r"payload of event producer.named.*lone"):
        app.publish(Named(name="\ud800"))
    assert app._call(app.broker.stats()) == []  # nothing was stored
    job = greet.enqueue("Zoé 使用者", user={"名前": "é"})  # text that is not ASCII is fine
    info = job.info()
    assert info is not None
    assert (info.message.args, info.message.kwargs) == (["Zoé 使用者"], {"user": {"名前": "é"}})


def test_arguments_must_fit_the_signature(app: dw.App) -> None:
    @app.task
    def send(user_id: int, *, template: str = "welcome") -> None: ...

    with pytest.raises(dw.InvalidArguments, match=r"send\(\).*missing a required argument"):
        send.enqueue()  # type: ignore[call-arg]  # what an untyped caller can still do
    with pytest.raises(dw.InvalidArguments, match="unexpected keyword argument 'tmpl'"):
        send.enqueue(1, tmpl="x")  # type: ignore[call-arg]
    send.enqueue(1, template="bye")


def test_payload_over_the_maximum_fails(tmp_path: Path) -> None:
    small = dw.App(f"sqlite:///{tmp_path}/s.db", max_message_size=1000)

    @small.task
    def upload(blob: str) -> None: ...

    with pytest.raises(dw.PayloadTooLarge, match=r"over the maximum of 1,000 bytes"):
        upload.enqueue("x" * 2000)
    upload.enqueue("x" * 100)
    default = dw.App("memory://")
    big = default.task(upload.fn, name="big")  # type: ignore[call-overload]
    with pytest.raises(dw.PayloadTooLarge, match="1,048,576"):
        big.enqueue("x" * (1024 * 1024 + 1))
    small.close()


def test_options_delay_eta_priority_key_queue(app: dw.App) -> None:
    @app.task(priority=1)
    def report(day: str) -> None: ...

    t0 = time.time()
    delayed = report.options(delay=60).enqueue("mon")
    at = datetime.now(UTC) + timedelta(hours=1)
    timed = report.options(eta=at, priority=9, queue="reports").enqueue("tue")
    keyed = [report.options(key="report:wed").enqueue("wed") for _ in range(3)]
    d, t = delayed.info(), timed.info()
    assert d is not None and t is not None
    assert d.state is State.SCHEDULED and d.message.eta is not None
    assert t0 + 59 < d.message.eta < time.time() + 61
    assert t.message.eta == pytest.approx(at.timestamp())
    assert (t.message.priority, t.message.queue, d.message.priority) == (9, "reports", 1)
    assert len({j.id for j in keyed}) == 1


def test_bad_options_fail_at_the_call(app: dw.App) -> None:
    @app.task
    def f() -> None: ...

    with pytest.raises(dw.ConfigurationError, match="naive datetime"):
        f.options(eta=datetime.now())
    with pytest.raises(dw.ConfigurationError, match="not both"):
        f.options(delay=1, eta=time.time())
    with pytest.raises(dw.ConfigurationError, match="priority must be an integer"):
        f.options(priority="high")
    with pytest.raises(TypeError):
        f.options(dealy=5)


def test_enqueue_many_in_one_call(app: dw.App) -> None:
    @app.task
    def send(user_id: int, template: str = "welcome") -> None: ...

    jobs = send.enqueue_many([(1,), (2, "bye"), {"user_id": 3}, 4])
    assert len({j.id for j in jobs}) == 4
    args = [j.info().message for j in jobs]  # type: ignore[union-attr]
    assert [(m.args, m.kwargs) for m in args] == [
        ([1], {}),
        ([2, "bye"], {}),
        ([], {"user_id": 3}),
        ([4], {}),
    ]
    with pytest.raises(dw.InvalidArguments):
        send.enqueue_many([(1,), (1, 2, 3)])


def test_cancel_and_result_from_sync_code(app: dw.App) -> None:
    @app.task(keep_result=True)
    def f() -> int:
        return 1

    job = f.enqueue()
    assert job.cancel() is True
    assert job.status() == State.CANCELLED
    with pytest.raises(dw.JobCancelled):
        job.result(timeout=1)
    assert f.enqueue().cancel() is True
    with pytest.raises(dw.ResultTimeout):
        f.enqueue().result(timeout=0.05)
    with pytest.raises(dw.JobNotFound):
        app.job("01890000-0000-7000-8000-000000000000").status()


async def test_async_enqueue(app: dw.App) -> None:
    @app.task
    async def track(name: str, props: dict[str, object]) -> None: ...

    job = await track.aenqueue("signup", {"plan": "pro"})
    jobs = await track.options(priority=3).aenqueue_many([("a", {}), ("b", {})])
    assert await job.astatus() == State.READY
    assert len(jobs) == 2


def test_invalid_url_names_the_scheme_and_the_supported_ones() -> None:
    with pytest.raises(dw.InvalidURL, match=r"'pulsar'.*kafka://.*memory://.*sqlite://"):
        dw.App("pulsar://localhost:6650")
    with pytest.raises(dw.InvalidURL, match="no scheme"):
        dw.App("jobs.db")
    with pytest.raises(dw.InvalidURL, match="names no database file"):
        dw.App("sqlite://")
    with pytest.raises(dw.InvalidURL, match="unknown option"):
        dw.App("sqlite:///x.db?journal=delete")


def test_missing_extra_names_the_pip_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    mod = tmp_path / "needs_extra_broker.py"
    mod.write_text("import surely_not_installed_pkg_dw\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(REGISTRY, "fancy", ("needs_extra_broker", "Broker", "fancy"))
    with pytest.raises(dw.MissingDependency, match=r"pip install 'dumbwaiter\[fancy\]'"):
        dw.App("fancy://localhost")


def test_default_url_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DUMBWAITER_URL", "memory://")
    assert dw.App().url == "memory://"
    monkeypatch.delenv("DUMBWAITER_URL")
    monkeypatch.chdir(tmp_path)
    assert dw.App().url == "sqlite:///dumbwaiter.db"


def test_two_tasks_with_one_name_is_an_error() -> None:
    app = dw.App("memory://")

    @app.task(name="send")
    def a() -> None: ...

    with pytest.raises(dw.ConfigurationError, match="two tasks are named 'send'"):

        @app.task(name="send")
        def b() -> None: ...


def test_retry_policy_validation_and_schedule() -> None:
    r = dw.Retry()
    assert (r.attempts, r.backoff) == (4, (5.0, 30.0, 300.0))
    waits = [r.wait(n) for n in (1, 2, 3, 4)]
    assert 4.0 <= waits[0] <= 6.0 and 24.0 <= waits[1] <= 36.0 and 240.0 <= waits[3] <= 360.0
    assert len({dw.Retry().wait(1) for _ in range(20)}) > 1  # jitter spreads them
    assert dw.Retry(backoff=timedelta(minutes=1), jitter=0).wait(3) == 60.0
    for bad in ({"attempts": 0}, {"backoff": ()}, {"jitter": 2}, {"retry_on": [int]}):
        with pytest.raises(dw.ConfigurationError):
            dw.Retry(**bad)
