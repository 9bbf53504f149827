"""`cluster down` on the head of the cluster it would remove, in the AWS-shaped world
(tests/harness/world.py).

The head is a namespace host that reaches the EC2 API (forwarded to its loopback, as a node reaches
AWS's endpoint) and a metadata service on its own loopback that says which instance it is
(tests/harness/imds.py), as 169.254.169.254 does on EC2. From there, `down` would terminate the
machine it runs on before it could remove the group and the key; it refuses in one line instead, and
the laptop's `down` then leaves nothing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from tests.harness.ec2 import FAKE_CREDENTIALS, Emulator
from tests.harness.imds import ImdsServer
from tests.harness.netns import missing_requirements
from tests.harness.world import World

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(missing_requirements() is not None,
                                 reason=str(missing_requirements()))]
CPUDIST = [sys.executable, "-m", "cpudist.cli"]
NAME = "inside"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    w = World(2, tmp_path_factory.mktemp("world"), prefix=f"cpi{os.getpid() % 10000}")
    w.up()
    try:
        yield w
    finally:
        w.down()


@pytest.fixture(scope="module")
def cloud(world: World) -> Iterator[dict[str, Any]]:
    os.environ.update(FAKE_CREDENTIALS)
    emu = Emulator().start()
    emu.reset()
    world.attach(emu)
    world.forward(int(emu.url.rsplit(":", 1)[1]), host=0)  # the head reaches the EC2 API too
    ec2 = boto3.client("ec2", endpoint_url=emu.url, region_name="us-east-1")
    _, subnet = world.create_vpc(ec2)
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    try:
        yield {"emu": emu, "ec2": ec2, "subnet": subnet, "ami": ami,
               "env": {**FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": emu.url}}
    finally:
        emu.stop()


def laptop(world: World, cloud: dict[str, Any], *args: str) -> Any:
    return world.operator_run([*CPUDIST, *args], env=cloud["env"], timeout=300)


def left(ec2: Any) -> dict[str, list[str]]:
    """The cluster's live instances, its group and its key pair."""
    res = ec2.describe_instances(Filters=[{"Name": "tag:cpudist:cluster",
                                           "Values": [NAME]}])["Reservations"]
    return {"instances": sorted(i["InstanceId"] for r in res for i in r["Instances"]
                                if i["State"]["Name"] != "terminated"),
            "groups": [g["GroupId"] for g in ec2.describe_security_groups()["SecurityGroups"]
                       if g["GroupName"] == f"cpudist-{NAME}"],
            "keys": [k["KeyName"] for k in ec2.describe_key_pairs()["KeyPairs"]]}


def test_down_from_the_head_refuses_in_one_line_and_removes_nothing(world: World,
                                                                    cloud: dict[str, Any]) -> None:
    up = laptop(world, cloud, "cluster", "up", "--name", NAME, "--nodes", "2", "--image",
                cloud["ami"], "--subnet", cloud["subnet"], "--ssh-cidr", world.ssh_cidr, "--yes",
                "--no-ssh", "--instance-type", "c6i.large")
    assert up.returncode == 0, up.stderr
    before = left(cloud["ec2"])
    res = cloud["ec2"].describe_instances(Filters=[{"Name": "private-ip-address",
                                                    "Values": [world.hosts.private_addr(0)]},
                                                   {"Name": "instance-state-name",
                                                    "Values": ["running"]}])
    head = res["Reservations"][0]["Instances"][0]["InstanceId"]
    # `--no-ssh` returns while the machines still boot; the user logs in once the head answers
    world.wait_booted(0)
    # on the head's own loopback
    imds = world.made_in(0, lambda: ImdsServer("127.0.0.1", 0)).start()
    imds.identify(head)
    env = {k: v for k, v in os.environ.items() if k != "CPUDIST_HOME"}  # the head's own ~/.cpudist
    try:
        down = world.hosts.run(0,
                               [*CPUDIST, "cluster", "down", "--name", NAME, "--yes",
                                "--endpoint-url", cloud["emu"].url, "--imds-endpoint", imds.url],
                               env={**env, **FAKE_CREDENTIALS}, timeout=300)
    finally:
        imds.stop()
    last = down.stderr.strip().splitlines()[-1]
    assert down.returncode == 2 and last.startswith("Error: this machine is " + head), down.stderr
    assert f"Run `cpudist cluster down --name {NAME}` from a machine outside the cluster" in last
    assert "Traceback" not in down.stderr
    assert left(cloud["ec2"]) == before and len(before["instances"]) == 2  # the head still runs
    assert world.power.on_for.get(0) == head

    # from outside: everything
    gone = laptop(world, cloud, "cluster", "down", "--name", NAME, "--yes")
    assert gone.returncode == 0, gone.stderr
    assert left(cloud["ec2"]) == {"instances": [], "groups": [], "keys": []}
    assert not world.operator_path(f".cpudist/clusters/{NAME}").exists()
