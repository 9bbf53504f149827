"""A cluster as `cpudist cluster up` is asked for it, its price and its cost so far.

The lifecycle is three modules over the provider's verbs: cloud/up.py (get-or-create every piece,
roll back on failure), cloud/down.py (remove everything tagged with the cluster) and
cloud/recover.py (replace reclaimed spot nodes). State lives in the cloud (tags); the local record
(cloud/record.py) only caches what is needed to reach the nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cpudist.cloud.provider import Node, Place, Price, Provider
from cpudist.cloud.record import ClusterRecord
from cpudist.errors import CpudistError

Say = Callable[[str], None]


@dataclass(kw_only=True, frozen=True)
class ClusterSpec:
    """What `cpudist cluster up` was asked for."""

    name: str
    nodes: int
    region: str | None
    image: str | None
    ssh_cidr: str
    instance_type: str = "c6i.16xlarge"
    spot: bool = True
    max_price: str | None = None
    on_demand_fallback: bool = False
    key_name: str | None = None
    identity: Path | None = None
    subnet: str | None = None
    placement_group: bool = True
    user: str = "ubuntu"
    connect: str = "public"  # public | private address for SSH
    clone_from_first: bool = False
    setup_script: Path | None = None
    ssh: bool = True
    keep_on_failure: bool = False
    endpoint_url: str | None = None
    ssh_port: int = 22
    boot_timeout_s: float = 900
    profile: str | None = None

    @property
    def place(self) -> Place:
        return Place(self.region, self.endpoint_url, self.profile)


def cost_so_far(nodes: list[Node], record: ClusterRecord | None,
                now: datetime | None = None) -> float | None:
    """Dollars spent by the live nodes since they launched, each at its own price."""
    if record is None:
        return None
    prices = {n.instance_id: n.usd_per_hour for n in record.nodes}
    now = now or datetime.now(UTC)
    total = 0.0
    for n in nodes:
        price = prices.get(n.instance_id)
        if price is None or not n.launch_time:
            return None
        total += max(0.0,
                     (now - datetime.fromisoformat(n.launch_time)).total_seconds()) / 3600 * price
    return round(total, 4)


def price_of(cloud: Provider, spec: ClusterSpec) -> Price:
    """The hourly price of one node, in the zone the nodes would launch in."""
    return cloud.price(spec.instance_type, spec.spot, cloud.subnet(spec.subnet).zone)


def spec_of(record: ClusterRecord) -> ClusterSpec:
    """What `up` was asked for, from the record it wrote."""
    if not record.spec:
        raise CpudistError(f"the record of cluster {record.name} predates recovery",
                           f"Run `cpudist cluster up --name {record.name} ...` once more to "
                           "refresh it")
    data = dict(record.spec)
    for key in ("identity", "setup_script"):
        data[key] = Path(data[key]) if data.get(key) else None
    return ClusterSpec(**data)
