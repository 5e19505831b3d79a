"""The scaling signal's arithmetic (scaling.py): what an autoscaler reads."""

from __future__ import annotations

import pytest

from dumbwaiter.brokers.types import QueueStats
from dumbwaiter.scaling import DEFAULT_CONCURRENCY, drain_target, scale, scales
from dumbwaiter.worker import WorkerConfig


def _worker(concurrency: int = 4, job_seconds: float | None = None) -> dict[str, object]:
    w: dict[str, object] = {"id": "w", "queues": ["q"], "concurrency": concurrency}
    if job_seconds is not None:
        w["job_seconds"] = {"q": job_seconds}
    return w


def test_an_empty_queue_wants_no_worker_and_a_waiting_one_wants_one() -> None:
    assert scale(QueueStats("q"), [], 60).desired_workers == 0
    assert scale(QueueStats("q", scheduled=1), [], 60).desired_workers == 1
    assert scale(QueueStats("q", retrying=3), [_worker()], 60).desired_workers == 1


def test_without_a_measured_run_time_every_ready_job_counts_as_a_slot() -> None:
    assert DEFAULT_CONCURRENCY == WorkerConfig().concurrency
    assert scale(QueueStats("q", ready=100), [], 60).desired_workers == 4  # 100 / 32
    assert scale(QueueStats("q", ready=9), [_worker(4)], 60).desired_workers == 3


def test_short_jobs_need_few_workers_and_long_ones_many() -> None:
    busy = QueueStats("q", ready=10_000, running=4)
    # 10,000 jobs of 10 ms clear in 60 s on 1.7 slots: 4 busy + 1.7 over 4 = 2 workers
    assert scale(busy, [_worker(4, 0.01)], 60).desired_workers == 2
    # of 60 s each, every ready job needs a slot of its own: (4 + 10,000) / 4
    assert scale(busy, [_worker(4, 60)], 60).desired_workers == 2501


def test_an_idle_fleet_scales_down_and_a_paused_queue_wants_what_runs() -> None:
    workers = [_worker(4, 1.0) | {"id": f"w{i}"} for i in range(5)]
    calm = scale(QueueStats("q", running=2), workers, 60)
    assert (calm.workers, calm.desired_workers, calm.backlog_per_worker) == (5, 1, 0.4)
    assert calm.drain_rate == 2.0
    paused = scale(QueueStats("q", ready=1000, running=8, paused=True), workers, 60)
    assert paused.desired_workers == 2


def test_the_drain_target_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [QueueStats("q", ready=600)]
    workers = [_worker(1, 1.0)]
    monkeypatch.setenv("DUMBWAITER_DRAIN_TARGET", "60")
    assert drain_target() == 60 and scales(rows, workers)[0].desired_workers == 10
    monkeypatch.setenv("DUMBWAITER_DRAIN_TARGET", "600")
    assert scales(rows, workers)[0].desired_workers == 1
    monkeypatch.setenv("DUMBWAITER_DRAIN_TARGET", "soon")
    with pytest.raises(ValueError, match="DUMBWAITER_DRAIN_TARGET"):
        drain_target()
