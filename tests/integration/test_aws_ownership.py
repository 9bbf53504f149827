"""The cloud touches only what it made (issue #23 item 8), against moto's EC2 server over HTTP.

A user's own key pair, security group or placement group named like the cluster is refused before
any change and never removed; the record keeps the region and endpoint `up` used and later commands
use them whatever the environment says; one `up` of a name at a time; a rollback that fails says
what is still live.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import boto3

from tests.harness.ec2 import Emulator
from tests.integration.test_aws import CPUDIST, EMPTY, cli, env_for, inventory, live, up


def _user_tags(ec2: Any, resource: str) -> list[dict[str, Any]]:
    return [{"ResourceType": resource, "Tags": [{"Key": "owner", "Value": "me"}]}]


def test_a_users_resources_named_like_the_cluster_are_refused_and_kept(
        emu: Emulator, ec2: Any, ami: str, tmp_path: Path) -> None:
    key = ec2.create_key_pair(KeyName="cpudist-c1",
                              TagSpecifications=_user_tags(ec2, "key-pair"))["KeyPairId"]
    r = up(emu, tmp_path, ami)
    assert (r.returncode == 2
            and "key pair cpudist-c1 exists but is not cpudist's" in r.stderr), r.stderr
    # what the refusal's reader may try
    down = cli(emu, tmp_path, "cluster", "down", "--name", "c1", "--yes")
    assert [k["KeyPairId"] for k in ec2.describe_key_pairs()["KeyPairs"]] == [key], down.stderr
    ec2.delete_key_pair(KeyName="cpudist-c1")

    vpc = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    group = ec2.create_security_group(GroupName="cpudist-c1", VpcId=vpc,
                                      Description="mine")["GroupId"]
    https = [{"IpProtocol": "tcp", "FromPort": 443, "ToPort": 443,
              "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}]
    ec2.authorize_security_group_ingress(GroupId=group, IpPermissions=https)
    r = up(emu, tmp_path, ami)
    assert (r.returncode == 2
            and f"security group cpudist-c1 ({group}) exists but is not cpudist's" in r.stderr)
    rules = ec2.describe_security_groups(GroupIds=[group])["SecurityGroups"][0]["IpPermissions"]
    # not revoked
    assert [(p["FromPort"], p["IpRanges"][0]["CidrIp"]) for p in rules] == [(443, "0.0.0.0/0")]
    # the run's own key pair rolled back
    assert not live(ec2) and ec2.describe_key_pairs()["KeyPairs"] == []
    cli(emu, tmp_path, "cluster", "down", "--name", "c1", "--yes")
    assert ec2.describe_security_groups(GroupIds=[group])["SecurityGroups"]
    ec2.delete_security_group(GroupId=group)

    ec2.create_placement_group(GroupName="cpudist-c1", Strategy="spread")
    r = up(emu, tmp_path, ami)
    assert (r.returncode == 2
            and "placement group cpudist-c1 exists but is not cpudist's" in r.stderr)
    cli(emu, tmp_path, "cluster", "down", "--name", "c1", "--yes")
    assert [g["GroupName"]
            for g in ec2.describe_placement_groups()["PlacementGroups"]] == ["cpudist-c1"]
    ec2.delete_placement_group(GroupName="cpudist-c1")
    ec2.create_placement_group(
        GroupName="cpudist-c1", Strategy="spread",
        TagSpecifications=[{"ResourceType": "placement-group",
                            "Tags": [{"Key": "cpudist:cluster", "Value": "c1"}]}])
    r = up(emu, tmp_path, ami)
    assert r.returncode == 2 and "has strategy spread, not cluster" in r.stderr, r.stderr
    ec2.delete_placement_group(GroupName="cpudist-c1")
    assert inventory(ec2) == EMPTY


def test_the_record_keeps_the_region_and_endpoint(emu: Emulator, ami: str, tmp_path: Path) -> None:
    west = boto3.client("ec2", endpoint_url=emu.url, region_name="us-west-2")
    r = up(emu, tmp_path, ami, "--region", "us-west-2", nodes=2)
    assert r.returncode == 0, r.stderr
    record = json.loads((tmp_path / "cpudist-home" / "clusters" / "c1" / "record.json").read_text())
    assert (record["region"], record["endpoint_url"]) == ("us-west-2", emu.url)
    # The environment moves on: another default region, an endpoint that answers nothing.
    moved = {**env_for(emu, tmp_path), "AWS_DEFAULT_REGION": "eu-west-1",
             "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    status = cli(emu, tmp_path, "cluster", "status", "--name", "c1", "--json", env=moved)
    assert status.returncode == 0 and len(json.loads(status.stdout)["nodes"]) == 2, status.stderr
    other = cli(emu, tmp_path, "cluster", "status", "--name", "c1", "--region", "eu-west-1",
                env=moved)
    assert other.returncode == 2 and "--region eu-west-1 (recorded: us-west-2)" in other.stderr
    listed = cli(emu, tmp_path, "cluster", "list", env={**moved, "AWS_ENDPOINT_URL": emu.url})
    assert "c1\t2 live instance(s)" in listed.stdout, listed.stderr
    down = cli(emu, tmp_path, "cluster", "down", "--name", "c1", "--yes", env=moved)
    assert down.returncode == 0, down.stderr
    left = [i for r in west.describe_instances()["Reservations"] for i in r["Instances"]
            if i["State"]["Name"] != "terminated"]
    assert left == [] and west.describe_key_pairs()["KeyPairs"] == []
    bad = cli(emu, tmp_path, "cluster", "status", "--name", "c2",
                  env={**env_for(emu, tmp_path), "AWS_ENDPOINT_URL": "nowhere"})
    assert (bad.returncode == 2 and "AWS_ENDPOINT_URL" in bad.stderr
            and "Traceback" not in bad.stderr)


def test_one_up_of_a_name_at_a_time(emu: Emulator, ec2: Any, ami: str, tmp_path: Path) -> None:
    # the first `up` holds the lock while this call is in flight
    emu.slow_down("DescribeKeyPairs", 3.0)
    first = subprocess.Popen([*CPUDIST, "cluster", "up", "--name", "c1", "--nodes", "2", "--image",
                              ami, "--yes", "--no-ssh", "--ssh-cidr", "203.0.113.7/32"],
                             env=env_for(emu, tmp_path),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while "DescribeKeyPairs" not in emu.calls:
        assert time.monotonic() < deadline and first.poll() is None
        time.sleep(0.05)
    second = up(emu, tmp_path, ami, nodes=2)
    _, err = first.communicate(timeout=120)
    emu.delays.clear()
    assert (second.returncode == 2
            and "cluster c1 is being changed by another cpudist (pid" in second.stderr)
    # the price line, then the refusal
    assert len(second.stderr.strip().splitlines()) <= 2, second.stderr
    assert first.returncode == 0, err
    assert emu.calls.count("ImportKeyPair") == 1 and len(live(ec2)) == 2
    pub = (tmp_path / "cpudist-home" / "clusters" / "c1" / "id_ed25519.pub").read_text().strip()
    assert emu.public_keys["cpudist-c1"] == pub  # the key on this machine is the nodes' key


def test_a_failed_rollback_says_what_is_still_live(emu: Emulator, ec2: Any, ami: str,
                                                   tmp_path: Path) -> None:
    emu.inject("CreateTags", "InternalError")  # up fails after the launch...
    # ...and its rollback cannot finish
    emu.inject("DeleteSecurityGroup", "UnauthorizedOperation", count=50)
    r = up(emu, tmp_path, ami, nodes=2)
    group = inventory(ec2)["groups"][0]
    assert r.returncode == 1 and "rollback incomplete" in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert f"still live: {group}, cpudist-c1" in last and "cluster down --name c1" in last
    assert "was removed" not in r.stderr and not live(ec2)
    emu.faults.clear()
    assert cli(emu, tmp_path, "cluster", "down", "--name", "c1", "--yes").returncode == 0
    assert inventory(ec2) == EMPTY


def test_a_node_that_dies_while_booting_is_named_and_rolled_back(emu: Emulator, ec2: Any, ami: str,
                                                                 tmp_path: Path) -> None:
    """The wait for `running` (boto3's instance_running waiter) stops at a failure state, and the
    one line names the instance that ended."""
    emu.pending_s = 6.0
    proc = subprocess.Popen([*CPUDIST, "cluster", "up", "--name", "c1", "--nodes", "2", "--image",
                             ami, "--yes",
                             "--no-ssh", "--ssh-cidr", "203.0.113.7/32", "--boot-timeout", "60"],
                            env=env_for(emu, tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(live(ec2)) < 2 or emu.calls.count("CreateTags") < 2:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    victim = live(ec2)[0]["InstanceId"]
    ec2.terminate_instances(InstanceIds=[victim])  # a spot reclaim while it boots
    _, err = proc.communicate(timeout=120)
    assert (proc.returncode == 1
            and f"instance {victim} ended while starting (terminated)" in err), err
    assert inventory(ec2) == EMPTY


def test_instances_left_without_a_node_index_are_adopted(emu: Emulator, ec2: Any, ami: str,
                                                         tmp_path: Path) -> None:
    """A failure between the launch and the numbering, kept by --keep-on-failure: the next `up`
    numbers those instances instead of launching a second set."""
    emu.inject("CreateTags", "InternalError")
    kept = up(emu, tmp_path, ami, "--keep-on-failure", nodes=3)
    assert kept.returncode == 1 and len(live(ec2)) == 3, kept.stderr
    again = up(emu, tmp_path, ami, nodes=3)
    assert again.returncode == 0, again.stderr
    nodes = live(ec2)
    assert len(nodes) == 3, "a second set was launched"
    indices = sorted(int(next(t["Value"] for t in i["Tags"] if t["Key"] == "cpudist:node"))
                     for i in nodes)
    assert indices == [0, 1, 2] and emu.calls.count("RunInstances") == 1 and len(
                           again.stdout.splitlines()) == 3


def test_nodes_require_imdsv2_and_their_volumes_carry_the_tags(emu: Emulator, ec2: Any, ami: str,
                                                               tmp_path: Path) -> None:
    assert up(emu, tmp_path, ami, nodes=2).returncode == 0
    nodes = live(ec2)
    assert [i["MetadataOptions"]["HttpTokens"] for i in nodes] == ["required", "required"]
    volumes = ec2.describe_volumes(Filters=[{"Name": "tag:cpudist:cluster",
                                             "Values": ["c1"]}])["Volumes"]
    assert (sorted(v["Attachments"][0]["InstanceId"] for v in volumes)
            == sorted(i["InstanceId"] for i in nodes))


def test_bad_prices_unknown_names_and_piped_tables(emu: Emulator, ec2: Any, ami: str,
                                                   tmp_path: Path) -> None:
    for price in ("abc", "-5"):
        r = up(emu, tmp_path, ami, "--max-price", price)
        assert r.returncode == 2 and "is not a positive price" in r.stderr, r.stderr
    assert "RunInstances" not in emu.calls
    nosuch = cli(emu, tmp_path, "cluster", "status", "--name", "nosuch")
    assert (nosuch.returncode == 2
            and "there is no cluster nosuch in us-east-1" in nosuch.stderr), nosuch.stderr
    assert up(emu, tmp_path, ami, nodes=1).returncode == 0
    # piped: stdout is not a terminal
    table = cli(emu, tmp_path, "cluster", "status", "--name", "c1")
    node = live(ec2)[0]
    assert (node["InstanceId"] in table.stdout
            and node["PublicIpAddress"] in table.stdout), table.stdout


def test_the_ssh_rule_converges_over_ipv6_too(emu: Emulator, ec2: Any, ami: str,
                                              tmp_path: Path) -> None:
    """An IPv6 --ssh-cidr is an IPv6 rule, and a rule someone added (IPv6 anywhere) is revoked by
    the next up."""
    assert up(emu, tmp_path, ami, nodes=1).returncode == 0
    group = inventory(ec2)["groups"][0]
    anywhere6 = {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22,
                 "Ipv6Ranges": [{"CidrIpv6": "::/0"}]}
    ec2.authorize_security_group_ingress(GroupId=group, IpPermissions=[anywhere6])
    r = cli(emu, tmp_path, "cluster", "up", "--name", "c1", "--nodes", "1", "--image", ami, "--yes",
            "--no-ssh",
                "--ssh-cidr", "2001:db8::7/128")
    assert r.returncode == 0, r.stderr
    rules = ec2.describe_security_groups(GroupIds=[group])["SecurityGroups"][0]["IpPermissions"]
    ssh = [p for p in rules if p["IpProtocol"] == "tcp"]
    assert [(r.get("IpRanges"), [x["CidrIpv6"] for x in r.get("Ipv6Ranges", [])]) for r in ssh] == \
        [([], ["2001:db8::7/128"])], rules
