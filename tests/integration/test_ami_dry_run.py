"""`cpudist ami build --dry-run` against EC2 emulated by moto's server over HTTP: it says what a
bake would make and what it would cost, and makes nothing (no instance, image, group or key pair;
only read calls reach EC2; no wheel is built and no image folder written)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from cpudist.cloud.aws.provider import UBUNTU_PARAMETER
from tests.harness.ec2 import FAKE_CREDENTIALS, Emulator

CPUDIST = [sys.executable, "-m", "cpudist.cli"]


@pytest.fixture(scope="module")
def server() -> Iterator[Emulator]:
    os.environ.update(FAKE_CREDENTIALS)
    emu = Emulator().start()
    yield emu
    emu.stop()


def made(ec2: Any) -> dict[str, list[str]]:
    """Everything a bake could leave in EC2 (the default security group aside)."""
    return {"instances": [i["InstanceId"] for r in ec2.describe_instances()["Reservations"]
                          for i in r["Instances"]],
            "images": [i["ImageId"] for i in ec2.describe_images(Owners=["self"])["Images"]],
            "groups": [g["GroupId"] for g in ec2.describe_security_groups()["SecurityGroups"]
                       if g["GroupName"] != "default"],
            "keys": [k["KeyName"] for k in ec2.describe_key_pairs()["KeyPairs"]]}


@pytest.mark.parametrize("base", [None, "given"], ids=["ubuntu-from-ssm", "base-image"])
def test_dry_run_says_what_it_would_make_and_makes_nothing(server: Emulator, tmp_path: Path,
                                                           base: str | None) -> None:
    server.reset()
    ec2 = boto3.client("ec2", endpoint_url=server.url, region_name="us-east-1")
    ubuntu = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    server.ssm_parameters[UBUNTU_PARAMETER] = ubuntu
    before, home = made(ec2), tmp_path / "cpudist-home"
    server.calls.clear()
    # --yes and a short --timeout: a dry run that went ahead would fail fast here instead of waiting
    # on SSH.
    r = subprocess.run([*CPUDIST, "ami", "build", "--name", "dry-base", "--ssh-cidr",
                        "203.0.113.7/32", "--yes", "--timeout", "5", "--instance-type", "c6i.large",
                        "--dry-run", *(["--base-image", ubuntu] if base else [])],
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                       env={**os.environ, **FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": server.url,
                            "HOME": str(tmp_path / "home"), "CPUDIST_HOME": str(home)})
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""  # no image id: nothing was made
    assert f"building dry-base from {ubuntu} on a c6i.large" in r.stderr
    assert "would make a key pair and a security group (SSH from 203.0.113.7/32) " \
           "for the builder, launch one on-demand c6i.large (about $" in r.stderr
    assert "image it as dry-base, then remove the builder, its key pair and its group" in r.stderr
    assert made(ec2) == before == {"instances": [], "images": [], "groups": [], "keys": []}
    writes = [c for c in server.calls if not c.startswith(("Describe", "Get"))]
    assert writes == [], f"a dry run called {writes}"
    assert not (home / "images").exists() and not (home / "wheels").exists()
