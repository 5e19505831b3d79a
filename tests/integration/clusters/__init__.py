"""Real clusters that lose a node: NATS, Redis Cluster, RabbitMQ (issue 20)."""
