"""The test world behaves like AWS: security groups are the firewall, the laptop is not a node.

Needs root, iproute2, iptables and openssh-server (tests/harness/setup.sh installs them).
Dropped packets time out: every probe has a short timeout.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from tests.harness.ec2 import FAKE_CREDENTIALS, Emulator
from tests.harness.netns import missing_requirements
from tests.harness.world import World


def _missing() -> str | None:
    return missing_requirements() or (None if shutil.which("iptables-restore") else
                                      "iptables not installed (apt-get install iptables)")


pytestmark = [pytest.mark.slow, pytest.mark.skipif(_missing() is not None, reason=str(_missing()))]
KEY = "/srv/cpd-operator/.ssh/id_ed25519"  # as the operator sees it


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    w = World(3, tmp_path_factory.mktemp("world"), prefix=f"cpw{os.getpid() % 10000}")
    w.up()
    emu = Emulator().start()
    try:
        emu.reset()
        w.attach(emu)
        yield w
    finally:
        w.down()
        emu.stop()


@pytest.fixture(scope="module")
def ec2(world: World) -> Any:
    assert world.emulator is not None
    return boto3.client("ec2", endpoint_url=world.emulator.url, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing")


@pytest.fixture(scope="module")
def fleet(world: World, ec2: Any) -> dict[str, Any]:
    """Three instances in one group: SSH from the operator's /32, everything from the group itself."""
    r = world.operator_run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", KEY])
    assert r.returncode == 0, r.stderr
    ec2.import_key_pair(KeyName="laptop", PublicKeyMaterial=world.operator_path(".ssh/id_ed25519.pub").read_bytes())
    vpc, subnet = world.create_vpc(ec2)
    sg = ec2.create_security_group(GroupName="nodes", Description="n", VpcId=vpc)["GroupId"]
    ec2.authorize_security_group_ingress(GroupId=sg, IpPermissions=[ssh_rule(world.ssh_cidr), self_rule(sg)])
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ids = [i["InstanceId"] for i in ec2.run_instances(ImageId=ami, MinCount=3, MaxCount=3, SubnetId=subnet,
                                                       SecurityGroupIds=[sg], KeyName="laptop",
                                                       InstanceType="c6i.large")["Instances"]]
    return {"sg": sg, "ids": ids}


def ssh_rule(cidr: str) -> dict[str, Any]:
    return {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": cidr}]}


def self_rule(group: str) -> dict[str, Any]:
    return {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group}]}


def ssh_from_operator(world: World, address: str) -> str | None:
    """The remote hostname, or None when the connection fails."""
    r = world.operator_run(["ssh", "-i", KEY, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                            "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=2", "-o", "LogLevel=ERROR",
                            f"root@{address}", "hostname"], timeout=20)
    return r.stdout.strip() if r.returncode == 0 else None


def tcp_from_host(world: World, i: int, address: str, port: int = 22) -> bool:
    """Whether host i completes a TCP handshake with address:port within a second and a half."""
    r = world.hosts.run(i, ["timeout", "1.5", "bash", "-c", f"</dev/tcp/{address}/{port}"], timeout=10)
    return r.returncode == 0


def test_instances_get_the_hosts_addresses(world: World, ec2: Any, fleet: dict[str, Any]) -> None:
    found = {i["InstanceId"]: i for r in ec2.describe_instances(InstanceIds=fleet["ids"])["Reservations"]
             for i in r["Instances"]}
    got = [(found[i]["PrivateIpAddress"], found[i]["PublicIpAddress"]) for i in fleet["ids"]]
    assert got == [(world.hosts.private_addr(i), world.hosts.public_addr(i)) for i in range(3)]
    assert got[0] == ("198.18.0.4", "198.18.0.132")


def test_operator_reaches_nodes_by_public_address_only(world: World, fleet: dict[str, Any]) -> None:
    assert ssh_from_operator(world, world.hosts.public_addr(1)) == world.hosts.name(1)  # cloud-init's key
    assert ssh_from_operator(world, world.hosts.private_addr(1)) is None  # no route into the VPC


def test_operator_reaches_the_ec2_endpoint(world: World, fleet: dict[str, Any]) -> None:
    assert world.emulator is not None
    code = ("import boto3; c = boto3.client('ec2', region_name='us-east-1'); "
            "print(len(c.describe_instances()['Reservations']))")
    r = world.operator_run([sys.executable, "-c", code],
                           env={**FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": world.emulator.url}, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "1", r.stderr[-2000:]


def test_nodes_talk_over_private_addresses_only(world: World, fleet: dict[str, Any]) -> None:
    assert tcp_from_host(world, 0, world.hosts.private_addr(2))
    assert not tcp_from_host(world, 0, world.hosts.public_addr(2))  # source is 198.18.0.132: no rule admits it


def test_ssh_rule_cidr_decides_who_may_connect(world: World, ec2: Any, fleet: dict[str, Any]) -> None:
    sg = fleet["sg"]
    ec2.revoke_security_group_ingress(GroupId=sg, IpPermissions=[ssh_rule(world.ssh_cidr)])
    ec2.authorize_security_group_ingress(GroupId=sg, IpPermissions=[ssh_rule("203.0.113.0/24")])
    try:
        assert ssh_from_operator(world, world.hosts.public_addr(0)) is None
    finally:
        ec2.revoke_security_group_ingress(GroupId=sg, IpPermissions=[ssh_rule("203.0.113.0/24")])
        ec2.authorize_security_group_ingress(GroupId=sg, IpPermissions=[ssh_rule("198.18.0.128/25")])
    try:
        assert ssh_from_operator(world, world.hosts.public_addr(0)) == world.hosts.name(0)
        # The whole internet /25 is admitted now, nodes' public sources included: the earlier
        # drops were the firewall's doing, not routing's.
        assert tcp_from_host(world, 0, world.hosts.public_addr(2))
    finally:
        ec2.revoke_security_group_ingress(GroupId=sg, IpPermissions=[ssh_rule("198.18.0.128/25")])
        ec2.authorize_security_group_ingress(GroupId=sg, IpPermissions=[ssh_rule(world.ssh_cidr)])
    assert not tcp_from_host(world, 0, world.hosts.public_addr(2))


def test_revoking_the_self_rule_cuts_nodes_apart(world: World, ec2: Any, fleet: dict[str, Any]) -> None:
    sg = fleet["sg"]
    ec2.revoke_security_group_ingress(GroupId=sg, IpPermissions=[self_rule(sg)])
    try:
        assert not tcp_from_host(world, 1, world.hosts.private_addr(0))
    finally:
        ec2.authorize_security_group_ingress(GroupId=sg, IpPermissions=[self_rule(sg)])
    assert tcp_from_host(world, 1, world.hosts.private_addr(0))


def test_data_on_the_laptop_stays_there(world: World) -> None:
    world.operator_path("data/train.tsv").parent.mkdir(exist_ok=True)
    world.operator_path("data/train.tsv").write_text("a\tb\n")
    seen = world.operator_run(["cat", str(world.operator_home / "data" / "train.tsv")])
    assert seen.stdout == "a\tb\n"
    for where in (world.operator_home / "data" / "train.tsv", world.operator_path("data/train.tsv")):
        assert world.hosts.run(0, ["test", "-e", str(where)]).returncode == 1, where


def test_terminated_instance_leaves_an_unreachable_host(world: World, ec2: Any, fleet: dict[str, Any]) -> None:
    # Last in the file: it shrinks the fleet.
    ec2.terminate_instances(InstanceIds=[fleet["ids"][2]])
    assert not tcp_from_host(world, 0, world.hosts.private_addr(2))
    assert ssh_from_operator(world, world.hosts.public_addr(2)) is None
    assert tcp_from_host(world, 0, world.hosts.private_addr(1))


def test_replacement_lands_on_the_freed_host_as_a_new_machine(world: World, ec2: Any,
                                                              fleet: dict[str, Any]) -> None:
    host_key = world.hosts.node_dir(2) / "ssh_host_ed25519_key.pub"
    old_key = host_key.read_text()
    (world.hosts.node_dir(2) / "dot-cpudist" / "leftover").write_text("from the old machine")
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    subnet = ec2.describe_instances(InstanceIds=fleet["ids"][:1])["Reservations"][0]["Instances"][0]["SubnetId"]
    new = ec2.run_instances(ImageId=ami, MinCount=1, MaxCount=1, SubnetId=subnet, SecurityGroupIds=[fleet["sg"]],
                            KeyName="laptop", InstanceType="c6i.large")["Instances"][0]["InstanceId"]
    # RunInstances' own reply still shows moto's random public address (AWS shows none yet): describe.
    new = ec2.describe_instances(InstanceIds=[new])["Reservations"][0]["Instances"][0]
    assert (new["PrivateIpAddress"], new["PublicIpAddress"]) == (world.hosts.private_addr(2),
                                                                 world.hosts.public_addr(2))
    assert host_key.read_text() != old_key
    assert not (world.hosts.node_dir(2) / "dot-cpudist" / "leftover").exists()
    assert len((world.hosts.node_dir(2) / "dot-ssh" / "authorized_keys").read_text().splitlines()) == 1
    assert ssh_from_operator(world, world.hosts.public_addr(2)) == world.hosts.name(2)
