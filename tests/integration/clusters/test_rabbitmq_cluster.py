"""A three-node RabbitMQ cluster (quorum queues) loses the node leading the
app's queue mid-run: nothing confirmed is lost (``scenario``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.clusters.rabbitcluster import QUEUE, RabbitCluster
from tests.integration.clusters.scenario import lose_the_leader

# three Erlang VMs boot and join in 25-55 s on the two cores here (each
# rabbitmqctl call boots a VM of its own): room for a busy machine
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]


def test_rabbitmq_cluster_loses_the_queue_leader(
    rabbit_cluster: RabbitCluster, tmp_path: Path
) -> None:
    lose_the_leader(rabbit_cluster, tmp_path)
    # the app's queues are quorum queues with a member on each node
    members = rabbit_cluster.members()
    assert members[QUEUE] == ("quorum", 3)
    assert set(members.values()) == {("quorum", 3)}
