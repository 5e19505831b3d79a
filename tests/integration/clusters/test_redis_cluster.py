"""A Redis Cluster (three primaries, a replica each) loses the primary of
the app's slot mid-run: nothing confirmed is lost (``scenario``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.clusters.rediscluster import RedisClusterNodes
from tests.integration.clusters.scenario import lose_the_leader

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(170)]


def test_redis_cluster_loses_the_primary_of_the_apps_slot(
    redis_cluster_nodes: RedisClusterNodes, tmp_path: Path
) -> None:
    lose_the_leader(redis_cluster_nodes, tmp_path)
