"""A three-node NATS cluster (streams and KV at replicas=3) loses the node
leading the job stream mid-run: nothing confirmed is lost (``scenario``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.clusters.natscluster import NatsCluster
from tests.integration.clusters.scenario import lose_the_leader

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(170)]


def test_nats_cluster_loses_the_job_stream_leader(
    nats_cluster: NatsCluster, tmp_path: Path
) -> None:
    lose_the_leader(nats_cluster, tmp_path)
    # every stream and the KV bucket kept a copy on each node
    assert set(nats_cluster.replicas().values()) == {3}
