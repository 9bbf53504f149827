"""The options `cpudist cluster` and `cpudist ami` share: the cluster's name, where it lives
(region, endpoint, profile, checked against its record) and their checks."""

from __future__ import annotations

import urllib.request
from typing import Any

import click

from cpudist.cloud.provider import Place
from cpudist.cloud.record import ClusterRecord, load_record
from cpudist.errors import BadInput
from cpudist.state import check_cluster_name
from cpudist.validate import check_endpoint_url, check_imds


def say(text: str) -> None:
    click.echo(f"[cpudist] {text}", err=True)


def caller_cidr() -> str:
    """This machine's public address as a /32, for the SSH rule; no guess when it cannot be
    found."""
    try:
        with urllib.request.urlopen("https://checkip.amazonaws.com", timeout=3) as r:
            return r.read().decode().strip() + "/32"
    except OSError:
        raise BadInput("could not determine your public address for the SSH rule",
                       "Pass --ssh-cidr ADDRESS/32 (never 0.0.0.0/0)") from None


def name_callback(ctx: click.Context, param: click.Parameter, value: str) -> str:
    return check_cluster_name(value)


def endpoint_callback(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    return None if value is None else check_endpoint_url(value)


def imds_callback(ctx: click.Context, param: click.Parameter, value: str) -> str:
    return check_imds(value)


def max_price_callback(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A positive number of dollars (EC2 takes it as a string; 'abc' or -5 would fail only at
    launch)."""
    if value is None:
        return None
    try:
        ok = float(value) > 0
    except ValueError:
        ok = False
    if not ok:
        raise BadInput(f"--max-price {value!r} is not a positive price",
                       "Pass dollars per hour, e.g. --max-price 0.85")
    return value


name_option = click.option("--name", default="cpudist", show_default=True, callback=name_callback,
                           help="Cluster name: 1-40 of a-z, 0-9 and '-'.")


def region_option(f: Any) -> Any:
    f = click.option("--profile",
                     help="AWS profile [default: AWS_PROFILE, else boto3's default chain]; a "
                          "cluster's record keeps it (made with none: the default chain, whatever "
                          "AWS_PROFILE says later).")(f)
    f = click.option("--endpoint-url", callback=endpoint_callback,
                     help="EC2-compatible endpoint [default: boto3's settings, "
                          "AWS_ENDPOINT_URL(_EC2)].")(f)
    return click.option("--region",
                        help="AWS region [default: the profile's, AWS_DEFAULT_REGION, else "
                              "us-east-1]; a cluster's record keeps it.")(f)


def cluster_place(name: str, region: str | None, endpoint_url: str | None,
                  profile: str | None) -> Place:
    """Where cluster `name` lives: its record's region, endpoint and profile (whatever the
    environment says now), else the options'. An option that contradicts the record is refused."""
    record: ClusterRecord | None = load_record(name)
    if record is None:
        return Place(region, endpoint_url, profile)
    asked = {"--region": (region, record.region),
             "--endpoint-url": (endpoint_url, record.endpoint_url),
             "--profile": (profile, record.profile)}
    clash = [f"{opt} {given} (recorded: {kept or 'none'})" for opt, (given, kept) in asked.items()
             if given is not None and given != kept]
    if clash:
        raise BadInput(f"cluster {name} was made elsewhere: {', '.join(clash)}",
                       "Leave these options out (the record's are used), or pick another --name")
    return record.place
