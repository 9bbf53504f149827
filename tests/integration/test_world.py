"""The test world behaves like AWS: security groups are the firewall, the laptop is not a node.

Needs root, iproute2, iptables and openssh-server (tests/harness/setup.sh installs them).
Dropped packets time out: every probe has a short timeout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from tests.harness.ec2 import FAKE_CREDENTIALS, Emulator
from tests.harness.netns import missing_requirements
from tests.harness.power import Boot, namespace_pids
from tests.harness.world import World
from tests.integration.helpers import kill_tree


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
    """Three instances in one group: SSH from the operator's /32, everything from the group
    itself."""
    r = world.operator_run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", KEY])
    assert r.returncode == 0, r.stderr
    ec2.import_key_pair(KeyName="laptop",
                        PublicKeyMaterial=world.operator_path(".ssh/id_ed25519.pub").read_bytes())
    vpc, subnet = world.create_vpc(ec2)
    sg = ec2.create_security_group(GroupName="nodes", Description="n", VpcId=vpc)["GroupId"]
    ec2.authorize_security_group_ingress(GroupId=sg,
                                         IpPermissions=[ssh_rule(world.ssh_cidr), self_rule(sg)])
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ids = [i["InstanceId"]
           for i in ec2.run_instances(ImageId=ami, MinCount=3, MaxCount=3, SubnetId=subnet,
                                       SecurityGroupIds=[sg], KeyName="laptop",
                                       InstanceType="c6i.large")["Instances"]]
    for i in range(3):
        world.wait_booted(i)
    return {"sg": sg, "ids": ids}


def ssh_rule(cidr: str) -> dict[str, Any]:
    return {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": cidr}]}


def self_rule(group: str) -> dict[str, Any]:
    return {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group}]}


def ssh_from_operator(world: World, address: str) -> str | None:
    """The remote hostname, or None when the connection fails."""
    r = world.operator_run(["ssh", "-i", KEY, "-o", "BatchMode=yes", "-o",
                            "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o",
                            "ConnectTimeout=2", "-o", "LogLevel=ERROR", f"root@{address}",
                            "hostname"], timeout=20)
    return r.stdout.strip() if r.returncode == 0 else None


# Runs on a host: probes address:22 every 50 ms and prints each change of what it sees, until a
# banner.
PROBE = """
import socket, sys, time
def look():
    try:
        s = socket.create_connection((sys.argv[1], 22), timeout=0.3)
    except TimeoutError:
        return "silent"
    except ConnectionRefusedError:
        return "refused"
    except ConnectionResetError:
        return "no banner"
    except OSError:
        return "silent"  # no route: nothing answered ARP
    try:
        s.settimeout(1.0)
        return "banner" if s.recv(64).startswith(b"SSH-") else "no banner"
    except OSError:
        return "no banner"
    finally:
        s.close()
seen, deadline = [], time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline and seen[-1:] != ["banner"]:
    now = look()
    if seen[-1:] != [now]:
        seen.append(now)
        print(now, flush=True)
    time.sleep(0.05)
"""


# A connection between two hosts: the server side holds it open; the client side reads from it for 4
# s.
SERVER = """
import socket, time
conn, _ = socket.create_server(("0.0.0.0", 7000)).accept()
print("accepted", flush=True)
time.sleep(600)
"""
CLIENT = """
import socket, sys, time
for _ in range(100):
    try:
        s = socket.create_connection((sys.argv[1], 7000), timeout=1)
        break
    except OSError:
        time.sleep(0.1)
print("connected", flush=True)
s.settimeout(4)
try:
    print("read", s.recv(10), flush=True)
except OSError as e:
    print(type(e).__name__, flush=True)
"""


def tcp_from_host(world: World, i: int, address: str, port: int = 22) -> bool:
    """Whether host i completes a TCP handshake with address:port within a second and a half."""
    r = world.hosts.run(i, ["timeout", "1.5", "bash", "-c", f"</dev/tcp/{address}/{port}"],
                        timeout=10)
    return r.returncode == 0


def test_instances_get_the_hosts_addresses(world: World, ec2: Any, fleet: dict[str, Any]) -> None:
    found = {i["InstanceId"]: i
             for r in ec2.describe_instances(InstanceIds=fleet["ids"])["Reservations"]
             for i in r["Instances"]}
    got = [(found[i]["PrivateIpAddress"], found[i]["PublicIpAddress"]) for i in fleet["ids"]]
    assert got == [(world.hosts.private_addr(i), world.hosts.public_addr(i)) for i in range(3)]
    assert got[0] == ("198.18.0.4", "198.18.0.132")


def test_operator_reaches_nodes_by_public_address_only(world: World, fleet: dict[str, Any]) -> None:
    # cloud-init's key
    assert ssh_from_operator(world, world.hosts.public_addr(1)) == world.hosts.name(1)
    assert ssh_from_operator(world, world.hosts.private_addr(1)) is None  # no route into the VPC


def test_operator_reaches_the_ec2_endpoint(world: World, fleet: dict[str, Any]) -> None:
    assert world.emulator is not None
    code = ("import boto3; c = boto3.client('ec2', region_name='us-east-1'); "
            "print(len(c.describe_instances()['Reservations']))")
    r = world.operator_run([sys.executable, "-c", code],
                           env={**FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": world.emulator.url},
                           timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "1", r.stderr[-2000:]


def test_nodes_talk_over_private_addresses_only(world: World, fleet: dict[str, Any]) -> None:
    assert tcp_from_host(world, 0, world.hosts.private_addr(2))
    # source is 198.18.0.132: no rule admits it
    assert not tcp_from_host(world, 0, world.hosts.public_addr(2))


def test_ssh_rule_cidr_decides_who_may_connect(world: World, ec2: Any,
                                               fleet: dict[str, Any]) -> None:
    sg = fleet["sg"]
    ec2.revoke_security_group_ingress(GroupId=sg, IpPermissions=[ssh_rule(world.ssh_cidr)])
    ec2.authorize_security_group_ingress(GroupId=sg, IpPermissions=[ssh_rule("203.0.113.0/24")])
    try:
        assert ssh_from_operator(world, world.hosts.public_addr(0)) is None
    finally:
        ec2.revoke_security_group_ingress(GroupId=sg, IpPermissions=[ssh_rule("203.0.113.0/24")])
        ec2.authorize_security_group_ingress(GroupId=sg,
                                             IpPermissions=[ssh_rule("198.18.0.128/25")])
    try:
        assert ssh_from_operator(world, world.hosts.public_addr(0)) == world.hosts.name(0)
        # The whole internet /25 is admitted now, nodes' public sources included: the earlier
        # drops were the firewall's doing, not routing's.
        assert tcp_from_host(world, 0, world.hosts.public_addr(2))
    finally:
        ec2.revoke_security_group_ingress(GroupId=sg, IpPermissions=[ssh_rule("198.18.0.128/25")])
        ec2.authorize_security_group_ingress(GroupId=sg, IpPermissions=[ssh_rule(world.ssh_cidr)])
    assert not tcp_from_host(world, 0, world.hosts.public_addr(2))


def test_revoking_the_self_rule_cuts_nodes_apart(world: World, ec2: Any,
                                                 fleet: dict[str, Any]) -> None:
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
    for where in (world.operator_home / "data" / "train.tsv",
                  world.operator_path("data/train.tsv")):
        assert world.hosts.run(0, ["test", "-e", str(where)]).returncode == 1, where


def test_a_stopped_then_started_instance_keeps_its_disk(world: World, ec2: Any,
                                                        fleet: dict[str, Any]) -> None:
    host_key = (world.hosts.node_dir(1) / "ssh_host_ed25519_key.pub").read_text()
    (world.hosts.node_dir(1) / "dot-cpudist" / "kept").write_text("on the instance's volume")
    ec2.stop_instances(InstanceIds=[fleet["ids"][1]])
    assert namespace_pids(world.hosts.name(1)) == []  # powered off: its sshd too
    ec2.start_instances(InstanceIds=[fleet["ids"][1]])
    world.wait_booted(1)
    assert (world.hosts.node_dir(1) / "ssh_host_ed25519_key.pub").read_text() == host_key
    assert (world.hosts.node_dir(1) / "dot-cpudist" / "kept").exists()
    assert ssh_from_operator(world, world.hosts.public_addr(1)) == world.hosts.name(1)


def test_terminate_kills_the_hosts_processes_and_silences_its_connections(
        world: World, ec2: Any, fleet: dict[str, Any]) -> None:
    """A node that vanishes: everything on it dies, and its peers hear nothing (no FIN, no RST).

    Last but one in the file: it shrinks the fleet.
    """
    server = subprocess.Popen(world.hosts.exec_argv(2, [sys.executable, "-c", SERVER]),
                              stdout=subprocess.PIPE, text=True)
    client = subprocess.Popen(world.hosts.exec_argv(0,
                                                    [sys.executable, "-c", CLIENT,
                                                     world.hosts.private_addr(2)]),
                              stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout is not None and server.stdout is not None
        assert client.stdout.readline().strip() == "connected" \
            and server.stdout.readline().strip() == "accepted"
        ec2.terminate_instances(InstanceIds=[fleet["ids"][2]])
        # gone by the time TerminateInstances answers
        assert namespace_pids(world.hosts.name(2)) == []
        assert server.wait(timeout=10) == -9
        # The peer's read neither ends (FIN would give b'') nor fails at once (RST): it times out.
        assert client.stdout.readline().strip() == "TimeoutError"
        assert client.wait(timeout=10) == 0
    finally:
        for proc in (server, client):
            kill_tree(proc)
    assert world.hosts.sshd_pid(0) in namespace_pids(world.hosts.name(0))  # the other hosts live on
    assert not tcp_from_host(world, 0, world.hosts.private_addr(2))
    assert ssh_from_operator(world, world.hosts.public_addr(2)) is None
    assert tcp_from_host(world, 0, world.hosts.private_addr(1))


def test_replacement_lands_on_the_freed_host_as_a_new_machine(world: World, ec2: Any,
                                                              fleet: dict[str, Any]) -> None:
    """... and boots like one: nothing answers while EC2 says pending, then port 22 refuses, then it
    resets connections before any banner, then sshd answers (a window long enough for each to be
    seen)."""
    host_key = world.hosts.node_dir(2) / "ssh_host_ed25519_key.pub"
    old_key = host_key.read_text()
    (world.hosts.node_dir(2) / "dot-cpudist" / "leftover").write_text("from the old machine")
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    reservation = ec2.describe_instances(InstanceIds=fleet["ids"][:1])["Reservations"][0]
    subnet = reservation["Instances"][0]["SubnetId"]
    world.set_boot(Boot(pending_s=2.0, refusing_s=2.0, no_banner_s=2.0))
    try:
        new = ec2.run_instances(ImageId=ami, MinCount=1, MaxCount=1, SubnetId=subnet,
                                SecurityGroupIds=[fleet["sg"]], KeyName="laptop",
                                InstanceType="c6i.large")["Instances"][0]["InstanceId"]
        launched = time.monotonic()
        probe = world.hosts.run(0, [sys.executable, "-c", PROBE, world.hosts.private_addr(2), "30"],
                                timeout=60)
        booted = time.monotonic() - launched
    finally:
        world.set_boot(Boot())
    seen = probe.stdout.splitlines()
    # In this order; sshd's own start may refuse a probe or two after the resets.
    assert list(dict.fromkeys(seen)) == ["silent", "refused", "no banner",
                                         "banner"] and seen.count("silent") == 1, seen
    assert booted >= 6.0
    # RunInstances' own reply shows the emulator's address for it (AWS shows none yet): describe.
    new = ec2.describe_instances(InstanceIds=[new])["Reservations"][0]["Instances"][0]
    assert (new["PrivateIpAddress"], new["PublicIpAddress"]) == (world.hosts.private_addr(2),
                                                                 world.hosts.public_addr(2))
    assert host_key.read_text() != old_key
    assert not (world.hosts.node_dir(2) / "dot-cpudist" / "leftover").exists()
    assert len((world.hosts.node_dir(
                    2) / "dot-ssh" / "authorized_keys").read_text().splitlines()) == 1
    assert ssh_from_operator(world, world.hosts.public_addr(2)) == world.hosts.name(2)
