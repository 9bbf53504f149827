"""The local record of a cluster: how this machine reaches its nodes, how they reach each other, the
price.

State lives in the cloud (tags); the record under ~/.cpudist/clusters/NAME only caches what is
needed to reach the nodes. Written whole (atomically) by `cluster up`, removed by `cluster down`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cpudist import state
from cpudist.cloud.access import address
from cpudist.cloud.provider import Place
from cpudist.errors import CpudistError


@dataclass(kw_only=True, frozen=True)
class NodeRecord:
    """One node: its addresses, what it really is (spot or on-demand) and its price."""

    index: int
    instance_id: str
    private_ip: str
    public_ip: str | None
    lifecycle: str  # spot | on-demand (after any fallback)
    usd_per_hour: float | None


@dataclass(kw_only=True, frozen=True)
class ClusterRecord:
    """A cluster as this machine knows it."""

    name: str
    region: str
    endpoint_url: str | None
    instance_type: str
    nodes: tuple[NodeRecord, ...]
    connect: str  # public | private: how THIS machine reaches the nodes
    user: str
    ssh_port: int
    private_key: str  # the cluster key (0600): this machine -> nodes, and node -> node
    known_hosts: str  # the nodes' host keys, pinned by the address this machine uses
    hostfile: str  # private addresses, head first: the hostfile used between nodes
    price_source: str
    created_at: str
    # what `up` was asked for: a recovery converges to it
    spec: dict[str, Any] = field(default_factory=dict)
    profile: str | None = None  # the AWS profile it was made with (None: the default chain)

    @property
    def place(self) -> Place:
        """Where the cluster lives, as `up` resolved it: later commands use it whatever the
        environment says."""
        return Place(self.region, self.endpoint_url, self.profile, pinned=True)

    def address(self, i: int) -> str:
        """How this machine reaches node i."""
        node = self.nodes[i]
        return address(node.private_ip, node.public_ip, self.connect,
                       f"node {i} ({node.instance_id}) of cluster {self.name}")

    def usd_per_hour(self, nodes: int) -> float | None:
        """The price of the first `nodes` nodes, per hour; None when any price is unknown."""
        prices = [n.usd_per_hour for n in self.nodes[:nodes]]
        return None if any(p is None
                           for p in prices) else round(sum(p for p in prices if p is not None), 6)

    @property
    def private_addresses(self) -> list[str]:
        return [n.private_ip for n in self.nodes]


def record_path(name: str) -> Path:
    return state.cluster_dir(name) / "record.json"


def load_record(name: str) -> ClusterRecord | None:
    """The record of cluster `name`, or None when this machine has none."""
    path = record_path(name)
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    if "nodes" not in data:
        raise CpudistError(f"{path} was written by an older cpudist",
                           f"Run `cpudist cluster up --name {name} ...` again to refresh it")
    data["nodes"] = tuple(NodeRecord(**n) for n in data["nodes"])
    return ClusterRecord(**data)


def save_record(record: ClusterRecord) -> None:
    state.write_atomic(record_path(record.name), json.dumps(dataclasses.asdict(record), indent=2)
                       + "\n")
