"""`cpudist ami build`: a node image with this cpudist inside (see ami/README.md)."""

from __future__ import annotations

import sys

import click

from cpudist import state
from cpudist.cli.cluster_options import caller_cidr, name_callback, region_option, say
from cpudist.cloud.connect import connect as _connect
from cpudist.cloud.images import BAKE_MINUTES, BakeSpec, bake
from cpudist.cloud.provider import Place
from cpudist.errors import BadInput, CpudistError
from cpudist.run.remote import build_wheel
from cpudist.ssh.access import SshAccess
from cpudist.validate import check_ssh_cidr


@click.group()
def ami() -> None:
    """Images for cluster nodes."""


@ami.command()
@click.option("--name", default="cpudist-base", show_default=True, callback=name_callback,
              help="Name of the new AMI.")
@click.option("--base-image",
              help="AMI to start from [default: the current Ubuntu 24.04 LTS, from SSM].")
@region_option
@click.option("--instance-type", default="c6i.large", show_default=True,
              help="Instance type of the builder.")
@click.option("--subnet", help="Subnet of the builder [default: the default VPC's first].")
@click.option("--ssh-cidr",
              help="Who may SSH to the builder to upload cpudist [default: your address/32].")
@click.option("--user", default="ubuntu", show_default=True, help="Login name of the base image.")
@click.option("--connect", type=click.Choice(["public", "private"]), default="public",
              show_default=True,
              help="Reach the builder by public address, or private (from inside the VPC).")
@click.option("--timeout", type=click.FloatRange(min=1), default=3600, show_default=True,
              help="Seconds the whole bake may take before it is stopped and cleaned up.")
@click.option("--yes", is_flag=True, help="Do not ask before spending money.")
@click.option("--dry-run", is_flag=True,
              help="Show the base image, the builder, its price and the steps; make "
              "nothing.")
def build(name: str, base_image: str | None, region: str | None, endpoint_url: str | None,
          profile: str | None, instance_type: str, subnet: str | None, ssh_cidr: str | None,
          user: str, connect: str, timeout: float, yes: bool, dry_run: bool) -> None:
    """Bake an AMI: a builder runs ami/bootstrap.sh with this cpudist's wheel, powers off, is
    imaged."""
    cidr = check_ssh_cidr(ssh_cidr) if ssh_cidr else caller_cidr()
    cloud = _connect(Place(region, endpoint_url, profile))
    base = base_image or cloud.base_image()
    say(f"building {name} from {base} on a {instance_type} (about {BAKE_MINUTES} min); it powers "
        "off when done")
    if dry_run:
        price = cloud.on_demand(instance_type).usd_per_hour
        cost = "unknown" if price is None else f"about ${price * BAKE_MINUTES / 60:.2f}"
        say(f"would make a key pair and a security group (SSH from {cidr}) for the builder, launch "
            f"one on-demand {instance_type} ({cost}) that runs ami/bootstrap.sh with a wheel of "
            f"this cpudist, image it as {name}, then remove the builder, its key pair and its "
            "group")
        return
    if not yes:
        if not sys.stdin.isatty():
            raise BadInput("not asking for confirmation without a terminal",
                           "Pass --yes to go ahead")
        click.confirm("Build the image?", abort=True, err=True)
    try:
        image = bake(cloud,
                     BakeSpec(name=name, base_image=base, instance_type=instance_type,
                              subnet=subnet, ssh_cidr=cidr, user=user, connect=connect,
                              timeout_s=timeout),
                     build_wheel(state.wheels_dir()), SshAccess(), say)
    except KeyboardInterrupt:
        raise CpudistError("interrupted: the builder and everything it used were removed") from None
    click.echo(image)
