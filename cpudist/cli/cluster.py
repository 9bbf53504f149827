"""`cpudist cluster up/down/status/list`: AWS, thin over cpudist.cloud (up, down, record)."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from cpudist import __version__, state
from cpudist.cli.cluster_options import (
    caller_cidr,
    cluster_place,
    imds_callback,
    max_price_callback,
    name_option,
    region_option,
    say,
)
from cpudist.cli.defaults import config_option
from cpudist.cli.options import output_options
from cpudist.cloud.cluster import ClusterSpec, cost_so_far, price_of
from cpudist.cloud.connect import connect
from cpudist.cloud.down import check_outside, this_node
from cpudist.cloud.down import down as remove_cluster
from cpudist.cloud.images import BAKE_MINUTES, BakeSpec, bake
from cpudist.cloud.provider import Place, Provider
from cpudist.cloud.record import load_record
from cpudist.cloud.up import up as bring_up
from cpudist.errors import BadInput, CpudistError
from cpudist.interrupts import signals_interrupt
from cpudist.run.remote import build_wheel
from cpudist.ssh.access import SshAccess
from cpudist.validate import check_ssh_cidr
from cpudist.waits import TimedOut


@click.group()
def cluster() -> None:
    """Provision a cluster of CPU instances on AWS, and remove it."""


@cluster.command()
@config_option
@name_option
@click.option("--nodes", type=click.IntRange(min=1), required=True,
              help="Instances in the cluster (node 0 is the head).")
@region_option
@click.option("--instance-type", default="c6i.16xlarge", show_default=True,
              help="EC2 instance type of every node.")
@click.option("--image",
              help="AMI to boot [default: the newest from `cpudist ami build` for this version; "
                    "built first when there is none].")
@click.option("--spot/--on-demand", default=True, show_default=True,
              help="Spot instances (cheaper, reclaimable "
              "with two minutes' notice) or on-demand.")
@click.option("--max-price", callback=max_price_callback,
              help="Highest spot price per hour in USD, e.g. 0.85 [default: "
                    "the on-demand price].")
@click.option("--on-demand-fallback", is_flag=True,
              help="Launch on-demand when spot capacity is refused.")
@click.option("--ssh-cidr", help="Who may SSH in [default: your public address/32].")
@click.option("--allow-ssh-from-anywhere", is_flag=True,
              help="Accept an --ssh-cidr wider than /16 (or 0.0.0.0/0).")
@click.option("--key-name", help="Your existing key pair [default: cpudist makes one].")
@click.option("--identity", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Private key of --key-name.")
@click.option("--subnet", help="Subnet for every node [default: the default VPC's first].")
@click.option("--placement-group/--no-placement-group", default=True, show_default=True,
              help="Put the nodes in a `cluster` placement group (one rack: the fastest links "
                   "between them).")
@click.option("--user", default="ubuntu", show_default=True, help="Login name of the image.")
@click.option("--connect", type=click.Choice(["public", "private"]), default="public",
              show_default=True,
              help="Reach nodes by public address, or private (from a bastion inside the VPC).")
@click.option("--clone-from-first", is_flag=True,
              help="Configure node 0, image it, launch the rest from it.")
@click.option("--setup-script", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Script run on node 0 before it is imaged (with --clone-from-first).")
@click.option("--ssh/--no-ssh", default=True, show_default=True,
              help="Wait for SSH and set up password-less SSH between nodes.")
@click.option("--keep-on-failure", is_flag=True,
              help="Leave what a failed run created, for debugging.")
@click.option("--boot-timeout", type=click.FloatRange(min=1), default=900, show_default=True,
              help="Seconds to wait for the nodes (and an image builder) to run and answer SSH.")
@click.option("--yes", is_flag=True, help="Do not ask before spending money.")
@click.option("--dry-run", is_flag=True,
              help="Show the price and what would be made; make nothing.")
def up(name: str, nodes: int, region: str | None, endpoint_url: str | None, profile: str | None,
       ssh_cidr: str | None, yes: bool, dry_run: bool, boot_timeout: float, ssh: bool,
       allow_ssh_from_anywhere: bool, **opts: Any) -> None:
    """Provision NODES identical instances, tagged cpudist:cluster=NAME, and print the hostfile."""
    cidr = check_ssh_cidr(ssh_cidr, allow_ssh_from_anywhere) if ssh_cidr else caller_cidr()
    cloud = connect(cluster_place(name, region, endpoint_url, profile))
    region = cloud.place.region
    spec = ClusterSpec(name=name, nodes=nodes, region=region, ssh_cidr=cidr,
                       endpoint_url=cloud.place.endpoint_url,
                       profile=cloud.place.profile, boot_timeout_s=boot_timeout, ssh=ssh, **opts)
    price = price_of(cloud, spec)
    per_node = "unknown" if price.usd_per_hour is None else f"${price.usd_per_hour:.4g}/h"
    total = price.total(nodes)
    say(f"{nodes} x {spec.instance_type} {'spot' if spec.spot else 'on-demand'} in {region}: "
        f"{per_node} per node"
        + (f", ${total:.2f}/h in all" if total is not None else "") + f" ({price.source})")
    if dry_run:
        say(f"would ensure key pair, security group (SSH from {spec.ssh_cidr}; all traffic "
            f"inside), {'placement group, ' if spec.placement_group else ''}{nodes} instance(s) of "
            f"{spec.image}")
        return
    if not yes:
        if not sys.stdin.isatty():
            raise BadInput("not asking for confirmation without a terminal",
                           "Pass --yes to go ahead")
        click.confirm("Launch these instances?", abort=True, err=True)
    try:  # an image build too: Ctrl-C in it ends in the line below, not click's bare "Aborted!"
        if spec.image is None:
            spec = dataclasses.replace(spec, image=default_image(cloud, spec, yes))
        record = bring_up(cloud, spec, price, SshAccess(), say)
    except KeyboardInterrupt:
        if spec.keep_on_failure:
            raise CpudistError("interrupted: what this run created was kept (--keep-on-failure)",
                               "Re-run `cpudist cluster up` to go on, or `cpudist cluster down "
                               f"--name {name}`"
                               ) from None
        raise CpudistError("interrupted: what this run created was removed",
                           "Re-run `cpudist cluster up` to start again") from None
    if ssh:
        say(f"cluster {name} is up: every node reaches every other over its private address")
    else:
        say(f"cluster {name} is launched (--no-ssh: SSH not checked)")
    say(f"reach the head at {record.address(0)}; hostfile between nodes: {record.hostfile}")
    click.echo(Path(record.hostfile).read_text(), nl=False)


def default_image(cloud: Provider, spec: ClusterSpec, yes: bool) -> str:
    """The newest image `ami build` made for this cpudist; without one, build it (after asking)."""
    found = cloud.newest_image(__version__)
    if found:
        say(f"image: {found}, the newest built for cpudist {__version__}")
        return found
    bake_price = cloud.on_demand("c6i.large").usd_per_hour
    cost = "unknown" if bake_price is None else f"about ${bake_price * BAKE_MINUTES / 60:.2f}"
    say(f"no image for cpudist {__version__} yet: building one first (about {BAKE_MINUTES} min, "
        f"{cost}; see ami/README.md), then launching the cluster")
    if not yes:
        if not sys.stdin.isatty():
            raise BadInput("not asking for confirmation without a terminal",
                           "Pass --yes, or --image AMI")
        click.confirm("Build the image?", abort=True, err=True)
    base = cloud.base_image()
    wanted = BakeSpec(name=f"cpudist-{__version__.replace('.', '-')}", base_image=base,
                      ssh_cidr=spec.ssh_cidr, user=spec.user, connect=spec.connect,
                      subnet=spec.subnet, boot_timeout_s=spec.boot_timeout_s)
    try:
        return bake(cloud, wanted, build_wheel(state.wheels_dir()), SshAccess(), say)
    except TimedOut as e:
        raise TimedOut(f"building the node image: {e.what}", "Nothing of the build is left: re-run "
                       "(a slow boot: with a longer --boot-timeout), or pass --image AMI") from None


@cluster.command()
@name_option
@region_option
@click.option("--keep-image", is_flag=True, help="Keep the AMIs cpudist made for this cluster.")
@click.option("--yes", is_flag=True, help="Do not ask before removing.")
@click.option("--dry-run", is_flag=True, help="List what would be removed; remove nothing.")
@click.option("--imds-endpoint", "imds", default="auto", show_default=True, callback=imds_callback,
              help="Instance metadata service asked which instance this machine is (down "
              "refuses to run on a node of the cluster): auto (AWS's, on EC2 only), off, or a URL.")
def down(name: str, region: str | None, endpoint_url: str | None, profile: str | None,
         keep_image: bool, yes: bool, dry_run: bool, imds: str) -> None:
    """Remove every resource tagged with the cluster, its local record and keys (from outside)."""
    cloud = connect(cluster_place(name, region, endpoint_url, profile))
    inv = cloud.inventory(name)
    found = dataclasses.asdict(inv)
    images = [] if keep_image else found["images"]
    listed = [*inv.instances, *inv.security_groups,
              *filter(None, (inv.placement_group, inv.key_pair)), *images]
    local = state.cluster_dir(name)
    say(f"cluster {name}: " + (", ".join(listed) if listed else "nothing in AWS")
        + (f"; local record {local}" if local.exists() else ""))
    if dry_run:
        click.echo(json.dumps({**found, "images": images, "local": str(local) if local.exists()
                               else None}))
        return
    if not listed and not local.exists():
        raise BadInput(f"there is no cluster {name} in {cloud.place.region} nor a local record of "
                       "it",
                       "Check --name and --region (`cpudist cluster list`)")
    here = this_node(cloud, imds, say)
    check_outside(name, inv.instances, here)
    if not yes:
        if not sys.stdin.isatty():
            raise BadInput("not asking for confirmation without a terminal",
                           "Pass --yes to go ahead")
        click.confirm("Remove all of this?", abort=True, err=True)
    with signals_interrupt():
        removed = remove_cluster(cloud, name, keep_image, say, here)
    click.echo(json.dumps(dataclasses.asdict(removed)))


def _uptime(launch_time: str) -> str:
    if not launch_time:
        return "-"
    seconds = (datetime.now(UTC) - datetime.fromisoformat(launch_time)).total_seconds()
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


@cluster.command()
@name_option
@region_option
@output_options()
def status(name: str, region: str | None, endpoint_url: str | None, profile: str | None,
           fmt: str) -> None:
    """Nodes, states, private and public addresses, spot or on-demand, price, uptime and cost so
    far."""
    cloud = connect(cluster_place(name, region, endpoint_url, profile))
    nodes = cloud.nodes(name, role=None)
    record = load_record(name)
    if not nodes and record is None:
        raise BadInput(f"there is no cluster {name} in {cloud.place.region} nor a local record of "
                       "it",
                       "Check --name and --region (`cpudist cluster list`)")
    prices = {n.instance_id: n.usd_per_hour for n in record.nodes} if record else {}
    cost = cost_so_far(nodes, record)
    if fmt == "json":
        rows = [{**n.__dict__, "usd_per_hour": prices.get(n.instance_id)} for n in nodes]
        click.echo(json.dumps({"name": name, "nodes": rows, "cost_so_far_usd": cost}, default=str,
                              indent=2))
        return
    table = Table("node", "instance", "state", "private", "public", "market", "$/h", "uptime",
                  title=f"cluster {name}")
    for n in nodes:
        price = prices.get(n.instance_id)
        table.add_row(str(n.index), n.instance_id, n.state, n.private_ip or "-", n.public_ip or "-",
                      n.lifecycle, "-" if price is None else f"{price:.4g}", _uptime(n.launch_time))
    # Piped, rich would fit the table to 80 columns and cut instance ids and addresses: give it room
    # instead.
    Console(width=None if sys.stdout.isatty() else 200).print(table)
    click.echo(f"cost so far: {'unknown' if cost is None else f'${cost:.2f}'}")


@cluster.command("list")
@region_option
def list_clusters(region: str | None, endpoint_url: str | None, profile: str | None) -> None:
    """Clusters with live instances in the region, and local records (counted where each was
    made)."""
    local = {p.name for p in state.clusters_dir().glob("*") if (p / "record.json").exists()}
    places = {connect(Place(region, endpoint_url, profile)).place}
    places |= {r.place for r in map(load_record, sorted(local)) if r is not None}
    live = [n for place in places for n in connect(place).tagged()]
    names = Counter(n.cluster for n in live if n.cluster)
    for cluster_name in sorted(set(names) | local):
        note = "" if cluster_name in local else "  (no local record)"
        click.echo(f"{cluster_name}\t{names.get(cluster_name, 0)} live instance(s){note}")
