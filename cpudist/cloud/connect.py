"""The one door from cli/ and run/ to a cloud: a provider for a place, an object store for a URL.

AWS is the one cloud; a second would be one folder beside cloud/aws implementing cloud/provider.py's
verbs and cpudist/objects.py's store, chosen here. Imports are lazy: boto3 loads only when a command
uses it.
"""

from __future__ import annotations

from cpudist.cloud.provider import Place, Provider
from cpudist.objects import ObjectStore


def connect(place: Place) -> Provider:
    """The provider for `place` (region, endpoint and profile resolved: `provider.place` is what to
    record)."""
    from cpudist.cloud.aws.provider import Ec2

    return Ec2.connect(place)


def check_store_url(url: str) -> str:
    """`url` if it names an object store location (s3://bucket[/prefix]); BadInput saying what one
    looks like."""
    from cpudist.cloud.aws.objects import parse_s3_url

    parse_s3_url(url)
    return url


def open_store(url: str) -> ObjectStore:
    """The object store at `url` (s3://bucket[/prefix]), with this machine's credentials."""
    from cpudist.cloud.aws.objects import S3Objects

    return S3Objects(url)
