"""Where a run goes: a cluster from `cpudist cluster up`, or an on-prem hostfile reached through --head."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from cpudist.errors import BadInput
from cpudist.hostfile import Host, read_hostfile
from cpudist.launch.tools import is_this_machine
from cpudist.run.remote import Head
from cpudist.ssh.client import Target
from cpudist.ssh.keys import local_cluster_dir


def cluster_target(name: str, nodes: int, python: str | None,
                   stage_code: str) -> tuple[Head | None, Path, float | None]:
    """(head to reach when this machine is outside the cluster, else None; hostfile; USD per hour of `nodes`)."""
    from cpudist.cluster import load_record

    record = load_record(name)
    if record is None:
        raise BadInput(f"no local record of cluster {name}", "Run `cpudist cluster up` first, or pass --hostfile")
    price = record.usd_per_hour(nodes)
    if is_this_machine(record.nodes[0].private_ip):
        return None, Path(record.hostfile), price  # on the head itself: launch here, as with --hostfile
    target = Target(record.address(0), record.user, record.ssh_port, record.private_key)
    inside = tuple(Host(n.private_ip) for n in record.nodes)
    return Head(target, Path(record.known_hosts), inside, python, stage_code), Path(record.hostfile), price


def onprem_head(hostfile: Path, address: str, user: str | None, identity: str | None, python: str | None,
                stage_code: str) -> Head:
    """An on-prem cluster seen from outside: the hostfile as nodes name each other, the head by `address`."""
    hosts = read_hostfile(hostfile)
    folder = local_cluster_dir()
    key = identity or (str(folder / "id_ed25519") if (folder / "id_ed25519").is_file() else None)
    return Head(Target(address, user, 22, key), folder / "known_hosts", hosts, python, stage_code)


def recover_cluster(name: str, nodes: int, python: str | None, stage_code: str, wait_gone_s: float,
                    say: Callable[[str], None]) -> Head:
    """Replace the cluster's reclaimed nodes (as `cluster up` would) and return how to reach its head now."""
    from cpudist.cloud.aws.client import ec2_client
    from cpudist.cluster import load_record, recover

    record = load_record(name)
    if record is None:
        raise BadInput(f"no local record of cluster {name}", "Run `cpudist cluster up` first")
    recover(ec2_client(record.region, record.endpoint_url), record, wait_gone_s, say)
    head, _, _ = cluster_target(name, nodes, python, stage_code)
    if head is None:
        raise BadInput("--on-preemption resume runs from outside the cluster", "Start it from your own machine")
    return head
