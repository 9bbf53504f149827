"""`cpudist ami build`: a node image with this cpudist inside (see ami/README.md)."""

from __future__ import annotations

import sys

import click

from cpudist.cli.cluster import _caller_cidr, _name, region_option, say
from cpudist.cloud.aws.client import ec2_client, ssm_client
from cpudist.errors import BadInput, CpudistError
from cpudist.images import BAKE_MINUTES, BakeSpec, bake, ubuntu_image
from cpudist.validate import check_ssh_cidr


@click.group()
def ami() -> None:
    """Images for cluster nodes."""


@ami.command()
@click.option("--name", default="cpudist-base", show_default=True, callback=_name, help="Name of the new AMI.")
@click.option("--base-image", help="AMI to start from [default: the current Ubuntu 24.04 LTS, from SSM].")
@region_option
@click.option("--instance-type", default="c6i.large", show_default=True)
@click.option("--subnet")
@click.option("--ssh-cidr", help="Who may SSH to the builder to upload cpudist [default: your address/32].")
@click.option("--user", default="ubuntu", show_default=True, help="Login name of the base image.")
@click.option("--connect", type=click.Choice(["public", "private"]), default="public", show_default=True)
@click.option("--timeout", type=click.FloatRange(min=1), default=3600, show_default=True)
@click.option("--yes", is_flag=True, help="Do not ask before spending money.")
def build(name: str, base_image: str | None, region: str, endpoint_url: str | None, instance_type: str,
          subnet: str | None, ssh_cidr: str | None, user: str, connect: str, timeout: float, yes: bool) -> None:
    """Bake an AMI: a builder runs ami/bootstrap.sh with this cpudist's wheel, powers off, is imaged."""
    cidr = check_ssh_cidr(ssh_cidr) if ssh_cidr else _caller_cidr()
    ec2 = ec2_client(region, endpoint_url)
    base = base_image or ubuntu_image(ssm_client(region, endpoint_url))
    say(f"building {name} from {base} on a {instance_type} (about {BAKE_MINUTES} min); it powers off when done")
    if not yes:
        if not sys.stdin.isatty():
            raise BadInput("not asking for confirmation without a terminal", "Pass --yes to go ahead")
        click.confirm("Build the image?", abort=True, err=True)
    try:
        image = bake(ec2, BakeSpec(name, base, instance_type, subnet, cidr, user, connect, timeout), say)
    except KeyboardInterrupt:
        raise CpudistError("interrupted: the builder and everything it used were removed") from None
    click.echo(image)
