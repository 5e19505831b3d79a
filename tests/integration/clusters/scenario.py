"""A cluster loses the node that leads an app's jobs, mid-run: the scenario
every cluster test runs, written once.

The test process enqueues a few jobs, finds the node that leads the app's
jobs (the job stream, the queue, the slot: ``Cluster.leader``), starts two
``dumbwaiter worker`` processes (``clusterapp``) on URLs that do not name
that node only and, once both have announced themselves, enqueues the rest
of a backlog and starts a producer thread that enqueues the remaining jobs
one call each.  Once a third of the backlog has started it SIGKILLs the leader,
waits until the workers start jobs again (or gives up on that after
``RESUME_TIMEOUT``), restarts the node on its port and data, and waits
until every job has finished.

What it asserts, from the workers' logs (``clusterapp``):

* **no confirmed job lost**: every job whose enqueue returned finished at
  least once.  A producer call that raised is counted (``raised``), not
  failed: its caller knows, and its job may or may not run;
* **one id per job**: no job number ran under two ids (a retried enqueue
  the broker stored twice), and a confirmed job ran under the id its
  enqueue returned;
* **duplicates only of jobs in flight at the failure**: a job that started
  twice first started between ``SETTLE`` seconds before the kill (its
  acknowledgement may not have reached the node yet) and ``SETTLE`` seconds
  after the workers resumed;
* **the workers make progress while the node is down**: they resumed
  before the restart (a cluster that needs the lost node back has not
  survived it);
* the workers stop cleanly afterwards (SIGTERM, exit code 0).

And what it measures (``Figures``, printed: run with ``-s`` to see them):
seconds from the kill until the workers start jobs again (the end of the
longest pause in job starts), how long the node was down and took to
rejoin, the slowest producer call, the drain time.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import dumbwaiter as dw
from dumbwaiter.worker import WORKER_KEY
from tests.integration.clusters import clusterapp
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]
#: jobs in a run, and how many of them are enqueued before the workers start
JOBS = 5000
BACKLOG = 4000
#: worker processes, and the jobs each runs at once
WORKERS = 2
CONCURRENCY = 16
LEASE = 5.0
#: seconds after a failure within which the workers' pause begins (they
#: run out of the jobs they had taken)
TAKEN = 3.0
#: seconds an acknowledgement may take to reach the broker: a job that
#: started this long before the kill may still run again
SETTLE = 2.0
#: seconds the workers get to resume while the node is down
RESUME_TIMEOUT = 45.0
#: seconds, after the restart, for every job to finish
DRAIN_TIMEOUT = 90.0
#: seconds between two producer calls (so the producer spans the failure)
PACE = 0.004


class Cluster(Protocol):
    """Servers of the test's own that make one cluster."""

    #: the broker's name, for the figures
    name: str

    def url(self, avoid: int | None = None) -> str:
        """A URL for one client (a new node each call, where the broker's
        URL names one) that does not name node ``avoid`` alone."""

    def leader(self) -> int:
        """The node that leads the app's jobs now."""

    def kill(self, node: int) -> None:
        """SIGKILL the node's server process."""

    def restart(self, node: int) -> None:
        """Start the node again on its port and data; return once it has
        rejoined the cluster."""


@dataclass
class Figures:
    broker: str
    #: producer calls made: one job each (the backlog in a few bulk calls)
    jobs: int = 0
    #: jobs whose enqueue returned
    confirmed: int = 0
    #: producer calls that raised, and how many of their jobs ran anyway
    raised: int = 0
    raised_but_ran: int = 0
    #: confirmed jobs that never finished
    lost: int = 0
    #: jobs that started more than once, and how many of them were in
    #: flight at the failure
    duplicates: int = 0
    duplicates_in_flight: int = 0
    #: job numbers that ran under more than one id
    several_ids: int = 0
    #: seconds from the kill until the workers started jobs again (None:
    #: not before the restart)
    resumed_after_kill: float | None = None
    #: seconds the node was down, and the restart took until the cluster
    #: counted it back in
    down: float = 0.0
    rejoined: float = 0.0
    #: the slowest producer call (seconds)
    slowest_enqueue: float = 0.0
    #: seconds from the workers' start until every job had finished
    drain: float = 0.0
    errors: list[str] = field(default_factory=list)
    #: what the broker says of a few jobs that never finished (state,
    #: worker, lease end, attempt): a failure's first clue
    lost_records: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Start:
    id: str
    n: int
    pid: int
    attempt: int
    at: float


def _lines(path: Path) -> list[list[str]]:
    """The whole lines of a log the workers are still appending to: the
    last one is left out until its newline is written."""
    if not path.exists():
        return []
    text = path.read_text()
    return [line.split() for line in text[: text.rfind("\n") + 1].splitlines() if line]


def starts(path: Path) -> list[Start]:
    return [Start(f[0], int(f[1]), int(f[2]), int(f[3]), float(f[4])) for f in _lines(path)]


def done_ids(path: Path) -> set[str]:
    return {f[0] for f in _lines(path)}


def _records(app: dw.App, ids: list[str]) -> list[str]:
    """The broker's record of each job ``ids`` names, in a line each."""
    out = []
    for id_ in ids:
        try:
            info = app.job(id_).info()
        except Exception as exc:  # a clue, not the test's verdict
            out.append(f"{id_}: {exc!r}")
            continue
        if info is None:
            out.append(f"{id_}: no record")
        else:
            out.append(
                f"{id_}: {info.state.value} worker={info.worker} attempt={info.message.attempt}"
                f" lease_until={info.lease_until} run_at={info.run_at} now={time.time():.3f}"
            )
    return out


def _warnings(tmp_path: Path, ids: set[str]) -> list[str]:
    """The workers' log lines that name one of ``ids``, and their last lines."""
    out: list[str] = []
    for log in sorted(tmp_path.glob("worker*.log")):
        lines = log.read_text(errors="replace").splitlines()
        out += [f"{log.name}: {line}" for line in lines if any(i in line for i in ids)][:10]
        out += [f"{log.name} (end): {line}" for line in lines[-5:]]
    return out


def resumed_at(times: list[float], since: float, until: float) -> float | None:
    """When the workers started jobs again after the failure at ``since``:
    the end of the longest pause in job starts (counted from ``since``
    itself) that began within ``TAKEN`` seconds of it, None when that pause
    lasted until ``until``.

    The longest, not the first: a worker runs the jobs it had already taken
    for a moment after a failure, then pauses until the cluster serves it
    again; and none that began later: once the backlog is gone, starts come
    at the producer's pace, with pauses of their own."""
    last, best = since, (since, since)
    for t in sorted(t for t in times if since <= t < until):
        if last > since + TAKEN:
            break
        if t - last > best[1] - best[0]:
            best = (last, t)
        last = t
    if last <= since + TAKEN and until - last > best[1] - best[0]:
        return None  # the pause goes on
    return best[1]


class _Producer(threading.Thread):
    """Enqueues jobs ``first``..``last - 1`` one call each, paced."""

    def __init__(self, task: dw.Task[[int], object], first: int, last: int) -> None:
        super().__init__(daemon=True)
        self.task = task
        self.range = range(first, last)
        self.ids: dict[int, str] = {}
        self.raised: dict[int, str] = {}
        self.slowest = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        for n in self.range:
            if self.stop.is_set():
                return
            t0 = time.monotonic()
            try:
                self.ids[n] = self.task.enqueue(n).id
            except Exception as exc:  # counted: its caller would know
                self.raised[n] = repr(exc)
            self.slowest = max(self.slowest, time.monotonic() - t0)
            time.sleep(PACE)  # pacing, not synchronisation


def _worker(url: str, tmp_path: Path, k: int) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "DW_CLUSTER_URL": url,
        "DW_CLUSTER_STARTED": str(tmp_path / "started.log"),
        "DW_CLUSTER_DONE": str(tmp_path / "done.log"),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    }
    cmd = [
        sys.executable, "-m", "dumbwaiter", "worker",
        "--app", "tests.integration.clusters.clusterapp:app",
        "-c", str(CONCURRENCY), "--lease", str(LEASE), "--heartbeat", "1",
        "--log-level", "warning",
    ]  # fmt: skip
    out = (tmp_path / f"worker{k}.log").open("wb")
    try:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    finally:
        out.close()


def _stop(workers: list[subprocess.Popen[bytes]]) -> list[int | None]:
    """SIGTERM each worker and wait for its graceful stop; SIGKILL what is
    left.  The exit codes (None: it had to be killed)."""
    for w in workers:
        if w.poll() is None:
            w.send_signal(signal.SIGTERM)
    codes: list[int | None] = []
    for w in workers:
        try:
            codes.append(w.wait(timeout=60))
        except subprocess.TimeoutExpired:
            w.kill()
            w.wait(timeout=10)
            codes.append(None)
    return codes


def _announced(app: dw.App) -> int:
    """How many workers have announced themselves (``dumbwaiter doctor``'s
    count)."""

    async def go() -> int:
        try:
            return len(await app.broker.kv_scan(WORKER_KEY))
        finally:
            await app.broker.close()  # this loop ends here: its connections too

    return asyncio.run(go())


def _until(cond: Callable[[], object], what: str, timeout: float) -> bool:
    try:
        wait_until(cond, what, timeout)
    except AssertionError:
        return False
    return True


def lose_the_leader(cluster: Cluster, tmp_path: Path) -> Figures:
    """Run the scenario (module doc) and assert what it promises."""
    figures = Figures(cluster.name)
    started_log, done_log = tmp_path / "started.log", tmp_path / "done.log"
    backlog: dict[int, str] = {}

    def enqueue(task: dw.Task[[int], object], first: int, last: int) -> None:
        for n in range(first, last, 500):
            jobs = task.enqueue_many(range(n, min(n + 500, last)))
            backlog.update(zip(range(n, n + len(jobs)), (j.id for j in jobs), strict=True))

    # the backlog before the failure is set-up, not what is measured: a cluster
    # just booted on a loaded machine may take longer than a producer's 5 s
    setup = dw.App(cluster.url(), enqueue_timeout=60)
    try:  # the app's queue exists from here on: its leader can be found
        enqueue(setup.task(name="cluster.work")(clusterapp.work.fn), 0, 500)
    finally:
        setup.close()
    leader = cluster.leader()
    app = dw.App(cluster.url(avoid=leader))
    work = app.task(name="cluster.work")(clusterapp.work.fn)
    producer = _Producer(work, BACKLOG, JOBS)
    workers: list[subprocess.Popen[bytes]] = []
    codes: list[int | None] = []
    try:
        t_start = time.time()
        workers = [_worker(cluster.url(avoid=leader), tmp_path, k) for k in range(WORKERS)]
        # both at work before the backlog: a worker still starting when the
        # node dies would meet the failure in its start-up instead
        assert _until(lambda: _announced(app) == WORKERS, "the workers to start", 60)
        enqueue(work, 500, BACKLOG)
        producer.start()
        assert _until(
            lambda: len(starts(started_log)) >= BACKLOG // 3, "a third of the backlog", 60
        ), "the workers did not get going"
        cluster.kill(leader)
        killed = time.time()

        def resumed() -> bool:
            times = [s.at for s in starts(started_log)]
            now = time.time()
            at = resumed_at(times, killed, now)
            # a run of starts after the pause: more than the workers could
            # have taken before the kill
            return now - killed > TAKEN and at is not None and sum(t >= at for t in times) >= 200

        _until(resumed, "the workers to resume", RESUME_TIMEOUT)
        restarted = time.time()
        figures.down = restarted - killed
        cluster.restart(leader)
        figures.rejoined = time.time() - restarted
        producer.join(timeout=DRAIN_TIMEOUT)
        assert not producer.is_alive(), "a producer call has not returned"
        figures.slowest_enqueue = producer.slowest
        confirmed = {**backlog, **producer.ids}
        if not _until(
            lambda: set(confirmed.values()) <= done_ids(done_log), "every job", DRAIN_TIMEOUT
        ):
            missing = set(confirmed.values()) - done_ids(done_log)
            figures.lost_records = _records(app, sorted(missing)[:5])
        figures.drain = time.time() - t_start
        # a failover took place: another node leads now (none moves back)
        assert cluster.leader() != leader, "the killed node leads again: was it the leader?"
    finally:
        producer.stop.set()
        codes = _stop(workers)
        app.close()

    log = starts(started_log)
    done = done_ids(done_log)
    figures.jobs = JOBS
    figures.confirmed = len(confirmed)
    figures.raised = len(producer.raised)
    ids_of: dict[int, set[str]] = defaultdict(set)
    count: dict[str, int] = defaultdict(int)
    first: dict[str, float] = {}
    for s in log:
        ids_of[s.n].add(s.id)
        count[s.id] += 1
        first[s.id] = min(first.get(s.id, s.at), s.at)
    figures.raised_but_ran = len([n for n in producer.raised if ids_of.get(n)])
    lost = {n: i for n, i in confirmed.items() if i not in done}
    figures.lost = len(lost)
    several = {n: ids for n, ids in ids_of.items() if len(ids) > 1}
    figures.several_ids = len(several)
    wrong = {n: (i, ids_of[n]) for n, i in confirmed.items() if ids_of.get(n, {i}) != {i}}
    times = [s.at for s in log]
    after_kill = resumed_at(times, killed, restarted)
    figures.resumed_after_kill = None if after_kill is None else round(after_kill - killed, 2)
    window = (killed - SETTLE, (after_kill or restarted) + SETTLE)
    twice = {i for i, c in count.items() if c > 1}
    in_flight = {i for i in twice if window[0] <= first[i] <= window[1]}
    figures.duplicates, figures.duplicates_in_flight = len(twice), len(in_flight)
    figures.errors = sorted(set(producer.raised.values()))[:5]
    for name in ("down", "rejoined", "slowest_enqueue", "drain"):
        setattr(figures, name, round(getattr(figures, name), 2))
    print(f"\ncluster figures: {json.dumps(asdict(figures))}")
    (tmp_path / "figures.json").write_text(json.dumps(asdict(figures), indent=1))

    assert not lost, (
        f"{len(lost)} confirmed jobs never finished, e.g. {list(lost.items())[:5]}; "
        f"their records: {figures.lost_records}; started: "
        f"{[s for s in log if s.id in set(lost.values())][:5]}; the workers' warnings: "
        f"{_warnings(tmp_path, set(lost.values()))}"
    )
    assert not several, f"job numbers that ran under several ids: {list(several.items())[:5]}"
    assert not wrong, f"jobs that ran under another id than enqueue returned: {wrong}"
    assert twice == in_flight, (
        f"jobs run twice that were not in flight at the failure (window {window}): "
        f"{sorted((first[i], i) for i in twice - in_flight)[:5]}"
    )
    assert after_kill is not None, "the workers made no progress until the node came back"
    assert codes == [0] * WORKERS, f"the workers' graceful stop: exit codes {codes}"
    return figures
