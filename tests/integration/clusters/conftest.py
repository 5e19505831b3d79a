"""Fixtures: a cluster of each broker, of the test's own.

Each starts its servers on free loopback ports with their data in the
test's tmp dir and kills every one of them when the test ends, whatever
happened.  A missing server binary skips the test locally and fails it in
CI (``require_service``).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import require_service
from tests.integration.clusters import rabbitcluster
from tests.integration.clusters.natscluster import NatsCluster
from tests.integration.clusters.rabbitcluster import RabbitCluster
from tests.integration.clusters.rediscluster import RedisClusterNodes
from tests.integration.nats.conftest import NATS_SERVER
from tests.integration.redis.conftest import REDIS_SERVER


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    require_service("nats-server", NATS_SERVER is not None, "no nats-server binary found")
    cluster = NatsCluster(tmp_path / "nats")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def redis_cluster_nodes(tmp_path: Path) -> Iterator[RedisClusterNodes]:
    ok = REDIS_SERVER is not None and shutil.which("redis-cli") is not None
    require_service("redis-server", ok, "no redis-server / redis-cli binary on PATH")
    cluster = RedisClusterNodes(tmp_path / "redis")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def rabbit_cluster(tmp_path: Path) -> Iterator[RabbitCluster]:
    ok = rabbitcluster.SERVER is not None and rabbitcluster.CTL is not None
    require_service(
        "rabbitmq-server", ok, f"no rabbitmq-server / rabbitmqctl in {rabbitcluster.BIN}"
    )
    cluster = RabbitCluster(tmp_path / "rabbitmq")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
