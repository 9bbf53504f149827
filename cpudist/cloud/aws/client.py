"""The one EC2 client factory and the one retry helper (the one wait helper is cpudist/waits.py)."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

import boto3
import botocore.exceptions
from botocore.config import Config
from botocore.parsers import ResponseParserError

from cpudist.cloud.aws.errors import AwsBadInput, translate
from cpudist.errors import BadInput

T = TypeVar("T")
RETRIED_CODES = frozenset({"RequestLimitExceeded", "Throttling", "ThrottlingException"})
# EC2 is eventually consistent: an instance RunInstances just made can be unknown to the next call that
# names it (CreateTags, TerminateInstances) for a few seconds. Retried only where the id came from AWS.
NOT_YET_VISIBLE = frozenset({"InvalidInstanceID.NotFound"})
CHECK_AWS = "Check the AWS console or `cpudist cluster status`, then retry"  # what to do when a wait times out


def ec2_client(region: str, endpoint_url: str | None = None, profile: str | None = None) -> Any:
    """An EC2 client. The endpoint comes from `endpoint_url`, else boto3's own settings
    (AWS_ENDPOINT_URL_EC2, AWS_ENDPOINT_URL, profiles), else AWS."""
    session = boto3.Session(profile_name=profile, region_name=region)
    custom = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_EC2") or os.environ.get("AWS_ENDPOINT_URL")
    if not custom and region not in session.get_available_regions("ec2"):
        raise BadInput(f"unknown AWS region '{region}'", "Pick one from `aws ec2 describe-regions`, e.g. us-east-1")
    # No botocore retries (total_max_attempts counts the first try; max_attempts=1 would still retry
    # once): throttling is retried with backoff in `call`, everything else fails at once.
    config = Config(retries={"total_max_attempts": 1, "mode": "standard"}, connect_timeout=10, read_timeout=60)
    return session.client("ec2", endpoint_url=endpoint_url, config=config)


def ssm_client(region: str, endpoint_url: str | None = None, profile: str | None = None) -> Any:
    """An SSM client (public parameters: the current Ubuntu AMI), with the EC2 client's endpoint rules."""
    session = boto3.Session(profile_name=profile, region_name=region)
    config = Config(retries={"total_max_attempts": 1, "mode": "standard"}, connect_timeout=10, read_timeout=60)
    return session.client("ssm", endpoint_url=endpoint_url, config=config)


def call(fn: Callable[..., T], attempts: int = 6, base_delay: float = 0.5, also_retry: frozenset[str] = frozenset(),
         **kwargs: Any) -> T:
    """Call one EC2 API; throttling (and the `also_retry` codes) is retried with jittered exponential backoff,
    errors translated."""
    for attempt in range(attempts):
        try:
            reply = fn(**kwargs)
            if isinstance(reply, dict) and not reply.get("ResponseMetadata", {}).get("RequestId"):
                # Every EC2 answer carries a request id; an HTML page or another API parses to nothing.
                raise AwsBadInput("the endpoint did not answer like EC2 (no request id in its answer)",
                                  "Check --endpoint-url (AWS_ENDPOINT_URL): it must be an EC2 API endpoint",
                                  "NotEC2")
            return reply
        except botocore.exceptions.ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            if (code in RETRIED_CODES or code in also_retry) and attempt < attempts - 1:
                time.sleep(base_delay * 2**attempt * (0.5 + random.random()))
                continue
            raise translate(e) from None
        except (botocore.exceptions.BotoCoreError, ResponseParserError) as e:
            raise translate(e) from None
    raise AssertionError("unreachable")
