"""The product, end to end, from the user's laptop: `cluster up` -> `run` -> `report` -> `cluster
down`.

The world (tests/harness/world.py) is shaped like AWS: the laptop is a namespace of its own with
its own home, the only place the data exists, on an "internet" network; instances are namespace
hosts with a private address in the VPC and a public one on the internet; the security group's
rules are each host's iptables, built from what the EC2 emulator holds. Nothing here passes
through a shared home, a shared network, or a private address the laptop could not reach.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.harness.ec2 import FAKE_CREDENTIALS, Emulator
from tests.harness.netns import missing_requirements
from tests.harness.power import Boot
from tests.harness.world import World
from tests.integration.helpers import LAUNCHED, cmdline, leftovers, read_until, wait_no_leftovers

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(missing_requirements() is not None,
                                 reason=str(missing_requirements()))]
CPUDIST = [sys.executable, "-m", "cpudist.cli"]
# Three hosts: a head and two other nodes, so the hostfile, the distinct hosts of a run and
# staging's fan-out from the head are about several nodes, the spot node replaced (1) and the node
# that vanishes (1, again: neither the head nor the last) are each one of two, and a killed rank (on
# node 2) is not the head's. A fourth host checked nothing more and added a rank, and its imports,
# to every run of this file.
NODES = 3
VANISHES = 1


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    w = World(NODES, tmp_path_factory.mktemp("world"), prefix=f"cpe{os.getpid() % 10000}")
    w.up()
    try:
        yield w
    finally:
        w.down()


@pytest.fixture(scope="module")
def cloud(world: World, shared_data: Path) -> Iterator[dict[str, Any]]:
    """The emulator driving the world, a VPC, an image, and the laptop's data and environment."""
    os.environ.update(FAKE_CREDENTIALS)
    emu = Emulator().start()
    emu.reset()
    world.attach(emu)
    ec2 = boto3.client("ec2", endpoint_url=emu.url, region_name="us-east-1")
    _, subnet = world.create_vpc(ec2)
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    shutil.copytree(shared_data / "glue" / "MRPC", world.operator_path("data/MRPC"))
    env = {**FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": emu.url}
    try:
        yield {"emu": emu, "ec2": ec2, "subnet": subnet, "ami": ami, "env": env}
    finally:
        emu.stop()


def laptop(world: World, cloud: dict[str, Any], *args: str, timeout: float = 600) -> Any:
    return world.operator_run([*CPUDIST, *args], env=cloud["env"], timeout=timeout)




def start_long_run(world: World, cloud: dict[str, Any]) -> subprocess.Popen[str]:
    """A run from the laptop that trains long enough to be stopped: returns once step 3 is
    reported."""
    proc = world.operator_popen([*CPUDIST, *RUN, "--max-steps", "5000", "--log-every", "1",
                                 "--no-eval"],
                                env=cloud["env"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    read_until(proc, "step 3/")
    return proc


RUN = ["run", "mrpc", "--np", str(NODES), "--ppn", "1", "--cluster", "e2e", "--data-dir",
       "/srv/cpd-operator/data/MRPC", "--model", "tiny", "--remote-python", sys.executable,
       # tokenize less: no check here is about the rows (the whole folder is staged)
       "--max-train-samples", "480"]


@pytest.fixture(scope="module")
def cluster(world: World, cloud: dict[str, Any]) -> Iterator[str]:
    """The cluster, brought up through a slow boot: pending for longer than `up`'s first polls, then
    sshd refusing and resetting connections for longer than its first banner probes."""
    world.set_boot(Boot(pending_s=3.0, refusing_s=3.0, no_banner_s=4.0))
    try:
        up = laptop(world, cloud, "cluster", "up", "--name", "e2e", "--nodes", str(NODES),
                    "--image", cloud["ami"], "--subnet", cloud["subnet"], "--user", "root",
                    "--ssh-cidr", world.ssh_cidr, "--yes", "--instance-type", "c6i.large",
                    "--boot-timeout", "60")
    finally:
        world.set_boot(Boot())
    assert up.returncode == 0, up.stderr
    yield up.stdout
    laptop(world, cloud, "cluster", "down", "--name", "e2e", "--yes")


def test_up_run_report_down_from_the_laptop(world: World, cloud: dict[str, Any],
                                            cluster: str) -> None:
    private = [world.hosts.private_addr(i) for i in range(NODES)]
    assert cluster.split() == private  # the hostfile between nodes holds private addresses
    status = laptop(world, cloud, "cluster", "status", "--name", "e2e", "--json")
    nodes = json.loads(status.stdout)["nodes"]
    assert [n["public_ip"] for n in nodes] == [world.hosts.public_addr(i) for i in range(NODES)]

    run = laptop(world, cloud, *RUN, "--max-steps", "3", "--max-eval-samples", "64", "--output-dir",
                 "/srv/cpd-operator/runs/first")
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    result = json.loads(world.operator_path("runs/first/result.json").read_text())
    # 3 distinct hosts
    assert sorted(result["nodes"]) == sorted(world.hosts.name(i) for i in range(NODES))
    assert result["cluster"] == "e2e" and result["usd_per_hour"] > 0
    assert result["staging"]["sent_to_head_bytes"] > 0 and result["staging"]["copies_to_nodes"] > 0
    for name in ("steps.jsonl", "ranks.log", "command.txt"):
        assert world.operator_path(f"runs/first/{name}").stat().st_size > 0
    ledger = world.operator_path(".cpudist/results.jsonl").read_text().splitlines()
    assert len(ledger) == 1 and json.loads(ledger[0])["run_dir"] == "/srv/cpd-operator/runs/first"
    report = laptop(world, cloud, "report", "--format", "json")
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)[0]["cost_usd"] > 0
    assert wait_no_leftovers(world.hosts, names=LAUNCHED) == []

    # The same run again: every input is already on every node, so nothing is staged.
    again = laptop(world, cloud, *RUN, "--max-steps", "3", "--max-eval-samples", "64",
                   "--output-dir", "/srv/cpd-operator/runs/second")
    assert again.returncode == 0, again.stderr[-4000:]
    staging = json.loads(world.operator_path("runs/second/result.json").read_text())["staging"]
    assert staging["sent_to_head_bytes"] == 0 and staging["copies_to_nodes"] == 0


def test_a_killed_rank_fails_the_run_clearly_and_leaves_nothing(world: World, cloud: dict[str, Any],
                                                                cluster: str) -> None:
    proc = start_long_run(world, cloud)
    victim = next(pid for pid in world.hosts.pids(2) if "cpudist.rank" in cmdline(pid))
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    out, _ = proc.communicate(timeout=120)
    assert time.monotonic() - killed < 60
    assert proc.returncode == 1
    last = out.strip().splitlines()[-1]
    assert last.startswith("Error: ") and "failed" in last
    assert wait_no_leftovers(world.hosts, names=LAUNCHED) == []


# SIGINT (Ctrl-C) is not run here: on the laptop, SIGINT, SIGTERM and SIGHUP raise the same
# KeyboardInterrupt (cpudist/interrupts.py; tests/unit/test_interrupts.py checks each in a real
# process), so SIGTERM, which Python alone would not turn into a clean stop, stands for the three
# from there on. SIGKILL is another path: the laptop's connection drops and the agent on the head
# stops the ranks.
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_stopping_the_laptop_stops_every_rank(world: World, cloud: dict[str, Any], cluster: str,
                                              how: signal.Signals) -> None:
    """A kill (or Ctrl-C, as above), or a laptop that vanishes (SIGKILL: its connection drops) leave
    no rank behind."""
    proc = start_long_run(world, cloud)
    assert len(leftovers(world.hosts, LAUNCHED)) >= NODES
    proc.send_signal(how)
    out, _ = proc.communicate(timeout=120)
    # 130: stopped
    assert proc.returncode == (-signal.SIGKILL if how == signal.SIGKILL else 130), out[-4000:]
    if how != signal.SIGKILL:
        # every rank stopped; after a checkpoint, the line says where to go on from (the run
        # checkpoints on a stop)
        stopped = "Error: interrupted: all ranks were stopped on every node"
        assert (f"{stopped}. Re-run the command" in out
                or (f"{stopped}; the ranks stopped at step " in out
                    and "--resume auto" in out)), out[-4000:]
    assert wait_no_leftovers(world.hosts, names=LAUNCHED) == []


def test_a_reclaimed_spot_node_is_replaced_and_the_run_resumes(world: World, cloud: dict[str, Any],
                                                               cluster: str,
                                                               tmp_path: Path) -> None:
    """AWS's part is played by the test: a terminate notice for node 1 (IMDSv2, answered per node
    address), then node 1's instance is terminated; the laptop replaces it with `cluster up` and
    resumes.

    The notice is up before the run starts: node 1's first poll (when training starts) sees it.
    Posting it on a progress line instead raced a fast CPU (40 steps in 30 s on AMX: CI's run ended
    first).
    """
    head, victim = world.hosts.private_addr(0), world.hosts.private_addr(1)
    control = tmp_path / "imds-control"
    control.write_text(f"{victim} terminate\n")  # the two-minute notice, for node 1 only
    imds = subprocess.Popen(world.hosts.exec_argv(0,
                                                  [sys.executable, "-m", "tests.harness.imds",
                                                   "--port", "8169", "--control", str(control)]),
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
                            stdout=subprocess.PIPE,
                            text=True)
    try:
        read_until(imds, "IMDS on", timeout=60)
        ec2 = cloud["ec2"]
        before = json.loads(laptop(world, cloud, "cluster", "status", "--name", "e2e",
                                   "--json").stdout)["nodes"]
        proc = world.operator_popen([*CPUDIST, *RUN, "--max-steps", "40", "--log-every", "1",
                                     "--no-eval", "--imds-endpoint", f"http://{head}:8169",
                                     "--on-preemption", "resume", "--output-dir",
                                     "/srv/cpd-operator/runs/spot"],
                                    env=cloud["env"], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT)
        out = read_until(proc, "recovering (1/3)", timeout=300)
        ec2.terminate_instances(InstanceIds=[before[1]["instance_id"]])  # ... and AWS takes it
        control.write_text("")
        out += read_until(proc, None, timeout=420)
        proc.wait(timeout=60)
        text = "".join(out)
        assert proc.returncode == 0, text[-6000:]
        # the whole output on failure: pytest shortens a long string in the middle, where these
        # lines are
        assert ("spot interruption notice (terminate" in text
                and "replacing them" in text), text[-6000:]
        result = json.loads(world.operator_path("runs/spot/result.json").read_text())
        assert result["recoveries"] == 1 and result["time_lost_s"] > 0 and result["parts"] == 2
        assert 1 <= result["resumed_from_step"] < 40 and result["steps"] == 40
        steps = world.operator_path("runs/spot/steps.jsonl").read_text().splitlines()
        assert [json.loads(line)["step"] for line in steps] == list(range(1, 41))
        after = json.loads(laptop(world, cloud, "cluster", "status", "--name", "e2e",
                                  "--json").stdout)["nodes"]
        live = [n for n in after if n["state"] == "running"]
        assert (len(live) == NODES
                and before[1]["instance_id"] not in {n["instance_id"] for n in live})
        assert wait_no_leftovers(world.hosts, names=LAUNCHED) == []
    finally:
        imds.terminate()
        imds.wait(timeout=30)


def test_a_lost_head_without_an_s3_copy_stops_the_resume_in_one_line(
        world: World, cloud: dict[str, Any], cluster: str, tmp_path: Path) -> None:
    """The head gets the notice and goes, its disk and the checkpoint with it: the recovery replaces
    it, and the resume, finding no checkpoint, says so naming --checkpoint-s3 instead of training
    from step 0."""
    head, server = world.hosts.private_addr(0), 2  # the metadata service on a node that stays
    control = tmp_path / "imds-control"
    control.write_text(f"{head} terminate\n")
    serve = [sys.executable, "-m", "tests.harness.imds", "--port", "8169",
             "--control", str(control)]
    imds = subprocess.Popen(world.hosts.exec_argv(server, serve), stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    try:
        read_until(imds, "IMDS on", timeout=60)
        status = laptop(world, cloud, "cluster", "status", "--name", "e2e", "--json")
        before = json.loads(status.stdout)["nodes"]
        proc = world.operator_popen(
            [*CPUDIST, *RUN, "--max-steps", "40", "--log-every", "1", "--no-eval",
             "--imds-endpoint", f"http://{world.hosts.private_addr(server)}:8169",
             "--on-preemption", "resume", "--output-dir", "/srv/cpd-operator/runs/headless"],
            env=cloud["env"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out = read_until(proc, "recovering (1/3)", timeout=300)
        cloud["ec2"].terminate_instances(InstanceIds=[before[0]["instance_id"]])  # AWS takes it
        control.write_text("")
        out += read_until(proc, None, timeout=420)
        proc.wait(timeout=60)
        text = "".join(out)
        last = text.strip().splitlines()[-1]
        assert proc.returncode == 2 and "cannot resume: no checkpoint of run" in last, text[-6000:]
        assert "not starting over from step 0" in last and "--checkpoint-s3" in last, text[-6000:]
        assert "starting from step 0" not in text and "replacing them" in text, text[-6000:]
        assert wait_no_leftovers(world.hosts, names=LAUNCHED) == []
    finally:
        imds.terminate()
        imds.wait(timeout=30)


NOTICE_NODE_LOSS_S = 60  # #23 asks for 30 s; twice that for a busy CI machine


def test_a_node_that_vanishes_mid_run_fails_the_run_naming_it(world: World, cloud: dict[str, Any],
                                                              cluster: str) -> None:
    """AWS takes node 1 away mid-run (its host goes silent and everything on it dies): the laptop's
    run ends within a bounded time with one line naming the node. Next to last: it leaves the
    cluster a node short."""
    nodes = json.loads(laptop(world, cloud, "cluster", "status", "--name", "e2e",
                              "--json").stdout)["nodes"]
    proc = start_long_run(world, cloud)
    cloud["ec2"].terminate_instances(InstanceIds=[nodes[VANISHES]["instance_id"]])
    gone = time.monotonic()
    try:
        out, _ = proc.communicate(timeout=NOTICE_NODE_LOSS_S)
    except subprocess.TimeoutExpired:
        proc.kill()  # the laptop vanishes too: its agent on the head stops the ranks that are left
        proc.communicate()
        raise
    took = time.monotonic() - gone
    last = out.strip().splitlines()[-1]
    print(f"{last}\n(the run ended {took:.1f}s after node {VANISHES} was terminated)")
    names = (world.hosts.private_addr(VANISHES), world.hosts.public_addr(VANISHES),
             world.hosts.name(VANISHES), nodes[VANISHES]["instance_id"])
    assert proc.returncode == 1, out[-4000:]
    assert last.startswith("Error: ") and any(n in last for n in names), out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    assert took < NOTICE_NODE_LOSS_S
    assert wait_no_leftovers(world.hosts, names=LAUNCHED) == []


def test_down_leaves_nothing_in_ec2_nor_on_the_laptop(world: World, cloud: dict[str, Any],
                                                      cluster: str) -> None:
    down = laptop(world, cloud, "cluster", "down", "--name", "e2e", "--yes")
    assert down.returncode == 0, down.stderr
    ec2 = cloud["ec2"]
    tagged = ec2.describe_instances(Filters=[{"Name": "tag:cpudist:cluster",
                                              "Values": ["e2e"]}])["Reservations"]
    assert all(i["State"]["Name"] == "terminated" for r in tagged for i in r["Instances"])
    assert [g for g in ec2.describe_security_groups()["SecurityGroups"]
            if g["GroupName"] == "cpudist-e2e"] == []
    assert (ec2.describe_key_pairs()["KeyPairs"] == []
            and ec2.describe_placement_groups()["PlacementGroups"] == [])
    # key and pinned host keys gone too
    assert not world.operator_path(".cpudist/clusters/e2e").exists()
    assert wait_no_leftovers(world.hosts, names=LAUNCHED) == []


def test_up_fails_and_rolls_back_when_nodes_cannot_reach_each_other(world: World,
                                                                    cloud: dict[str, Any]) -> None:
    """A network ACL that drops private traffic: SSH from the laptop works, but no job could run."""
    world.partitioned = True
    try:
        up = laptop(world, cloud, "cluster", "up", "--name", "cut", "--nodes", "2", "--image",
                    cloud["ami"], "--subnet", cloud["subnet"], "--user", "root", "--ssh-cidr",
                    world.ssh_cidr, "--yes", "--instance-type", "c6i.large", "--boot-timeout", "60")
    finally:
        world.partitioned = False
    assert (up.returncode == 1 and "cannot reach node" in up.stderr
            and "over its private address" in up.stderr)
    assert "cluster cut is up" not in up.stderr
    live = [i for r in cloud["ec2"].describe_instances()["Reservations"] for i in r["Instances"]
            if i["State"]["Name"] != "terminated"]
    assert live == [] and not world.operator_path(".cpudist/clusters/cut").exists()
