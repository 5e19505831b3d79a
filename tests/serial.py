"""Which tests run one after another when the suite runs in parallel.

``make test`` runs pytest on several processes (pytest-xdist, ``-n`` and
``--dist loadgroup`` in the Makefile).  Every test works on a namespace of
its own process (``tests/brokers.py``: prefixes, schemas, vhosts and
streams named by a per-process token; servers of its own on free ports), so
tests on two workers never meet.  The heavy ones are the exception: they
SIGKILL worker processes, start clusters of three servers, put hosts in
network namespaces, skew clocks or start several ``dumbwaiter`` processes
at once, and they load the whole 2-core machine.  Two of them at the same
time compete for the cores, and their deadlines (a rescue, a failover, a
lease) would no longer hold as they do in a serial run.  So all of them go
to one worker as one unit of work, run in collection order, while the
other workers run the light tests beside them.

The unit is made by the scheduler (``make_scheduler``, through xdist's
``pytest_xdist_make_scheduler`` hook), from the test's file: the scheduler
runs in the controller, which never collects and so never sees a marker.
(xdist's own ``xdist_group`` marker reaches the controller by appending
``@group`` to the node id, which pytest 9.2 no longer lets a plugin change:
pytest-xdist#1386; the groups are lost without a word.)  ``check`` keeps the
files and the markers in step: a test marked ``crash``, ``cluster`` or
``heavy`` outside ``SERIAL`` fails the collection.
"""

from __future__ import annotations

from typing import Any

import pytest

#: the markers of the tests that load the whole machine
MARKERS = ("crash", "cluster", "heavy")

#: the files (and the folders, ending in ``/``) of those tests, relative to
#: the project's root, as in a node id
SERIAL = (
    "tests/crash/",
    "tests/integration/clusters/",
    "tests/integration/partitions/",
    "tests/integration/skew/",
    "tests/integration/redis/test_event_crash.py",
    "tests/integration/test_scheduler_replicas.py",
    "tests/webhooks/test_crash.py",
)

#: the name of their unit of work
GROUP = "serial"


def is_serial(nodeid: str) -> bool:
    path = nodeid.split("::", 1)[0]
    return any(path == p or (p.endswith("/") and path.startswith(p)) for p in SERIAL)


def check(items: list[pytest.Item]) -> None:
    """Fail the collection where a heavy test's file is not in ``SERIAL``."""
    stray = [
        item.nodeid
        for item in items
        if any(item.get_closest_marker(m) for m in MARKERS) and not is_serial(item.nodeid)
    ]
    if stray:
        raise pytest.UsageError(
            f"tests marked {' or '.join(MARKERS)} outside tests/serial.py's SERIAL "
            f"(they would run beside each other under xdist): {stray[:5]}"
        )


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup``, with every ``SERIAL`` test in one unit of work.

    The units go out largest first, so the serial one starts at once on one
    worker; every other test is a unit of its own, as under ``--dist load``.
    """
    from xdist.scheduler import LoadGroupScheduling  # only where xdist runs the suite

    class SerialScheduling(LoadGroupScheduling):  # type: ignore[misc]  # untyped
        def _split_scope(self, nodeid: str) -> str:
            return GROUP if is_serial(nodeid) else super()._split_scope(nodeid)

    return SerialScheduling(config, log)
