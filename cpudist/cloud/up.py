"""`cluster up`: bring a cluster to its spec, every piece get-or-create; a failure removes what this
run made.

Every resource an `up` makes carries its run's tag, so a failed or interrupted `up` removes exactly
what it made, including what a lost answer hid from it. SSH (the banner, the cluster key, node 0's
set-up script, stale host keys) goes through the `NodeAccess` the caller passes in.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime
from pathlib import Path

from cpudist import state
from cpudist.cloud.access import NodeAccess, address
from cpudist.cloud.cluster import ClusterSpec, Say
from cpudist.cloud.lock import cluster_lock
from cpudist.cloud.provider import KeyRequest, LaunchSpec, Node, Price, Provider
from cpudist.cloud.record import ClusterRecord, NodeRecord, load_record, save_record
from cpudist.errors import BadInput, CpudistError
from cpudist.hostfile import Host, render_hostfile
from cpudist.interrupts import shielded, signals_interrupt
from cpudist.waits import wait_until

LAUNCH_IN_FLIGHT_S = 30.0
# Answers after which a RunInstances may or may not have launched something (server faults, lost
# replies).
UNCERTAIN = frozenset({"InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable",
                       "RequestTimeout", "EndpointConnectionError", "ReadTimeoutError",
                       "ConnectTimeoutError", "ConnectionClosedError"})


@dataclasses.dataclass
class _Run:
    """One `cluster up`: its tag value, the provider and SSH it uses, and whether a launch may be in
    flight."""

    id: str
    cloud: Provider
    ssh: NodeAccess
    # interrupted mid-RunInstances: its instances can show up after we stop waiting
    launching: bool = False

    def launch(self, spec: LaunchSpec, indices: list[int]) -> list[Node]:
        self.launching = True
        try:
            nodes = self.cloud.launch(spec, indices)
        except CpudistError as e:
            if getattr(e, "code", "") not in UNCERTAIN:
                # a refusal: AWS made nothing, so there is nothing to wait for
                self.launching = False
            raise
        self.launching = False
        return nodes


def _known_hosts(spec: ClusterSpec) -> Path:
    return state.cluster_dir(spec.name) / "known_hosts"


def _reach(node: Node, spec: ClusterSpec) -> str:
    return address(node.private_ip, node.public_ip, spec.connect, f"instance {node.instance_id}")


def _rollback(spec: ClusterSpec, run: _Run, say: Say) -> None:
    """Remove what the run made, found by its tag (also what a lost or unfinished call hid from
    us)."""
    say(f"removing what this run created for cluster {spec.name}")
    run_id, cloud = run.id, run.cloud
    made = cloud.of_run(run_id)
    if run.launching and not made:
        say("waiting for the launch that was in flight to show up, to remove it too")
        try:
            made = wait_until(lambda: cloud.of_run(run_id) or None, "the interrupted launch",
                              LAUNCH_IN_FLIGHT_S, 1.0)
        except CpudistError:
            made = []  # the call never reached AWS
    cloud.terminate([n.instance_id for n in made])
    cloud.remove(spec.name, run_id)
    if load_record(spec.name) is None:
        # no earlier `up` made it: the key this run wrote, its pins
        state.remove_cluster_dir(spec.name)
    else:
        run.ssh.forget(_known_hosts(spec),
                       [a for n in made for a in (n.public_ip, n.private_ip) if a])


def _configure_first(node_addr: str, spec: ClusterSpec, key: Path, run: _Run, say: Say) -> None:
    """Run the user's setup script on the first node before it is imaged (the blog's clone flow)."""
    if spec.setup_script is None:
        return
    say(f"configuring {node_addr} with {spec.setup_script}")
    with run.ssh.login(node_addr, spec.user, spec.ssh_port, key, _known_hosts(spec)) as remote:
        remote.check("bash -s", stdin=spec.setup_script.read_bytes(), timeout=3600)


def _launch(spec: ClusterSpec, run: _Run, launch: LaunchSpec, missing: list[int], key: Path,
            say: Say) -> list[Node]:
    """Launch the missing nodes: in one call, or node 0 first to image it (--clone-from-first).
    A clone cluster that has its image (a re-run, a recovery) boots every missing node from it."""
    own = run.cloud.cluster_image(spec.name) if spec.clone_from_first else None
    if own is not None:
        say(f"node image: {own}, cloned from node 0 of cluster {spec.name}")
        launch = dataclasses.replace(launch, image_id=own)
    if own is not None or not spec.clone_from_first or 0 not in missing:
        nodes = run.launch(launch, missing)
        say(f"launched node(s) {', '.join(str(n.index) for n in nodes)}: "
            + ", ".join(f"{n.instance_id} ({n.lifecycle})" for n in nodes))
        return nodes
    first = run.launch(launch, [0])[0]
    say(f"launched node 0: {first.instance_id} ({first.lifecycle}); configuring it to clone the "
        "rest")
    first = run.cloud.wait([first.instance_id], "running", spec.boot_timeout_s)[0]
    if spec.ssh or spec.setup_script:  # --no-ssh without a setup script images node 0 as it booted
        run.ssh.wait_banner(_reach(first, spec), spec.ssh_port, spec.boot_timeout_s)
        _configure_first(_reach(first, spec), spec, key, run, say)
    # AMI names are unique in a region: the run's id keeps a new image from taking an old one's.
    name = f"cpudist-{spec.name}-node0-{launch.run_id}"
    image = run.cloud.image(first.instance_id, spec.name, name, launch.run_id)
    say(f"imaged node 0 as {image}")
    rest = run.launch(dataclasses.replace(launch, image_id=image), [i for i in missing if i])
    return [first, *rest]


def _numbered(spec: ClusterSpec, run: _Run, nodes: list[Node], say: Say) -> list[Node]:
    """The nodes, each with an index: one launched without it (killed or failed between the launch
    and its numbering, or kept by --keep-on-failure) takes a free index instead of being launched
    again."""
    unnumbered = [n for n in nodes if n.index < 0]
    if not unnumbered:
        return nodes
    free = sorted(set(range(spec.nodes)) - {n.index for n in nodes})
    for node, index in zip(unnumbered, free, strict=False):
        run.cloud.number(spec.name, node.instance_id, index)
    say("numbered instance(s) launched without a node index: "
        f"{', '.join(n.instance_id for n in unnumbered)}")
    given = dict(zip((n.instance_id for n in unnumbered), free, strict=False))
    return sorted((dataclasses.replace(n, index=given.get(n.instance_id, n.index)) for n in nodes),
                  key=lambda n: n.index)


def _existing(spec: ClusterSpec, run: _Run, group_id: str, say: Say) -> list[Node]:
    """The cluster's live nodes, stopped ones started again; more than asked for is an error."""
    foreign = run.cloud.foreign(spec.name, group_id)
    if foreign:
        raise CpudistError(f"security group of cluster {spec.name} holds instances of no cpudist "
                           f"cluster: {', '.join(foreign)}",
                           "Move or terminate them, or pick another --name")
    nodes = run.cloud.nodes(spec.name)
    if len(nodes) > spec.nodes:
        raise CpudistError(f"cluster {spec.name} has {len(nodes)} nodes, not {spec.nodes}",
                           f"Pass --nodes {len(nodes)}, or `cpudist cluster down --name "
                           f"{spec.name}` first")
    nodes = _numbered(spec, run, nodes, say)
    stopping = [n.instance_id for n in nodes if n.state == "stopping"]
    run.cloud.wait(stopping, "stopped", spec.boot_timeout_s)
    stopped = [n.instance_id for n in nodes if n.state in ("stopped", "stopping")]
    if stopped:
        say(f"starting stopped node(s): {', '.join(stopped)}")
        run.cloud.start(stopped)
    return nodes


def _connect_nodes(spec: ClusterSpec, nodes: list[Node], key: Path, run: _Run, say: Say) -> None:
    """Wait for SSH, install the cluster key, and check that every node reaches every other
    privately."""
    reach = [_reach(n, spec) for n in nodes]
    for a in reach:
        run.ssh.wait_banner(a, spec.ssh_port, spec.boot_timeout_s)
    say("nodes answer SSH; installing the cluster key on every node")
    private = [n.private_ip or "" for n in nodes]
    broken = run.ssh.setup(reach, private, spec.user, spec.ssh_port, key,
                           state.cluster_dir(spec.name))
    if broken:
        src, dst = broken[0]
        raise CpudistError(f"node {src} cannot reach node {dst} over its private address "
                           f"({len(broken)} failing pair(s)): no job could run on this cluster",
                           "Check that the security group admits all traffic from itself and that "
                           "the subnet's network ACL allows it, then re-run `cpudist cluster up`")


def _record(spec: ClusterSpec, cloud: Provider, nodes: list[Node], key: Path,
            price: Price) -> ClusterRecord:
    on_demand = cloud.on_demand(spec.instance_type).usd_per_hour
    folder = state.cluster_dir(spec.name)
    hostfile = folder / "hostfile"
    state.write_atomic(hostfile, render_hostfile([Host(n.private_ip or "") for n in nodes]))
    rows = tuple(NodeRecord(index=n.index, instance_id=n.instance_id, private_ip=n.private_ip or "",
                            public_ip=n.public_ip, lifecycle=n.lifecycle,
                            usd_per_hour=price.usd_per_hour if n.lifecycle == "spot" else on_demand)
                 for n in nodes)
    place = cloud.place  # resolved: every later command talks to this region, endpoint and profile
    spec = dataclasses.replace(spec, region=place.region or spec.region,
                               endpoint_url=place.endpoint_url, profile=place.profile)
    return ClusterRecord(name=spec.name, region=spec.region or "", endpoint_url=spec.endpoint_url,
                         instance_type=spec.instance_type, nodes=rows,
                         connect=spec.connect,
                         user=spec.user, ssh_port=spec.ssh_port, private_key=str(key),
                         known_hosts=str(folder / "known_hosts"),
                         hostfile=str(hostfile),
                         price_source=price.source,
                         created_at=datetime.now(UTC).isoformat(timespec="seconds"),
                         spec={k: str(v) if isinstance(v, Path) else v for k,
                          v in dataclasses.asdict(spec).items()},
                         profile=place.profile)


def _converge(spec: ClusterSpec, price: Price, run: _Run, say: Say) -> ClusterRecord:
    run_id, cloud = run.id, run.cloud
    folder = state.cluster_dir(spec.name)
    subnet = cloud.subnet(spec.subnet)
    key = cloud.key_pair(KeyRequest(owner=spec.name, folder=folder, run_id=run_id,
                                    new_key=run.ssh.new_key, key_name=spec.key_name,
                                    identity=spec.identity))
    group_id = cloud.security_group(spec.name, subnet.vpc_id, spec.ssh_cidr, run_id)
    placement = cloud.placement_group(spec.name, run_id) if spec.placement_group else None
    nodes = _existing(spec, run, group_id, say)
    fresh: set[str] = set()
    missing = sorted(set(range(spec.nodes)) - {n.index for n in nodes})
    if missing:
        if nodes:
            say(f"cluster {spec.name} has {len(nodes)} of its {spec.nodes} nodes: launching "
                f"node(s) {', '.join(map(str, missing))}")
        if spec.image is None:
            raise BadInput("no image given", "Pass --image AMI_ID (e.g. from `cpudist ami build`)")
        launch = LaunchSpec(cluster=spec.name, image_id=spec.image,
                            instance_type=spec.instance_type, key_name=key.name,
                            security_group=group_id, subnet_id=subnet.subnet_id,
                            placement_group=placement, spot=spec.spot, max_price=spec.max_price,
                            on_demand_fallback=spec.on_demand_fallback, run_id=run_id)
        launched = _launch(spec, run, launch, missing, key.private_key, say)
        nodes += launched
        fresh = {n.instance_id for n in launched}
    else:
        say(f"cluster {spec.name} already has its {len(nodes)} nodes")
    by_index = {n.instance_id: n.index for n in nodes}
    nodes = run.cloud.wait(list(by_index), "running", spec.boot_timeout_s)
    nodes = sorted((dataclasses.replace(n, index=by_index[n.instance_id]) for n in nodes),
                   key=lambda n: n.index)
    # A new machine behind an address used before (a replaced node): its old key is stale.
    run.ssh.forget(folder / "known_hosts",
                   [a for n in nodes if n.instance_id in fresh for a in (n.public_ip, n.private_ip)
                    if a])
    if spec.ssh:
        _connect_nodes(spec, nodes, key.private_key, run, say)
    return _record(spec, cloud, nodes, key.private_key, price)


class RollbackIncomplete(CpudistError):
    """`up` failed and removing what it made failed too: something of this run is still live (and
    billed)."""


def _still_live(spec: ClusterSpec, run: _Run) -> str:
    """What of this run is still there after a failed rollback, in one phrase."""
    try:
        left = run.cloud.inventory(spec.name, run.id).listed()
    except Exception as e:  # the cloud is out of reach: say so, not nothing
        return f"unknown (listing failed: {e})"
    return ", ".join(left) if left else "nothing"


def _roll_back_or_say(spec: ClusterSpec, run: _Run, why: BaseException, say: Say) -> None:
    with shielded(lambda: say("finishing the cleanup first; it stops by itself")):
        try:
            _rollback(spec, run, say)
            return
        except Exception as e:  # the first failure is the one to report, with what is left
            failed = e
        live = _still_live(spec, run)
    cause = "interrupted" if isinstance(why, KeyboardInterrupt) else str(why)
    raise RollbackIncomplete(f"cluster {spec.name}: {cause}; rollback incomplete ({failed}): still "
                             f"live: {live}",
                             f"Run `cpudist cluster down --name {spec.name}` to remove it") from why


def up(cloud: Provider, spec: ClusterSpec, price: Price, ssh: NodeAccess,
       say: Say) -> ClusterRecord:
    """Bring the cluster to `spec`: every step get-or-create; a failure removes what this run made.

    One `up`, `down` or recovery of a name at a time (cloud/lock.py). SIGTERM and SIGHUP count as
    Ctrl-C; a second Ctrl-C while the rollback runs does not stop it; a rollback that fails says
    what is still live.
    """
    run = _Run(uuid.uuid4().hex[:12], cloud, ssh)
    with cluster_lock(spec.name):
        try:
            with signals_interrupt() as signals:
                record = _converge(spec, price, run, say)
                signals.check()  # a Ctrl-C swallowed on the way must not end in "cluster is up"
                save_record(record)
        except BaseException as e:
            if not spec.keep_on_failure:
                _roll_back_or_say(spec, run, e, say)
            raise
    return record
