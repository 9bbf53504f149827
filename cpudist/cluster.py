"""Cluster lifecycle on AWS: up (get-or-create every piece, roll back on failure), status, down.

State lives in the cloud (tags); the local record under $CPUDIST_HOME/clusters/NAME only caches
what is needed to reach the nodes: hostfile, private key, user and price.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cpudist.cloud.aws import images, instances, network
from cpudist.cloud.aws.instances import LaunchSpec, Node
from cpudist.cloud.aws.pricing import Price, hourly_price
from cpudist.errors import BadInput, CpudistError
from cpudist.hosts.hostfile import Host, render_hostfile
from cpudist.hosts.setup import forget, ssh_setup
from cpudist.hosts.ssh import KnownHosts, Remote, Target, wait_banner

Say = Callable[[str], None]


@dataclass(frozen=True)
class ClusterSpec:
    """What `cpudist cluster up` was asked for."""

    name: str
    nodes: int
    region: str
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


@dataclass(frozen=True)
class ClusterRecord:
    """The local cache of a cluster: how to reach it, and what it costs."""

    name: str
    region: str
    endpoint_url: str | None
    instance_type: str
    addresses: tuple[str, ...]
    hostfile: str
    private_key: str
    user: str
    usd_per_hour_per_node: float | None
    price_source: str
    spot: bool
    created_at: str


def clusters_dir() -> Path:
    return Path(os.environ.get("CPUDIST_HOME", "~/.cpudist")).expanduser() / "clusters"


def record_dir(name: str) -> Path:
    return clusters_dir() / name


def load_record(name: str) -> ClusterRecord | None:
    path = record_dir(name) / "record.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    data["addresses"] = tuple(data["addresses"])
    return ClusterRecord(**data)


@dataclass
class Created:
    """What this `up` made, so that a failure removes exactly that."""

    key: str | None = None
    security_group: bool = False
    placement_group: bool = False
    instances: list[str] = field(default_factory=list)
    image: bool = False

    def rollback(self, ec2: Any, name: str, say: Say) -> None:
        say(f"removing what this run created for cluster {name}")
        instances.terminate(ec2, self.instances)
        if self.image:
            images.delete_images(ec2, name)
        if self.placement_group:
            network.delete_placement_group(ec2, name)
        if self.security_group:
            network.delete_security_group(ec2, name)
        if self.key:
            network.delete_key_pair(ec2, self.key)


def address(node: Node, connect: str) -> str:
    chosen = node.private_ip if connect == "private" else node.public_ip
    if not chosen:
        raise CpudistError(f"instance {node.instance_id} has no {connect} address",
                           "Use --connect private from inside the VPC, or a subnet that assigns public addresses")
    return chosen


def _configure_first(node_addr: str, spec: ClusterSpec, key: Path, say: Say) -> None:
    """Run the user's setup script on the first node before it is imaged (the blog's clone flow)."""
    if spec.setup_script is None:
        return
    say(f"configuring {node_addr} with {spec.setup_script}")
    known = KnownHosts(Path(key).parent / "known_hosts")
    with Remote(Target(node_addr, spec.user, spec.ssh_port, str(key)), known) as remote:
        remote.check("bash -s", stdin=spec.setup_script.read_bytes(), timeout=3600)


def _launch(ec2: Any, spec: ClusterSpec, launch: LaunchSpec, created: Created, key: Path, say: Say) -> list[Node]:
    if not spec.clone_from_first:
        nodes = []
        for i in range(spec.nodes):
            nodes.append(instances.launch_node(ec2, launch, i))
            created.instances.append(nodes[-1].instance_id)
            say(f"launched node {i}: {nodes[-1].instance_id} ({nodes[-1].lifecycle})")
        return nodes
    first = instances.launch_node(ec2, launch, 0)
    created.instances.append(first.instance_id)
    say(f"launched node 0: {first.instance_id} ({first.lifecycle}); configuring it to clone the rest")
    first = instances.wait_state(ec2, [first.instance_id], "running", spec.boot_timeout_s)[0]
    if spec.ssh or spec.setup_script:  # --no-ssh without a setup script images node 0 as it booted
        wait_banner(address(first, spec.connect), spec.ssh_port, spec.boot_timeout_s)
        _configure_first(address(first, spec.connect), spec, key, say)
    image = images.create_image(ec2, first.instance_id, spec.name, f"cpudist-{spec.name}-node0")
    created.image = True
    say(f"imaged node 0 as {image}")
    nodes = [first]
    for i in range(1, spec.nodes):
        nodes.append(instances.launch_node(ec2, dataclasses.replace(launch, image_id=image), i))
        created.instances.append(nodes[-1].instance_id)
        say(f"launched node {i} from {image}: {nodes[-1].instance_id} ({nodes[-1].lifecycle})")
    return nodes


def _existing(ec2: Any, spec: ClusterSpec, group_id: str) -> list[Node]:
    foreign = instances.foreign_in_group(ec2, spec.name, group_id)
    if foreign:
        raise CpudistError(f"security group of cluster {spec.name} holds instances of no cpudist cluster: "
                           f"{', '.join(foreign)}", "Move or terminate them, or pick another --name")
    nodes = instances.find_nodes(ec2, spec.name)
    if nodes and len(nodes) != spec.nodes:
        raise CpudistError(f"cluster {spec.name} has {len(nodes)} nodes, not {spec.nodes}",
                           f"Pass --nodes {len(nodes)}, or `cpudist cluster down --name {spec.name}` first")
    return nodes


def up(ec2: Any, spec: ClusterSpec, price: Price, say: Say) -> ClusterRecord:
    """Bring the cluster to `spec`: every step get-or-create; a failure removes what this run made."""
    folder = record_dir(spec.name)
    created = Created()
    try:
        subnet = network.resolve_subnet(ec2, spec.subnet)
        key, new_key = network.ensure_key_pair(ec2, spec.name, folder, spec.key_name, spec.identity)
        created.key = key.name if new_key else None
        group_id, created.security_group = network.ensure_security_group(ec2, spec.name, subnet.vpc_id,
                                                                         spec.ssh_cidr)
        placement = None
        if spec.placement_group:
            placement, created.placement_group = network.ensure_placement_group(ec2, spec.name)
        nodes = _existing(ec2, spec, group_id)
        if nodes:
            say(f"cluster {spec.name} already has its {len(nodes)} nodes")
        else:
            if spec.image is None:
                raise BadInput("no image given", "Pass --image AMI_ID (e.g. from `cpudist ami build`)")
            launch = LaunchSpec(spec.name, spec.image, spec.instance_type, key.name, group_id, subnet.subnet_id,
                                placement, spec.spot, spec.max_price, spec.on_demand_fallback)
            nodes = _launch(ec2, spec, launch, created, key.private_key, say)
        nodes = instances.wait_state(ec2, [n.instance_id for n in nodes], "running", spec.boot_timeout_s)
        nodes = sorted(nodes, key=lambda n: n.index)
        addresses = [address(n, spec.connect) for n in nodes]
        hostfile = folder / "hostfile"
        folder.mkdir(parents=True, exist_ok=True)
        hostfile.write_text(render_hostfile([Host(a) for a in addresses]))
        if spec.ssh:
            for a in addresses:
                wait_banner(a, spec.ssh_port, spec.boot_timeout_s)
            say("nodes answer SSH; installing the cluster key on every node")
            ssh_setup([Host(a) for a in addresses], spec.user, str(key.private_key), spec.ssh_port)
    except BaseException:
        if not spec.keep_on_failure:
            try:
                created.rollback(ec2, spec.name, say)
            except Exception as e:  # the first failure is the one to report
                say(f"rollback incomplete ({e}): run `cpudist cluster down --name {spec.name}`")
        raise
    record = ClusterRecord(spec.name, spec.region, spec.endpoint_url, spec.instance_type, tuple(addresses),
                           str(hostfile), str(key.private_key), spec.user, price.usd_per_hour, price.source,
                           spec.spot, datetime.now(UTC).isoformat(timespec="seconds"))
    (folder / "record.json").write_text(json.dumps(dataclasses.asdict(record), indent=2) + "\n")
    return record


def down(ec2: Any, name: str, keep_image: bool, say: Say) -> dict[str, Any]:
    """Remove everything tagged with the cluster: instances, group, placement group, key, images."""
    nodes = instances.find_nodes(ec2, name, role=None)
    say(f"terminating {len(nodes)} instance(s)")
    instances.terminate(ec2, [n.instance_id for n in nodes])
    removed: dict[str, Any] = {"instances": [n.instance_id for n in nodes]}
    removed["security_group"] = network.delete_security_group(ec2, name)
    removed["placement_group"] = network.delete_placement_group(ec2, name)
    record = load_record(name)
    generated_key = network.resource_name(name)
    network.delete_key_pair(ec2, generated_key)
    removed["key_pair"] = generated_key
    removed["images"] = [] if keep_image else images.delete_images(ec2, name)
    if record is not None:
        for addr in record.addresses:
            forget(addr)  # a later cluster may reuse the address with a new host key
    folder = record_dir(name)
    for leftover in ("record.json", "hostfile", "id_ed25519", "known_hosts"):
        (folder / leftover).unlink(missing_ok=True)
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
    return removed


def cost_so_far(nodes: list[Node], usd_per_hour: float | None, now: datetime | None = None) -> float | None:
    """Dollars spent by the running nodes since they launched."""
    if usd_per_hour is None:
        return None
    now = now or datetime.now(UTC)
    hours = sum(max(0.0, (now - datetime.fromisoformat(n.launch_time)).total_seconds()) / 3600
                for n in nodes if n.launch_time)
    return round(hours * usd_per_hour, 4)


def price_of(ec2: Any, spec: ClusterSpec) -> Price:
    zone = network.resolve_subnet(ec2, spec.subnet).zone
    return hourly_price(ec2, spec.instance_type, spec.region, spec.spot, zone)


def bake_image(ec2: Any, name: str, base_image: str, instance_type: str, subnet: str | None,
               timeout_s: float) -> str:
    """An AMI baked from ami/bootstrap.sh: the builder powers off when done, is imaged, then terminated."""
    from importlib import resources

    script = resources.files("cpudist.ami").joinpath("bootstrap.sh").read_text()
    sub = network.resolve_subnet(ec2, subnet)
    builder = instances.launch_builder(ec2, f"image-{name}", base_image, instance_type, sub.subnet_id, script)
    try:
        instances.wait_state(ec2, [builder.instance_id], "stopped", timeout_s)
        return images.create_image(ec2, builder.instance_id, f"image-{name}", name)
    finally:
        instances.terminate(ec2, [builder.instance_id])


def run_target(name: str, nodes: int) -> tuple[Path, float | None]:
    """(hostfile, USD per hour of `nodes` nodes) of a cluster from its local record."""
    record = load_record(name)
    if record is None:
        raise BadInput(f"no local record of cluster {name}", "Run `cpudist cluster up` first, or pass --hostfile")
    per_node = record.usd_per_hour_per_node
    return Path(record.hostfile), None if per_node is None else per_node * nodes
