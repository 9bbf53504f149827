"""`cluster up`, a recovery and `cluster down` where EC2 or the user's setting makes the path
unusual: a clone cluster that loses its head, a security group EC2 does not know yet, an image build
slower than --boot-timeout, a metadata service that does not answer. Against moto's server over HTTP
(tests/integration/conftest.py); no world: the one node-side question (is `down` running on a node?)
is tests/integration/test_cluster_down_inside.py's.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from cpudist.cloud.aws.provider import UBUNTU_PARAMETER
from cpudist.cloud.connect import connect
from cpudist.cloud.record import load_record
from cpudist.cloud.recover import recover
from cpudist.ssh.access import SshAccess
from tests.harness.ec2 import Emulator
from tests.integration.test_aws import CPUDIST, EMPTY, cli, env_for, inventory, live, tag, up


def by_node(ec2: Any) -> dict[int, dict[str, Any]]:
    return {int(tag(i, "cpudist:node")): i for i in live(ec2)}


@pytest.mark.parametrize("lost", [[0], [2], [0, 2]], ids=["head", "node2", "head-and-node2"])
def test_a_clone_cluster_recovers_its_lost_nodes_from_its_own_image(
        emu: Emulator, ec2: Any, ami: str, tmp_path: Path, lost: list[int],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The reclaimed nodes come back from the image of node 0 (the base image lacks what node 0 was
    configured with), the head too, and without a second image under the first one's name (AWS
    refuses that name: the harness does as AWS does)."""
    assert up(emu, tmp_path, ami, "--clone-from-first", nodes=3).returncode == 0
    images = ec2.describe_images(Owners=["self"])["Images"]
    # the run's own name
    assert len(images) == 1 and images[0]["Name"].startswith("cpudist-c1-node0-")
    clone = images[0]["ImageId"]
    before = by_node(ec2)
    ec2.terminate_instances(InstanceIds=[before[i]["InstanceId"] for i in lost])  # spot reclaims
    monkeypatch.setenv("CPUDIST_HOME", str(tmp_path / "cpudist-home"))
    record = load_record("c1")
    assert record is not None
    said: list[str] = []
    recover(connect(record.place), record, 5.0, SshAccess(), said.append)
    after = by_node(ec2)
    assert sorted(after) == [0, 1, 2], said
    for i in lost:
        assert (after[i]["InstanceId"] != before[i]["InstanceId"]
                and after[i]["ImageId"] == clone), said
    assert [i["ImageId"] for i in ec2.describe_images(Owners=["self"])["Images"]] == [clone]
    assert cli(emu, tmp_path, "cluster", "down", "--name", "c1", "--yes").returncode == 0
    assert inventory(ec2) == EMPTY


def test_a_group_ec2_does_not_know_yet_is_retried(emu: Emulator, ec2: Any, ami: str,
                                                  tmp_path: Path) -> None:
    """EC2 is eventually consistent: RunInstances right after CreateSecurityGroup can answer
    InvalidGroup.NotFound. `up` retries it instead of failing (and rolling back)."""
    emu.inject("RunInstances", "InvalidGroup.NotFound")
    r = up(emu, tmp_path, ami, nodes=2)
    assert r.returncode == 0, r.stderr
    assert emu.calls.count("RunInstances") == 2 and len(live(ec2)) == 2


def _up_without_image(emu: Emulator, tmp_path: Path) -> subprocess.Popen[str]:
    """`cluster up` without --image, with none built yet: it bakes one first (its builder stays
    pending)."""
    # the Ubuntu AMI to bake on
    emu.ssm_parameters[UBUNTU_PARAMETER] = next(iter(emu.backend().amis))
    emu.pending_s = 120.0  # a builder that does not come up within --boot-timeout
    return subprocess.Popen([*CPUDIST, "cluster", "up", "--name", "c1", "--nodes", "1", "--yes",
                             "--no-ssh", "--ssh-cidr", "203.0.113.7/32", "--boot-timeout", "3"],
                            env=env_for(emu, tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_the_image_build_of_up_keeps_to_boot_timeout(emu: Emulator, ec2: Any,
                                                     tmp_path: Path) -> None:
    proc = _up_without_image(emu, tmp_path)
    try:
        _, err = proc.communicate(timeout=90)  # the bake's own limit is an hour
    finally:
        proc.kill()
    last = err.strip().splitlines()[-1]
    assert proc.returncode == 1 and last.startswith("Error: building the node image: timed out "
                                                    "after 3s"), err
    assert "--boot-timeout" in last and "--image" in last and "Traceback" not in err
    assert inventory(ec2) == EMPTY and [k for k in ec2.describe_key_pairs()["KeyPairs"]] == []


def test_ctrl_c_in_the_image_build_of_up_says_what_was_removed(emu: Emulator, ec2: Any,
                                                               tmp_path: Path) -> None:
    proc = _up_without_image(emu, tmp_path)
    deadline = time.monotonic() + 60
    while emu.calls.count("RunInstances") < 1:  # the builder is launched: the bake is under way
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "Aborted!" not in err, err
    assert err.strip().splitlines()[-1].startswith("Error: interrupted: what this run created was "
                                                   "removed"), err
    assert inventory(ec2) == EMPTY


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_down_where_no_metadata_service_answers_goes_on_and_says_so(emu: Emulator, ec2: Any,
                                                                    ami: str,
                                                                      tmp_path: Path) -> None:
    """The rule for a machine no metadata service speaks for (a laptop): it is outside every
    cluster."""
    assert up(emu, tmp_path, ami, nodes=2).returncode == 0
    r = cli(emu, tmp_path, "cluster", "down", "--name", "c1", "--yes", "--imds-endpoint",
            _closed_port())
    assert (r.returncode == 0
            and "could not tell which instance this machine is" in r.stderr), r.stderr
    assert inventory(ec2) == EMPTY
    assert not os.path.exists(tmp_path / "cpudist-home" / "clusters" / "c1")
