"""The one EC2 client factory and the one retry helper (the one wait helper is cpudist/waits.py)."""

from __future__ import annotations

import math
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import boto3
import botocore.exceptions
import botocore.session
from botocore.config import Config
from botocore.parsers import ResponseParserError

from cpudist.cloud.aws.errors import AwsBadInput, translate
from cpudist.cloud.provider import Place
from cpudist.errors import BadInput
from cpudist.validate import check_endpoint_url
from cpudist.waits import TimedOut

T = TypeVar("T")
DEFAULT_REGION = "us-east-1"
# EC2 is eventually consistent: an instance RunInstances just made can be unknown to the next call
# that names it (CreateTags, TerminateInstances) for a few seconds. Retried only where the id came
# from AWS.
NOT_YET_VISIBLE = frozenset({"InvalidInstanceID.NotFound"})
# The same for a security group CreateSecurityGroup just made: RunInstances may not know it yet.
GROUP_NOT_YET_VISIBLE = frozenset({"InvalidGroup.NotFound"})
# what to do when a wait times out
CHECK_AWS = "Check the AWS console or `cpudist cluster status`, then retry"
# boto3's waiters poll every 15 s by default: a cluster's boot would wait up to 15 s too long
WAITER_DELAY_S = 2.0


def resolve(place: Place) -> Place:
    """The place as this environment fills it in: the region (given, else the profile's or
    AWS_DEFAULT_REGION, else us-east-1), a custom endpoint (given, else
    AWS_ENDPOINT_URL_EC2/AWS_ENDPOINT_URL; None is AWS itself) and the profile (given, else
    AWS_PROFILE). A cluster's record keeps it; `pinned` makes later clients ignore what the
    environment says by then."""
    profile = place.profile or (None if place.pinned else os.environ.get("AWS_PROFILE")) or None
    try:
        session = _session(Place(place.region, None, profile, place.pinned))
    except botocore.exceptions.ProfileNotFound:
        raise AwsBadInput(f"AWS profile '{profile}' not found",
                          "Check --profile (AWS_PROFILE) against `aws configure "
                          "list-profiles`", "ProfileNotFound") from None
    region = place.region or session.region_name or DEFAULT_REGION
    endpoint = place.endpoint_url
    if endpoint is None and not place.pinned:
        for var in ("AWS_ENDPOINT_URL_EC2", "AWS_ENDPOINT_URL"):
            if os.environ.get(var):
                try:
                    endpoint = check_endpoint_url(os.environ[var])
                except BadInput as e:
                    raise BadInput(f"{var}: {e.what}",
                                   "Set it to an http(s) URL, or unset it for AWS itself") from None
                break
    return Place(region, endpoint, profile, pinned=True)


def _session(place: Place) -> boto3.Session:
    """boto3's session for `place`: its profile; with none, a pinned place (a cluster's record)
    keeps to the default chain as it was when the record was made, whatever AWS_PROFILE (or
    AWS_DEFAULT_PROFILE) says by now. A later AWS_PROFILE is for other work (another account,
    often): followed, `cluster down` would look for the nodes there, find none and forget a cluster
    that still runs (as the recorded region and endpoint outweigh the environment's)."""
    if place.profile is None and place.pinned:
        # no env var names it
        core = botocore.session.Session(session_vars={"profile": (None, None, None, None)})
        return boto3.Session(botocore_session=core, region_name=place.region)
    return boto3.Session(profile_name=place.profile, region_name=place.region)


def _client(service: str, place: Place) -> Any:
    place = resolve(place)
    session = _session(place)
    if not place.endpoint_url and place.region not in session.get_available_regions("ec2"):
        raise BadInput(f"unknown AWS region '{place.region}'",
                       "Pick one from `aws ec2 describe-regions`, e.g. us-east-1")
    # Throttling and transient faults (5xx, lost connections) are retried by botocore's standard
    # mode, with its backoff and retry quota; AWS_MAX_ATTEMPTS / the profile's max_attempts still
    # apply. A resolved place names its endpoint itself: the environment's AWS_ENDPOINT_URL no
    # longer counts (a recorded cluster stays where it was made).
    config = Config(retries={"mode": "standard"}, connect_timeout=10, read_timeout=60,
                    ignore_configured_endpoint_urls=True)
    return session.client(service, endpoint_url=place.endpoint_url, config=config)


def ec2_client(place: Place) -> Any:
    """An EC2 client for `place` (see `resolve`)."""
    return _client("ec2", place)


def ssm_client(place: Place) -> Any:
    """An SSM client (public parameters: the current Ubuntu AMI), with the EC2 client's endpoint
    rules."""
    return _client("ssm", place)


def call(fn: Callable[..., T], attempts: int = 6, base_delay: float = 0.5,
         also_retry: frozenset[str] = frozenset(), **kwargs: Any) -> T:
    """Call one EC2 API, errors translated. Throttling and faults are botocore's to retry (the
    client's retry mode); the `also_retry` codes (EC2's eventual consistency, which botocore does
    not know) are retried here with jittered exponential backoff."""
    for attempt in range(attempts):
        try:
            reply = fn(**kwargs)
            if isinstance(reply, dict) and not reply.get("ResponseMetadata", {}).get("RequestId"):
                # Every EC2 answer carries a request id; an HTML page or another API parses to
                # nothing.
                raise AwsBadInput("the endpoint did not answer like EC2 (no request id in its "
                                  "answer)",
                                  "Check --endpoint-url (AWS_ENDPOINT_URL): it must be an EC2 API "
                                  "endpoint",
                                  "NotEC2")
            return reply
        except botocore.exceptions.ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            if code in also_retry and attempt < attempts - 1:
                time.sleep(base_delay * 2**attempt * (0.5 + random.random()))
                continue
            raise translate(e) from None
        except (botocore.exceptions.BotoCoreError, ResponseParserError) as e:
            raise translate(e) from None
    raise AssertionError("unreachable")


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """Stop signals that arrive in the block are delivered when it ends (to the handlers in place
    before it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    heeded = [sig for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
              if signal.getsignal(sig) != signal.SIG_IGN]
    previous = {sig: signal.signal(sig, lambda signum, frame: arrived.append(signum))
                for sig in heeded}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for signum in dict.fromkeys(arrived):  # also when the call failed: the signal is not lost
            signal.raise_signal(signum)


def create(fn: Callable[..., T], **kwargs: Any) -> T:
    """A call that makes something (`call` otherwise): its answer is awaited even when a signal
    arrives meanwhile, so what it made is known (or findable by its tags) before the signal's
    rollback runs."""
    with _signals_deferred():
        return call(fn, **kwargs)


def wait_for(client: Any, waiter: str, what: str, timeout_s: float, **kwargs: Any) -> bool:
    """Run boto3's waiter `waiter` (EC2's own success and failure states) for up to `timeout_s`:
    True when it succeeded, False when it reached a failure state; TimedOut naming `what` when time
    ran out."""
    attempts = max(1, math.ceil(timeout_s / WAITER_DELAY_S))
    try:
        client.get_waiter(waiter).wait(WaiterConfig={"Delay": WAITER_DELAY_S,
                                                     "MaxAttempts": attempts}, **kwargs)
    except botocore.exceptions.WaiterError as e:
        if "Max attempts exceeded" in str(e):
            raise TimedOut(f"timed out after {timeout_s:g}s waiting for {what}",
                           CHECK_AWS) from None
        if e.last_response and "Error" in e.last_response:  # an AWS error, not a failure state
            raise translate(botocore.exceptions.ClientError(e.last_response, waiter)) from None
        return False
    except (botocore.exceptions.BotoCoreError, ResponseParserError) as e:
        raise translate(e) from None
    return True
