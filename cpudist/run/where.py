"""Where a run's ranks start, and the rules that pick it from the user's options.

    here      this machine (its ranks, or Slurm's nodes with --launcher slurm)
    hostfile  the nodes of a hostfile, from their head node (this machine is the first host)
    head      a head reached over SSH from outside the cluster (a cluster from `cluster up`,
              or --head)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cpudist import state
from cpudist.errors import BadInput
from cpudist.hostfile import Host, Nodes, read_nodes
from cpudist.launch.kinds import scheduled
from cpudist.launch.tools import is_this_machine
from cpudist.ssh.client import Target


@dataclass(kw_only=True, frozen=True)
class Head:
    """How this machine reaches the head node, and the names the nodes use for each other."""

    target: Target
    known_hosts: Path
    inside: Nodes  # every node as the others reach it (private addresses), head first
    python: str | None = None  # the head's Python that has cpudist; None: look for one
    stage_code: str = "auto"  # auto: when the head's cpudist differs from ours | always | never
    fetch_model: bool = True  # bring the run's model/ home (--fetch-model)


@dataclass(kw_only=True, frozen=True)
class Route:
    """The options of `cpudist run` that say where to go."""

    hostfile: Path | None = None
    cluster: str | None = None
    head_addr: str | None = None
    user: str | None = None
    identity: str | None = None
    remote_python: str | None = None
    stage_code: str = "auto"
    on_preemption: str = "stop"  # stop | resume (with --cluster: replace lost nodes and go on)


@dataclass(kw_only=True, frozen=True)
class Where:
    """Where the ranks start: here, a hostfile's nodes from their head, or a head over SSH."""

    head: Head | None = None
    # a hostfile's, read once, when this machine is their head (else head.inside)
    nodes: Nodes | None = None
    cluster: str | None = None
    usd_per_hour: float | None = None
    # --on-preemption resume: replace reclaimed nodes with `cluster up` and go on
    recover: bool = False
    # --detach: return once the ranks are up, the agent on the head goes on (run/life/detach.py)
    detach: bool = False

    @property
    def kind(self) -> str:
        return "head" if self.head is not None else "hostfile" if self.nodes is not None else "here"


def where_for(route: Route, nodes: int, ppn_given: bool, launcher: str) -> Where:
    """The route rules: each combination that cannot work is one line naming what would."""
    if not ppn_given and (route.hostfile is not None or route.cluster is not None):
        raise BadInput("--hostfile/--cluster need --ppn (ranks per node)",
                       "e.g. --np 4 --ppn 1 for one rank on each of 4 nodes")
    head, price = None, None
    listed = read_nodes(route.hostfile) if route.hostfile is not None else None
    if route.cluster is not None:
        head, cluster_nodes, price = cluster_target(route.cluster, nodes, route.remote_python,
                                                    route.stage_code)
        listed = listed or cluster_nodes
    elif route.head_addr is not None:
        if listed is None:
            raise BadInput(
                "--head needs --hostfile (the nodes as they name each other, head first)",
                "Pass --hostfile H --head ADDRESS")
        head = onprem_head(listed, route.head_addr, route.user, route.identity, route.remote_python,
                           route.stage_code)
    if head is not None and scheduled(launcher):
        raise BadInput(f"--launcher {launcher} runs from the cluster's login node, not through "
                       "--head/--cluster",
                       f"ssh to the login node and run `cpudist run ... --launcher {launcher}` "
                       "there")
    if head is not None and route.on_preemption == "resume" and route.cluster is None:
        raise BadInput("--on-preemption resume needs --cluster (it replaces lost nodes with "
                       "`cluster up`)",
                       "Use --cluster NAME, or resume by hand with --resume auto")
    recover = head is not None and route.on_preemption == "resume"
    return Where(head=head, nodes=None if head is not None else listed, cluster=route.cluster,
                 usd_per_hour=price, recover=recover)


def cluster_target(name: str, nodes: int, python: str | None,
                   stage_code: str) -> tuple[Head | None, Nodes | None, float | None]:
    """(head to reach when this machine is outside the cluster, else None; the nodes when this
    machine is the head, else None; USD per hour of `nodes`)."""
    from cpudist.cloud.record import load_record

    record = load_record(name)
    if record is None:
        raise BadInput(f"no local record of cluster {name}",
                       "Run `cpudist cluster up` first, or pass --hostfile")
    price = record.usd_per_hour(nodes)
    if is_this_machine(record.nodes[0].private_ip):
        # on the head itself: as with --hostfile
        return None, read_nodes(Path(record.hostfile)), price
    target = Target(record.address(0), record.user, record.ssh_port, record.private_key)
    inside = Nodes(tuple(Host(n.private_ip) for n in record.nodes), f"cluster {name}'s record")
    return Head(target=target, known_hosts=Path(record.known_hosts), inside=inside, python=python,
                stage_code=stage_code), None, price


def onprem_head(listed: Nodes, address: str, user: str | None, identity: str | None,
                python: str | None,
                stage_code: str) -> Head:
    """An on-prem cluster seen from outside: the hostfile's nodes as they name each other, the head
    by `address`."""
    folder = state.local_cluster_dir()
    key = identity or (str(folder / "id_ed25519") if (folder / "id_ed25519").is_file() else None)
    return Head(target=Target(address, user, 22, key), known_hosts=folder / "known_hosts",
                inside=listed, python=python, stage_code=stage_code)


def recover_cluster(name: str, nodes: int, head: Head, wait_gone_s: float,
                    say: Callable[[str], None]) -> Head:
    """Replace the cluster's reclaimed nodes (as `cluster up` would) and return how to reach its
    head now."""
    from cpudist.cloud.connect import connect
    from cpudist.cloud.record import load_record
    from cpudist.cloud.recover import recover
    from cpudist.ssh.access import SshAccess

    record = load_record(name)
    if record is None:
        raise BadInput(f"no local record of cluster {name}", "Run `cpudist cluster up` first")
    recover(connect(record.place), record, wait_gone_s, SshAccess(), say)
    new_head, _, _ = cluster_target(name, nodes, head.python, head.stage_code)
    if new_head is None:
        raise BadInput("--on-preemption resume runs from outside the cluster",
                       "Start it from your own machine")
    return new_head
