"""Checks of user input that many commands share: each returns the value or raises a one-line
BadInput."""

from __future__ import annotations

import ipaddress
import urllib.parse

from cpudist.errors import BadInput

MIN_PREFIX = {4: 16, 6: 48}  # wider than this admits a whole provider's worth of addresses to SSH


def check_ssh_cidr(value: str, allow_anywhere: bool = False) -> str:
    """A CIDR narrow enough to let SSH in from (unless the user says anywhere is fine)."""
    try:
        net = ipaddress.ip_network(value.strip(), strict=False)
    except ValueError:
        raise BadInput(f"--ssh-cidr {value!r} is not an address range",
                       "Write it as ADDRESS/PREFIX, "
                       "e.g. 203.0.113.7/32 (your public address)") from None
    if net.prefixlen < MIN_PREFIX[net.version] and not allow_anywhere:
        raise BadInput(f"--ssh-cidr {net} would let SSH in from {net.num_addresses:,} addresses",
                       f"Use your own address (/32) or at most a /{MIN_PREFIX[net.version]}, or "
                       "pass --allow-ssh-from-anywhere if you really mean it")
    return str(net)


def check_endpoint_url(value: str) -> str:
    """An http(s) URL with a host, as boto3 needs for endpoint_url."""
    parts = urllib.parse.urlparse(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadInput(f"--endpoint-url {value!r} is not an http(s) URL",
                       "Write it like https://ec2.us-east-1.amazonaws.com or http://127.0.0.1:5000")
    return value


def check_imds(value: str) -> str:
    """auto, off, or the http URL of an instance metadata service."""
    if value in ("auto", "off"):
        return value
    parts = urllib.parse.urlparse(value)
    if parts.scheme != "http" or not parts.hostname:
        raise BadInput(f"--imds-endpoint {value!r} is not auto, off or an http URL",
                       "AWS's is http://169.254.169.254 (what auto uses on EC2)")
    return value.rstrip("/")
