"""End to end without AWS: `cluster up` -> `cpudist run` -> `cluster down`, real except the EC2 API.

moto's VPC uses the namespace cluster's 198.18.0.0/24, so launched instances get the addresses of
real namespace hosts with sshd; the emulator plays cloud-init by installing the key pair on the
host that owns each new instance's address. The test process is a bastion inside the "VPC"
(joined to the hosts' bridge) and connects by private address.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from tests.harness.ec2 import FAKE_CREDENTIALS, Emulator
from tests.harness.netns import NetnsCluster, missing_requirements

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(missing_requirements() is not None, reason=str(missing_requirements()))]
CPUDIST = [sys.executable, "-m", "cpudist.cli"]


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsCluster]:
    # moto hands out a subnet's addresses from .4 up: the hosts sit exactly there.
    c = NetnsCluster(4, tmp_path_factory.mktemp("vpc"), prefix=f"cpe{os.getpid() % 10000}", base=4,
                     gateway="198.18.0.1")
    c.up()
    try:
        yield c
    finally:
        c.down()


@pytest.fixture(scope="module")
def emulator(hosts: NetnsCluster) -> Iterator[Emulator]:
    def cloud_init(address: str, public_key: str) -> None:
        i = next(i for i in range(hosts.n) if hosts.addr(i) == address)
        with (hosts.node_dir(i) / "dot-ssh" / "authorized_keys").open("a") as f:
            f.write(public_key + "\n")

    os.environ.update(FAKE_CREDENTIALS)
    emu = Emulator(on_key_installed=cloud_init).start()
    emu.reset()
    yield emu
    emu.stop()


def test_cluster_up_run_down(hosts: NetnsCluster, emulator: Emulator, shared_data: Path, tmp_path: Path) -> None:
    ec2 = boto3.client("ec2", endpoint_url=emulator.url, region_name="us-east-1")
    vpc = ec2.create_vpc(CidrBlock="198.18.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="198.18.0.0/24")["Subnet"]["SubnetId"]
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    env = {**os.environ, **FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": emulator.url, "HOME": str(tmp_path / "bastion"),
           "CPUDIST_HOME": str(tmp_path / "cpudist-home")}

    def cpudist(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CPUDIST, *args], capture_output=True, text=True, timeout=600, env=env,
                              stdin=subprocess.DEVNULL)

    up = cpudist("cluster", "up", "--name", "e2e", "--nodes", "4", "--image", ami, "--subnet", subnet,
                 "--connect", "private", "--user", "root", "--ssh-cidr", "198.18.0.0/24", "--yes",
                 "--instance-type", "c6i.large", "--boot-timeout", "60")
    assert up.returncode == 0, up.stderr
    addresses = up.stdout.split()
    assert addresses == [hosts.addr(i) for i in range(4)]
    hostfile = tmp_path / "cpudist-home" / "clusters" / "e2e" / "hostfile"
    assert hostfile.read_text().split() == addresses

    run = hosts.run(0, [*CPUDIST, "run", "mrpc", "--np", "4", "--ppn", "1", "--cluster", "e2e",
                        "--data-dir", str(shared_data / "glue" / "MRPC"), "--model", "tiny", "--max-steps", "3",
                        "--max-eval-samples", "64", "--output-dir", str(tmp_path / "run")],
                    env={**env, "HOME": "/root"})  # the head's own home: its cluster key from ssh-setup
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert sorted(result["nodes"]) == sorted(hosts.name(i) for i in range(4))
    assert result["cluster"] == "e2e" and result["usd_per_hour"] > 0  # the cluster's price, 4 nodes
    report = cpudist("report", "--format", "json", str(tmp_path / "run"))
    assert report.returncode == 0 and json.loads(report.stdout)[0]["cost_usd"] > 0

    down = cpudist("cluster", "down", "--name", "e2e")
    assert down.returncode == 0, down.stderr
    tagged = ec2.describe_instances(Filters=[{"Name": "tag:cpudist:cluster", "Values": ["e2e"]}])["Reservations"]
    assert all(i["State"]["Name"] == "terminated" for r in tagged for i in r["Instances"])
    assert [g for g in ec2.describe_security_groups()["SecurityGroups"] if g["GroupName"] == "cpudist-e2e"] == []
    assert ec2.describe_key_pairs()["KeyPairs"] == [] and ec2.describe_placement_groups()["PlacementGroups"] == []
