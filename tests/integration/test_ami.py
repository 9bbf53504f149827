"""`cpudist ami build` and the default image of `cluster up`, from the laptop of the AWS-shaped
world.

The builder is a namespace host that the EC2 emulator boots; it plays ami/bootstrap.sh's contract
(tests/harness/world.py `_bootstrap`): it waits for the wheel the CLI uploads over SSH, checks it is
a cpudist wheel with the recipe inside, prints the bootstrap's last console line and powers off.
What the script itself installs is checked by tests/unit/test_ami_recipe.py.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from cpudist import __version__
from cpudist.cloud.aws.provider import UBUNTU_PARAMETER
from tests.harness.ec2 import FAKE_CREDENTIALS, Emulator
from tests.harness.netns import missing_requirements
from tests.harness.world import World

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(missing_requirements() is not None,
                                 reason=str(missing_requirements()))]
CPUDIST = [sys.executable, "-m", "cpudist.cli"]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    w = World(3, tmp_path_factory.mktemp("world"), prefix=f"cpa{os.getpid() % 10000}")
    w.up()
    try:
        yield w
    finally:
        w.down()


@pytest.fixture(scope="module")
def server(world: World) -> Iterator[Emulator]:
    os.environ.update(FAKE_CREDENTIALS)
    emu = Emulator().start()
    world.attach(emu)
    yield emu
    emu.stop()


@pytest.fixture
def cloud(world: World, server: Emulator) -> dict[str, Any]:
    server.reset()
    server.bootstrap_fails_at = None
    world.sync()
    ec2 = boto3.client("ec2", endpoint_url=server.url, region_name="us-east-1")
    _, subnet = world.create_vpc(ec2)
    ubuntu = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    server.ssm_parameters[UBUNTU_PARAMETER] = ubuntu
    return {"ec2": ec2, "subnet": subnet, "ubuntu": ubuntu,
            "env": {**FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": server.url}}


def laptop(world: World, cloud: dict[str, Any], *args: str) -> Any:
    return world.operator_run([*CPUDIST, *args], env=cloud["env"], timeout=300)


def left_over(ec2: Any) -> dict[str, list[str]]:
    live = [i["InstanceId"] for r in ec2.describe_instances()["Reservations"]
            for i in r["Instances"]
            if i["State"]["Name"] != "terminated"]
    groups = [g["GroupName"] for g in ec2.describe_security_groups()["SecurityGroups"]
              if g["GroupName"] != "default"]
    return {"instances": live, "groups": groups,
            "keys": [k["KeyName"] for k in ec2.describe_key_pairs()["KeyPairs"]]}


def build(world: World, cloud: dict[str, Any], *extra: str) -> Any:
    return laptop(world, cloud, "ami", "build", "--subnet", cloud["subnet"], "--ssh-cidr",
                  world.ssh_cidr, "--user", "root", "--yes", "--timeout", "120", *extra)


def test_build_uploads_this_cpudist_and_images_the_builder(world: World,
                                                           cloud: dict[str, Any]) -> None:
    r = build(world, cloud)
    assert r.returncode == 0, r.stderr
    image = cloud["ec2"].describe_images(ImageIds=[r.stdout.strip()])["Images"][0]
    tags = {t["Key"]: t["Value"] for t in image["Tags"]}
    assert tags["cpudist:version"] == __version__ and tags["cpudist:image"] == "base"
    assert image["Name"] == "cpudist-base"
    builder = next(i for r in cloud["ec2"].describe_instances()["Reservations"]
                   for i in r["Instances"])
    # the SSM parameter's Ubuntu, since no --base-image
    assert builder["ImageId"] == cloud["ubuntu"]
    assert left_over(cloud["ec2"]) == {"instances": [], "groups": [], "keys": []}
    assert not world.operator_path(".cpudist/images/cpudist-base").exists()


def test_a_failing_bootstrap_step_is_shown_and_leaves_nothing(world: World, cloud: dict[str, Any],
                                                              server: Emulator) -> None:
    server.bootstrap_fails_at = "torch"
    r = build(world, cloud)
    assert r.returncode == 1 and "the image bootstrap failed at step torch" in r.stderr, r.stderr
    assert cloud["ec2"].describe_images(Owners=["self"])["Images"] == []
    assert left_over(cloud["ec2"]) == {"instances": [], "groups": [], "keys": []}


def test_cluster_up_without_an_image_builds_one_then_reuses_it(world: World,
                                                               cloud: dict[str, Any]) -> None:
    up = ["cluster", "up", "--name", "img", "--nodes", "2", "--subnet", cloud["subnet"],
          "--ssh-cidr",
          world.ssh_cidr, "--user", "root", "--yes", "--no-ssh", "--instance-type", "c6i.large"]
    first = laptop(world, cloud, *up)
    assert first.returncode == 0, first.stderr
    assert f"no image for cpudist {__version__} yet: building one first" in first.stderr
    images = cloud["ec2"].describe_images(Owners=["self"])["Images"]
    assert len(images) == 1
    nodes = [i for r in cloud["ec2"].describe_instances()["Reservations"] for i in r["Instances"]
             if i["State"]["Name"] == "running"]
    assert len(nodes) == 2 and {i["ImageId"] for i in nodes} == {images[0]["ImageId"]}
    assert laptop(world, cloud, "cluster", "down", "--name", "img", "--yes",
                  "--keep-image").returncode == 0
    again = laptop(world, cloud, *up)
    assert (again.returncode == 0
            and f"image: {images[0]['ImageId']}, the newest built" in again.stderr)
    assert len(cloud["ec2"].describe_images(Owners=["self"])["Images"]) == 1
    assert laptop(world, cloud, "cluster", "down", "--name", "img", "--yes").returncode == 0
