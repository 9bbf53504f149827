"""`cpudist cluster up/down/status` against EC2 emulated by moto's server over HTTP.

No world here: instances' public addresses are the emulator's, in TEST-NET-2 (198.51.100.0/24), so
the one test that connects to one (test_clone_needs_ssh_to_configure) sends nothing to anyone's
host.

The commands run in this process (`cli`: Click's CliRunner, each a fresh environment) but where a
separate process is the point: the real entry point once, the signals, a concurrent `up`
(test_aws_ownership.py). A subprocess per command spent most of this file's CPU time starting Python
and importing boto3, rich and paramiko again. The emulator and its fixtures (emu, ec2, ami) are
tests/integration/conftest.py's.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.harness.ec2 import FAKE_CREDENTIALS, TEST_NET_2, Emulator
from tests.integration.helpers import in_process

CPUDIST = [sys.executable, "-m", "cpudist.cli"]
TAG = "cpudist:cluster"


def in_test_net(address: str) -> bool:
    return ipaddress.ip_address(address) in ipaddress.ip_network(f"{TEST_NET_2}.0/24")


def env_for(emu: Emulator, tmp_path: Path) -> dict[str, str]:
    return {**os.environ, **FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": emu.url,
            "HOME": str(tmp_path / "home"), "CPUDIST_HOME": str(tmp_path / "cpudist-home")}


def cpudist(emu: Emulator, tmp_path: Path, *args: str, env: dict[str, str] | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`cpudist ARGS` as its own process: where signals, the real entry point or a second process
    are the point."""
    return subprocess.run([*CPUDIST, *args], capture_output=True, text=True, timeout=timeout,
                          env=env or env_for(emu, tmp_path), stdin=subprocess.DEVNULL)


def cli(emu: Emulator, tmp_path: Path, *args: str,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`cpudist ARGS` in this process (tests/integration/helpers.py), with the environment `env`."""
    return in_process(*args, env=env or env_for(emu, tmp_path))


def up(emu: Emulator, tmp_path: Path, ami: str, *extra: str,
       nodes: int = 4) -> subprocess.CompletedProcess[str]:
    return cli(emu, tmp_path, "cluster", "up", "--name", "c1", "--nodes", str(nodes), "--image",
               ami, "--yes", "--no-ssh", "--ssh-cidr", "203.0.113.7/32", *extra)


def tag(instance: dict[str, Any], key: str) -> str:
    return next(t["Value"] for t in instance.get("Tags", []) if t["Key"] == key)


def live(ec2: Any, name: str = "c1") -> list[dict[str, Any]]:
    res = ec2.describe_instances(Filters=[{"Name": f"tag:{TAG}", "Values": [name]}])["Reservations"]
    return [i for r in res for i in r["Instances"] if i["State"]["Name"] != "terminated"]


def inventory(ec2: Any) -> dict[str, Any]:
    """What exists in the account, apart from moto's defaults."""
    groups = [g for g in ec2.describe_security_groups()["SecurityGroups"]
              if g["GroupName"] != "default"]
    return {"instances": sorted(i["InstanceId"] for i in live(ec2)),
            "keys": sorted(k["KeyName"] for k in ec2.describe_key_pairs()["KeyPairs"]),
            "groups": sorted(g["GroupId"] for g in groups),
            "placement": sorted(p["GroupName"]
                                for p in ec2.describe_placement_groups()["PlacementGroups"]),
            "images": sorted(i["ImageId"] for i in ec2.describe_images(Owners=["self"])["Images"]),
            # moto's account starts with many snapshots of its stock AMIs: count those cpudist
            # tagged.
            "snapshots": sorted(s["SnapshotId"] for s in ec2.describe_snapshots(
                OwnerIds=["self"], Filters=[{"Name": "tag-key", "Values": [TAG]}])["Snapshots"])}


EMPTY = {"instances": [], "keys": [], "groups": [], "placement": [], "images": [], "snapshots": []}


def test_up_creates_exactly_the_cluster_and_converges(emu: Emulator, ec2: Any, ami: str,
                                                      tmp_path: Path) -> None:
    # The one `up` here run as its own process (`python -m cpudist.cli`, the real entry point); the
    # file's other cluster commands run in this process (`cli`), but for the signals' and the
    # concurrent `up`'s.
    r = cpudist(emu, tmp_path, "cluster", "up", "--name", "c1", "--nodes", "4", "--image", ami,
                "--yes", "--no-ssh", "--ssh-cidr", "203.0.113.7/32", "--spot")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 4  # the hostfile
    inv = inventory(ec2)
    assert inv["keys"] == ["cpudist-c1"] and len(inv["groups"]) == 1 and inv["placement"] == [
        "cpudist-c1"]
    nodes = live(ec2)
    assert len(nodes) == 4 and {i["ImageId"] for i in nodes} == {ami}
    assert all(i.get("InstanceLifecycle") == "spot" for i in nodes)
    assert all({"Key": TAG, "Value": "c1"} in i["Tags"] for i in nodes)
    # documentation space, not moto's 54.214/16
    assert all(in_test_net(i["PublicIpAddress"]) for i in nodes)
    group = ec2.describe_security_groups(GroupIds=inv["groups"])["SecurityGroups"][0]
    rules = group["IpPermissions"]
    assert len(rules) == 2
    ssh = next(p for p in rules if p["IpProtocol"] == "tcp")
    cidrs = [x["CidrIp"] for x in ssh["IpRanges"]]
    assert (ssh["FromPort"], ssh["ToPort"], cidrs) == (22, 22, ["203.0.113.7/32"])
    inside = next(p for p in rules if p["IpProtocol"] == "-1")
    assert [p["GroupId"]
            for p in inside["UserIdGroupPairs"]] == [group["GroupId"]] and not inside["IpRanges"]
    key = tmp_path / "cpudist-home" / "clusters" / "c1" / "id_ed25519"
    assert key.stat().st_mode & 0o777 == 0o600
    launches = emu.calls.count("RunInstances")
    again = up(emu, tmp_path, ami, "--spot")
    assert again.returncode == 0, again.stderr
    assert inventory(ec2) == inv and emu.calls.count("RunInstances") == launches
    status = cli(emu, tmp_path, "cluster", "status", "--name", "c1", "--json")
    assert status.returncode == 0 and len(json.loads(status.stdout)["nodes"]) == 4


def test_clone_from_first_then_down_leaves_nothing(emu: Emulator, ec2: Any, ami: str,
                                                   tmp_path: Path) -> None:
    r = up(emu, tmp_path, ami, "--clone-from-first")
    assert r.returncode == 0, r.stderr
    images = ec2.describe_images(Owners=["self"])["Images"]
    assert len(images) == 1 and {"Key": TAG, "Value": "c1"} in images[0]["Tags"]
    nodes = sorted(live(ec2),
                   key=lambda i: next(t["Value"] for t in i["Tags"] if t["Key"] == "cpudist:node"))
    assert nodes[0]["ImageId"] == ami and {i["ImageId"]
                                           for i in nodes[1:]} == {images[0]["ImageId"]}
    snapshot = images[0]["BlockDeviceMappings"][0]["Ebs"]["SnapshotId"]  # a snapshot to remove too
    assert inventory(ec2)["snapshots"] == [snapshot]
    r = cli(emu, tmp_path, "cluster", "down", "--name", "c1", "--yes")
    assert r.returncode == 0, r.stderr
    assert inventory(ec2) == EMPTY
    assert snapshot not in [x["SnapshotId"]
                            for x in ec2.describe_snapshots(OwnerIds=["self"])["Snapshots"]]
    assert not (tmp_path / "cpudist-home" / "clusters" / "c1").exists()


def test_clone_needs_ssh_to_configure(emu: Emulator, ec2: Any, ami: str, tmp_path: Path) -> None:
    script = tmp_path / "setup.sh"
    script.write_text("touch /tmp/configured\n")
    r = up(emu, tmp_path, ami, "--clone-from-first", "--setup-script", str(script),
           "--boot-timeout", "3")
    # the emulator's addresses answer no SSH
    assert r.returncode == 1 and "no SSH banner" in r.stderr
    probed = r.stderr.split("no SSH banner from ", 1)[1].split(":", 1)[0]
    # the address it tried is documentation space, routed nowhere
    assert in_test_net(probed), probed
    assert inventory(ec2) == EMPTY  # the failed run removed what it made


def test_all_nodes_in_one_launch_call_with_a_client_token(emu: Emulator, ec2: Any, ami: str,
                                                          tmp_path: Path) -> None:
    r = up(emu, tmp_path, ami)
    assert r.returncode == 0, r.stderr
    assert emu.calls.count("RunInstances") == 1
    assert sorted(int(tag(i, "cpudist:node")) for i in live(ec2)) == [0, 1, 2, 3]
    record = json.loads((tmp_path / "cpudist-home" / "clusters" / "c1" / "record.json").read_text())
    assert [n["index"] for n in record["nodes"]] == [0, 1, 2, 3]
    assert all(n["private_ip"] and n["lifecycle"] == "spot" for n in record["nodes"])


def test_capacity_error_after_the_image_leaks_nothing(emu: Emulator, ec2: Any, ami: str,
                                                      tmp_path: Path) -> None:
    # node 0 made and imaged, then refused
    emu.inject("RunInstances", "InsufficientInstanceCapacity", skip=1)
    r = up(emu, tmp_path, ami, "--clone-from-first")
    assert (r.returncode == 1 and "InsufficientInstanceCapacity" in r.stderr
            and "--on-demand-fallback" in r.stderr)
    assert "Traceback" not in r.stderr
    assert inventory(ec2) == EMPTY


def test_on_demand_fallback_brings_the_cluster_up(emu: Emulator, ec2: Any, ami: str,
                                                  tmp_path: Path) -> None:
    emu.inject("RunInstances", "InsufficientInstanceCapacity", skip=1)
    r = up(emu, tmp_path, ami, "--on-demand-fallback", "--clone-from-first")
    assert r.returncode == 0, r.stderr
    lifecycles = sorted(i.get("InstanceLifecycle", "on-demand") for i in live(ec2))
    assert lifecycles == ["on-demand", "on-demand", "on-demand", "spot"]
    record = json.loads((tmp_path / "cpudist-home" / "clusters" / "c1" / "record.json").read_text())
    by_market = {n["lifecycle"]: n["usd_per_hour"] for n in record["nodes"]}
    assert [n["lifecycle"] for n in record["nodes"]] == ["spot", "on-demand", "on-demand",
                                                         "on-demand"]
    assert by_market["on-demand"] == 2.72 and by_market["spot"] != by_market["on-demand"]


# Every EC2 call `cluster up` makes, in order (test_every_call_of_up_is_covered keeps this list
# true).
UP_CALLS = ["DescribeVpcs", "DescribeSubnets", "DescribeSpotPriceHistory", "DescribeKeyPairs",
            "ImportKeyPair", "DescribeSecurityGroups", "CreateSecurityGroup",
            "AuthorizeSecurityGroupIngress", "DescribePlacementGroups", "CreatePlacementGroup",
            "DescribeInstances", "RunInstances", "CreateTags"]


def test_every_call_of_up_is_covered(emu: Emulator, ec2: Any, ami: str, tmp_path: Path) -> None:
    emu.calls.clear()  # the fixtures' own calls
    assert up(emu, tmp_path, ami).returncode == 0
    assert set(emu.calls) == set(UP_CALLS)


CREATES = ["ImportKeyPair", "CreateSecurityGroup", "CreatePlacementGroup", "RunInstances"]
TRIES = 3  # botocore's standard retry mode: a 5xx answer is tried this many times in all


@pytest.mark.parametrize(("action", "lost", "count"),
                         [*((a, False, 1) for a in UP_CALLS), *((a, True, TRIES) for a in CREATES)],
                         ids=[*(f"{a}-refused" for a in UP_CALLS),
                              *(f"{a}-answer-lost-every-try" for a in CREATES)])
def test_a_fault_at_any_call_leaks_nothing(emu: Emulator, ec2: Any, ami: str, tmp_path: Path,
                                           action: str, lost: bool, count: int) -> None:
    """Refused, or carried out with every answer lost on the way: the run's tag still finds what it
    made."""
    emu.inject(action, "InternalError", count=count, lost=lost)
    r = up(emu, tmp_path, ami)
    assert r.returncode == 1 and "InternalError" in r.stderr and "Traceback" not in r.stderr
    assert inventory(ec2) == EMPTY
    assert not (tmp_path / "cpudist-home" / "clusters" / "c1").exists()


@pytest.mark.parametrize("action", [*CREATES, "AuthorizeSecurityGroupIngress", "CreateTags"])
def test_a_lost_answer_is_retried_without_making_two(emu: Emulator, ec2: Any, ami: str,
                                                     tmp_path: Path, action: str) -> None:
    """One answer lost (a 5xx after the call was carried out): botocore's retry repeats it, and a
    create's retry finds what the first try made (RunInstances by its ClientToken, the rest by name
    and this run's tag) instead of making a second or failing on the duplicate."""
    emu.inject(action, "InternalError", lost=True)
    r = up(emu, tmp_path, ami)
    assert r.returncode == 0, r.stderr
    inv = inventory(ec2)
    assert (inv["keys"], len(inv["groups"]), inv["placement"]) == (
        ["cpudist-c1"], 1, ["cpudist-c1"])
    assert len(inv["instances"]) == 4 and len(r.stdout.splitlines()) == 4
    assert emu.calls.count(action) >= 2  # the fault was hit, and retried


def test_up_converges_a_stopped_and_a_reclaimed_node(emu: Emulator, ec2: Any, ami: str,
                                                     tmp_path: Path) -> None:
    assert up(emu, tmp_path, ami).returncode == 0
    nodes = {int(tag(i, "cpudist:node")): i["InstanceId"] for i in live(ec2)}
    ec2.stop_instances(InstanceIds=[nodes[1]])
    ec2.terminate_instances(InstanceIds=[nodes[2]])  # what a spot reclaim leaves
    r = up(emu, tmp_path, ami)
    assert r.returncode == 0, r.stderr
    now = {int(tag(i, "cpudist:node")): i for i in live(ec2)}
    assert sorted(now) == [0, 1, 2, 3] and all(i["State"]["Name"] == "running"
                                               for i in now.values())
    assert now[1]["InstanceId"] == nodes[1] and now[2]["InstanceId"] != nodes[2]
    assert emu.calls.count("RunInstances") == 2 and emu.calls.count("StartInstances") == 1


def test_instances_not_yet_visible_are_retried(emu: Emulator, ec2: Any, ami: str,
                                               tmp_path: Path) -> None:
    """EC2 is eventually consistent: for a moment after RunInstances, CreateTags naming a new
    instance answers InvalidInstanceID.NotFound. `up` retries it instead of failing (and rolling
    back)."""
    emu.unseen_s = 2.0
    r = up(emu, tmp_path, ami, nodes=2)
    assert r.returncode == 0, r.stderr
    assert emu.calls.count("CreateTags") > 2  # refused at least once, then tagged
    assert sorted(int(tag(i, "cpudist:node")) for i in live(ec2)) == [0, 1]


def test_a_rollback_right_after_the_launch_removes_the_unseen_instances(emu: Emulator, ec2: Any,
                                                                        ami: str,
                                                                        tmp_path: Path) -> None:
    """A failure just after RunInstances: the rollback's TerminateInstances names instances EC2 does
    not show yet, and retries until it does."""
    emu.unseen_s = 2.0
    emu.inject("CreateTags", "InternalError")
    r = up(emu, tmp_path, ami, nodes=2)
    assert (r.returncode == 1 and "InternalError" in r.stderr
            and "rollback incomplete" not in r.stderr), r.stderr
    assert inventory(ec2) == EMPTY


def test_throttling_is_retried(emu: Emulator, ec2: Any, ami: str, tmp_path: Path) -> None:
    emu.inject("RunInstances", "RequestLimitExceeded", count=2)
    emu.inject("DescribeInstances", "RequestLimitExceeded", count=1)
    r = up(emu, tmp_path, ami)
    assert r.returncode == 0, r.stderr
    assert len(live(ec2)) == 4


def _interrupt_up(emu: Emulator, tmp_path: Path, ami: str, signals: list[signal.Signals],
                  when: str = "RunInstances", then: str | None = None,
                  delay: float = 2.0) -> subprocess.CompletedProcess[str]:
    """Start `up`, send `signals` once `when` is in flight (a slowed call), return how it ended.
    With `then`, the signals after the first wait until that call is in flight (the rollback's,
    say)."""
    emu.slow_down(when, delay)
    proc = subprocess.Popen([*CPUDIST, "cluster", "up", "--name", "c1", "--nodes", "4", "--image",
                             ami, "--yes",
                             "--no-ssh", "--ssh-cidr", "203.0.113.7/32", "--clone-from-first"],
                            env=env_for(emu, tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while emu.calls.count(when) < 1:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    # when the slowed call is carried out, whatever became of its client
    lands = time.monotonic() + delay
    time.sleep(0.3)  # the call is in flight on the server
    for i, sig in enumerate(signals):
        while i and then and emu.calls.count(then) < 1:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        proc.send_signal(sig)
        time.sleep(0.5)
    out, err = proc.communicate(timeout=180)
    emu.delays.clear()
    # judge what is left only once the call has landed
    time.sleep(max(0.0, lands + 0.5 - time.monotonic()))
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


# One signal per call in flight, each of SIGINT, SIGTERM and SIGHUP at least once: the three reach
# the same KeyboardInterrupt (cpudist/interrupts.py, each checked in tests/unit/test_interrupts.py),
# so what differs between the cases is the call the interrupt lands in.
@pytest.mark.parametrize(("sig", "when"),
                         [(signal.SIGINT, "RunInstances"), (signal.SIGHUP, "CreateTags"),
                          # each create's answer is awaited: what it made is found
                          # and removed
                          (signal.SIGINT, "ImportKeyPair"),
                          (signal.SIGTERM, "CreateSecurityGroup"),
                          (signal.SIGHUP, "CreatePlacementGroup")])
def test_a_signal_while_launching_cleans_up(emu: Emulator, ec2: Any, ami: str, tmp_path: Path,
                                            sig: signal.Signals, when: str) -> None:
    """In flight (the instance appears after the client gave up on the call), or pending (just
    launched)."""
    # A create held long enough that a rollback which did not wait for its answer would be over
    # before it lands.
    r = _interrupt_up(emu, tmp_path, ami, [sig], when, delay=2.0
                      if when in ("RunInstances", "CreateTags") else 6.0)
    assert (r.returncode == 1 and "removing what this run created" in r.stderr
            and "interrupted" in r.stderr)
    assert inventory(ec2) == EMPTY  # also the instance whose RunInstances was in flight


def test_a_second_ctrl_c_during_the_cleanup_does_not_abandon_it(emu: Emulator, ec2: Any, ami: str,
                                                                tmp_path: Path) -> None:
    emu.slow_down("TerminateInstances", 2.0)
    # A signal while RunInstances is in flight waits for its answer; the next two come during the
    # rollback.
    r = _interrupt_up(emu, tmp_path, ami, [signal.SIGINT, signal.SIGINT, signal.SIGINT],
                      then="TerminateInstances")
    assert r.returncode == 1 and "finishing the cleanup first" in r.stderr
    assert inventory(ec2) == EMPTY


def test_down_lists_asks_and_dry_runs(emu: Emulator, ec2: Any, ami: str, tmp_path: Path) -> None:
    assert up(emu, tmp_path, ami, nodes=2).returncode == 0
    before = inventory(ec2)
    dry = cli(emu, tmp_path, "cluster", "down", "--name", "c1", "--dry-run")
    assert (dry.returncode == 0
            and sorted(json.loads(dry.stdout)["instances"]) == before["instances"])
    assert all(i in dry.stderr for i in before["instances"])
    asked = cli(emu, tmp_path, "cluster", "down", "--name", "c1")
    assert asked.returncode == 2 and "--yes" in asked.stderr
    assert inventory(ec2) == before
    assert cli(emu, tmp_path, "cluster", "down", "--name", "c1", "--yes").returncode == 0
    assert inventory(ec2) == EMPTY


def test_user_ssh_files_are_never_touched(emu: Emulator, ec2: Any, ami: str,
                                          tmp_path: Path) -> None:
    ssh = tmp_path / "home" / ".ssh"
    ssh.mkdir(parents=True)
    (ssh / "known_hosts").write_text("example.org ssh-ed25519 AAAA\n")
    assert up(emu, tmp_path, ami, nodes=1).returncode == 0
    assert cli(emu, tmp_path, "cluster", "down", "--name", "c1", "--yes").returncode == 0
    assert sorted(p.name for p in ssh.iterdir()) == ["known_hosts"]
    assert (ssh / "known_hosts").read_text() == "example.org ssh-ed25519 AAAA\n"


@pytest.mark.parametrize(("code", "needle"), [
    ("SpotMaxPriceTooLow", "Raise --max-price"),
    ("MaxSpotInstanceCountExceeded", "spot quota"),
    ("UnauthorizedOperation", "cpudist/cloud/aws/iam-policy.json"),
])
def test_aws_errors_are_one_line_with_the_code(emu: Emulator, ec2: Any, ami: str, tmp_path: Path,
                                               code: str, needle: str) -> None:
    emu.inject("RunInstances", code)
    r = up(emu, tmp_path, ami)
    assert r.returncode == 1 and code in r.stderr and needle in r.stderr
    assert len(r.stderr.strip().splitlines()[-1]) > 0 and "Traceback" not in r.stderr
    assert inventory(ec2) == EMPTY


def test_invalid_ami_is_bad_input(emu: Emulator, ec2: Any, tmp_path: Path) -> None:
    r = up(emu, tmp_path, "ami-0000000000000000f")
    assert r.returncode == 2 and "InvalidAMIID" in r.stderr
    assert inventory(ec2) == EMPTY


def test_no_credentials_and_unknown_region(emu: Emulator, tmp_path: Path) -> None:
    bare = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    bare.update(HOME=str(tmp_path), AWS_CONFIG_FILE="/nonexistent",
                AWS_SHARED_CREDENTIALS_FILE="/nonexistent",
                AWS_ENDPOINT_URL=emu.url, AWS_EC2_METADATA_DISABLED="true")
    r = cli(emu, tmp_path, "cluster", "status", "--name", "c1", env=bare)
    assert r.returncode == 2 and "no AWS credentials found" in r.stderr  # bad setup, as bad input
    del bare["AWS_ENDPOINT_URL"]
    r = cli(emu, tmp_path, "cluster", "status", "--region", "mars-north-1",
            env={**bare, **FAKE_CREDENTIALS})
    assert r.returncode == 2 and "unknown AWS region 'mars-north-1'" in r.stderr


def test_count_mismatch_and_foreign_instances(emu: Emulator, ec2: Any, ami: str,
                                              tmp_path: Path) -> None:
    assert up(emu, tmp_path, ami, nodes=2).returncode == 0
    grown = up(emu, tmp_path, ami, nodes=3)  # more nodes: the missing one is launched
    assert grown.returncode == 0 and len(live(ec2)) == 3, grown.stderr
    r = up(emu, tmp_path, ami, nodes=2)  # fewer: never terminates nodes on its own
    assert r.returncode == 1 and "has 3 nodes, not 2" in r.stderr
    group = live(ec2)[0]["SecurityGroups"][0]["GroupId"]
    ec2.run_instances(ImageId=ami, MinCount=1, MaxCount=1, InstanceType="c6i.large",
                      SecurityGroupIds=[group])
    r = up(emu, tmp_path, ami, nodes=3)
    assert r.returncode == 1 and "holds instances of no cpudist cluster" in r.stderr


def test_dry_run_and_confirmation(emu: Emulator, ec2: Any, ami: str, tmp_path: Path) -> None:
    r = cli(emu, tmp_path, "cluster", "up", "--name", "c1", "--nodes", "4", "--image", ami,
            "--dry-run",
                "--ssh-cidr", "203.0.113.7/32", "--on-demand")
    assert r.returncode == 0 and "$2.72/h per node" in r.stderr and "would ensure" in r.stderr
    r = cli(emu, tmp_path, "cluster", "up", "--name", "c1", "--nodes", "1", "--image", ami,
                "--ssh-cidr", "203.0.113.7/32")
    assert r.returncode == 2 and "--yes" in r.stderr
    assert inventory(ec2) == EMPTY


def test_config_file_gives_defaults(emu: Emulator, ec2: Any, ami: str, tmp_path: Path) -> None:
    config = tmp_path / "cluster.toml"
    config.write_text(f'[cluster]\nname = "fromtoml"\nnodes = 2\nimage = "{ami}"\n'
                      'ssh-cidr = "198.51.100.1/32"\n'
                      'instance-type = "c6i.large"\nspot = false\n')
    r = cli(emu, tmp_path, "cluster", "up", "--config", str(config), "--yes", "--no-ssh", "--nodes",
            "1")
    assert r.returncode == 0, r.stderr
    nodes = live(ec2, "fromtoml")
    assert (len(nodes) == 1 and nodes[0]["InstanceType"] == "c6i.large"
            and "InstanceLifecycle" not in nodes[0])


def test_down_retries_while_the_group_is_still_in_use(emu: Emulator, ec2: Any, ami: str,
                                                      tmp_path: Path) -> None:
    assert up(emu, tmp_path, ami, nodes=1).returncode == 0
    # AWS lags behind terminations
    emu.inject("DeleteSecurityGroup", "DependencyViolation", count=2)
    r = cli(emu, tmp_path, "cluster", "down", "--name", "c1", "--yes")
    assert r.returncode == 0, r.stderr
    assert emu.calls.count("DeleteSecurityGroup") == 3 and inventory(ec2) == EMPTY
