"""EC2 emulated by moto's server over HTTP (tests/harness/ec2.py), for the files that drive `cpudist
cluster` against it without a world of namespace hosts (test_aws.py, test_aws_ownership.py).

One emulator per worker session serves them all: each test gets it reset (moto's state, faults,
delays, recorded calls) and instant, consistent EC2 again, whatever the test before it set.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from tests.harness.ec2 import FAKE_CREDENTIALS, Emulator


@pytest.fixture(scope="session")
def ec2_server() -> Iterator[Emulator]:
    os.environ.update(FAKE_CREDENTIALS)
    emu = Emulator().start()
    yield emu
    emu.stop()


@pytest.fixture
def emu(ec2_server: Emulator) -> Emulator:
    ec2_server.reset()
    # what a test may have set: instant, consistent EC2
    ec2_server.pending_s = ec2_server.unseen_s = 0.0
    return ec2_server


@pytest.fixture
def ec2(emu: Emulator) -> Any:
    return boto3.client("ec2", endpoint_url=emu.url, region_name="us-east-1")


@pytest.fixture(scope="session")
def stock_ami(ec2_server: Emulator) -> str:
    """One of moto's stock Amazon images: their ids are fixed, a reset keeps them. Listed once: the
    listing of every Amazon image costs the emulator 1.7 CPU-s, more than a whole `cluster up` in
    this process."""
    ec2 = boto3.client("ec2", endpoint_url=ec2_server.url, region_name="us-east-1")
    return str(ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"])


@pytest.fixture
def ami(ec2: Any, stock_ami: str) -> str:
    # still there after the reset
    assert len(ec2.describe_images(ImageIds=[stock_ami])["Images"]) == 1
    return stock_ami
