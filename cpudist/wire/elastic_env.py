"""What an elastic launch tells each node's rank through its environment (cpudist/train/elastic.py
reads it): where the Lighthouse is, the node's name and address in the quorum, and the node count
the global batch is planned for."""

from __future__ import annotations

LIGHTHOUSE = "TORCHFT_LIGHTHOUSE"  # http://HEAD:PORT: torchft's own variable
REPLICA_ID = "CPUDIST_REPLICA_ID"  # this node's name in the quorum (default: its host name)
REPLICAS = "CPUDIST_REPLICAS"  # the node count the global batch is planned for
ADVERTISE = "CPUDIST_ADVERTISE"  # the address peers reach this node at (default: its host name)
