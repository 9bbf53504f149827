"""`cpudist run --elastic` on three on-prem namespace hosts with a real sshd each. From the laptop
(its own home and data, the head reached by its public address): one node's rank is killed, then
another node's link is cut silently and brought back; the other nodes train on without a restart,
each lost node is started again and joins with a live peer's weights, and the run ends with one
record of who trained which steps and the model home. Every node and the Lighthouse lost at once
end the run; the same command with --resume auto goes on from each node's own checkpoint. The
chaos test draws one of the first faults, two nodes lost one after the other, or the head's own
rank killed, at a seeded step. On the head as typed: the head's Lighthouse lost ends the run in one
line.

Needs root (tests/harness/setup.sh installs the rest; CI runs as root) and torchft (the test
extra).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from tests.harness.netns import NetnsCluster, missing_requirements
from tests.harness.world import World
from tests.integration.helpers import (
    CPUDIST,
    cmdline,
    kill_tree,
    on_prem_site,
    read_until,
    wait_no_leftovers,
)

# alone: a node that starts late under a loaded machine joins at a late step, and the faults need
# the run's steps after it
pytestmark = [pytest.mark.slow, pytest.mark.alone,
              pytest.mark.skipif(missing_requirements() is not None,
                                 reason=str(missing_requirements()))]
NODES = 3
# Each step waits for the Lighthouse's quorum: a run of STEPS lasts minutes on any machine, several
# times what both faults take (a kill, its node's return, a cut link its ssh notices, RETRY_S, a
# start): on a 2-core machine they were over by step ~1030, where 5000 steps took 380 s.
STEPS = 3000


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> Iterator[World]:
    with on_prem_site(NODES, tmp_path_factory.mktemp("elastic"), "cel",
                      shared_data / "glue" / "MRPC") as w:
        yield w


def ranks(c: NetnsCluster, i: int) -> list[int]:
    """The trainer's processes on host i."""
    return [pid for pid in c.pids(i) if "cpudist.rank" in cmdline(pid).split()[2:3]]




def lighthouses(c: NetnsCluster) -> list[int]:
    """The Lighthouse's processes on the head (itself, not its tether)."""
    return [pid for pid in c.pids(0)
            if "torchft_lighthouse" in cmdline(pid) and "tether" not in cmdline(pid)]


def steps(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]


def laptop_argv(hosts: NetnsCluster, out: str, steps: int = STEPS) -> list[str]:
    """`cpudist run --elastic` as the laptop types it: the head by its public address, the laptop's
    own hostfile, key and data."""
    return [*CPUDIST, "run", "mrpc", "--elastic", "--hostfile", "/srv/cpd-operator/hosts",
            "--head", hosts.public_addr(0), "--user", "root", "--identity",
            "/srv/cpd-operator/.ssh/id_ed25519", "--remote-python", sys.executable, "--np",
            str(NODES), "--ppn", "1", "--data-dir", "/srv/cpd-operator/data/MRPC", "--model",
            "tiny", "--max-train-samples", "792", "--batch-size", "8", "--max-steps", str(steps),
            "--log-every", "1", "--max-eval-samples", "64", "--output-dir",
            f"/srv/cpd-operator/runs/{out}"]


def cut(hosts: NetnsCluster, i: int, down: bool) -> None:
    """Host i silent on the site's network (no FIN or RST reaches anyone), or back."""
    subprocess.run(["ip", "-n", hosts.name(i), "link", "set", "eth0", "down" if down else "up"],
                   check=True)


def one_model(site: World, out: str, text: str, code: int | None,
              returned: tuple[int, ...], total: int = STEPS) -> dict[str, Any]:
    """The run ended 0 with each step logged once and its full global batch, and the nodes in
    `returned` (lost and back) trained to the last step in the run's folder on their own disks,
    with the weights that came home to the bit: one model. Returns result.json."""
    assert code == 0, text[-4000:]
    assert "done: mrpc" in text, text[-3000:]
    folder = site.operator_path(f"runs/{out}")
    result: dict[str, Any] = json.loads((folder / "result.json").read_text())
    assert result["steps"] == total and result["world_size"] == NODES
    assert sorted(result["nodes"]) == sorted(site.hosts.name(i) for i in range(NODES))
    # the head logged each step once, in order, from the step its log begins at (a head rank
    # started again keeps what it logged): no step's rows counted twice, none skipped
    logged = [s["step"] for s in steps(folder)]
    assert logged == list(range(logged[0], total + 1))
    assert {s["samples"] for s in steps(folder)} == {8 * NODES}  # the global batch, whoever trained
    home = load_file(str(folder / "model" / "model.safetensors"))
    on_head = Path(result["staging"]["remote_run_dir"]).relative_to(Path.home() / ".cpudist")
    for i in returned:
        theirs = site.hosts.node_dir(i) / "dot-cpudist" / on_head / "nodes" / f"node{i}"
        assert steps(theirs)[-1]["step"] == total, i
        weights = load_file(str(theirs / "model" / "model.safetensors"))
        assert weights.keys() == home.keys(), i
        assert all(torch.equal(weights[k], home[k]) for k in home), i
    assert wait_no_leftovers(site.hosts) == []
    return result


def came_back(result: dict[str, Any], i: int) -> bool:
    """Whether node i joined the run again after its first join, and trained at its end with all
    the others (result.json's membership)."""
    changes = result["membership"]
    joins = sum(f"node{i}" in c["joined"] for c in changes)
    return joins >= 2 and changes[-1]["nodes"] == [f"node{n}" for n in range(NODES)]


def test_from_the_laptop_a_killed_node_and_a_cut_link_cost_the_others_no_restart(
        site: World) -> None:
    hosts = site.hosts
    proc = site.operator_popen(laptop_argv(hosts, "elastic"), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    seen: list[str] = []
    try:
        seen += read_until(proc, f"training on {NODES} of {NODES} node(s)", timeout=300)
        seen += read_until(proc, "[cpudist] step ")  # a step all three trained
        killed = ranks(hosts, 2)
        assert len(killed) == 1, "".join(seen)[-3000:]
        os.kill(killed[0], signal.SIGKILL)
        # the others may go on without it, or (a quorum it was counted in, waited out) find it
        # back already: either way a membership change at all the nodes follows its restart
        seen += read_until(proc, f"{hosts.name(2)} left the run", timeout=120)
        seen += read_until(proc, f"starting {hosts.name(2)} again", timeout=60)
        seen += read_until(proc, f"training on {NODES} of {NODES} node(s)", timeout=180)
        cut(hosts, 1, down=True)
        try:
            seen += read_until(proc, f"training on {NODES - 1} of {NODES} node(s)", timeout=120)
            seen += read_until(proc, f"{hosts.name(1)} left the run", timeout=120)
        finally:
            cut(hosts, 1, down=False)
        seen += read_until(proc, f"training on {NODES} of {NODES} node(s)", timeout=300)
        seen += read_until(proc, None, timeout=900)
        proc.wait(60)
    finally:
        kill_tree(proc)
    result = one_model(site, "elastic", "".join(seen), proc.returncode, returned=(1, 2))
    # both nodes lost and back in the record, the cut one's loss too: the run never restarted
    assert came_back(result, 1) and came_back(result, 2), result["membership"]
    assert any("node1" in c["left"] for c in result["membership"]), result["membership"]
    out = site.operator_path("runs/elastic")
    report = site.operator_run([*CPUDIST, "report", str(out / "result.json")], timeout=120)
    assert "Elastic runs" in report.stdout and "node1 left" in report.stdout, report


def test_from_the_laptop_every_node_lost_at_once_goes_on_from_each_nodes_checkpoint(
        site: World) -> None:
    """Every node's rank and the head's Lighthouse killed at once: the run fails; the same command
    with --resume auto starts every node from its own checkpoint on its own disk (the head's in the
    run's folder, the others' under nodes/), and the run ends with each step logged once and one
    model home."""
    hosts, total, every = site.hosts, 400, 50
    argv = [*laptop_argv(hosts, "lost-all", total), "--checkpoint-every", str(every)]
    proc = site.operator_popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seen: list[str] = []
    try:
        seen += read_until(proc, f"checkpoint at step {2 * every}:", timeout=300)
        house = lighthouses(hosts)
        lost = [pid for i in range(NODES) for pid in ranks(hosts, i)]
        assert len(house) == 1 and len(lost) == NODES, "".join(seen)[-3000:]
        for pid in (*house, *lost):
            os.kill(pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=180)
    finally:
        kill_tree(proc)
    text = "".join(seen) + out
    assert proc.returncode != 0, text[-3000:]
    assert wait_no_leftovers(hosts) == []
    again = site.operator_popen([*argv, "--resume", "auto"], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
    try:
        resumed = "".join(read_until(again, None, timeout=600))
        again.wait(60)
    finally:
        kill_tree(again)
    # each node went on from a checkpoint of its own (none at the step 0 a fresh start is at)
    starts = [line for line in resumed.splitlines() if "training: " in line]
    assert starts and f"training: {total} steps, from step " in starts[0], resumed[-3000:]
    result = one_model(site, "lost-all", resumed, again.returncode, returned=(1, 2),
                       total=total)
    logged = [s["step"] for s in steps(site.operator_path("runs/lost-all"))]
    assert logged == list(range(1, total + 1))  # the head's record is whole across the parts
    assert all(f"node{i}" in result["membership"][-1]["nodes"] for i in range(NODES))


def test_the_heads_lighthouse_lost_ends_the_run_in_one_line_leaving_nothing(
        site: World, shared_data: Path, tmp_path: Path) -> None:
    """The head's node lost takes its Lighthouse: no quorum can form, so the run ends (it cannot go
    on, and does not hang); every node's rank is stopped."""
    hosts = site.hosts
    hostfile = site.state / "site-hostfile"
    argv = [*CPUDIST, "run", "mrpc", "--elastic", "--hostfile", str(hostfile), "--np", str(NODES),
            "--ppn", "1", "--data-dir", str(shared_data / "glue" / "MRPC"), "--model", "tiny",
            "--max-train-samples", "64", "--batch-size", "8", "--max-steps", "100000",
            "--log-every", "1", "--no-eval", "--output-dir", str(tmp_path / "run")]
    proc = subprocess.Popen(hosts.exec_argv(0, argv), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        seen = read_until(proc, f"training on {NODES} of {NODES} node(s)")
        house = lighthouses(hosts)
        assert len(house) == 1, "".join(seen)[-3000:]
        os.kill(house[0], signal.SIGKILL)
        out, _ = proc.communicate(timeout=180)
    finally:
        kill_tree(proc)
    assert proc.returncode == 1, out[-3000:]
    assert "the Lighthouse on the head ended: the run cannot go on" in out
    assert out.strip().splitlines()[-1].startswith(
        f"Error: the job failed on {hosts.name(0)}'s Lighthouse"), out[-3000:]
    assert wait_no_leftovers(hosts) == []


# Item 5 of #46, chaos: at a step drawn from a seed, a fault drawn from the same seed hits the
# elastic run from the laptop. Whatever it is, the run goes on without a restart and ends with one
# model (one_model). CPUDIST_CHAOS_SEEDS=0,1,2,3 draws each once (seed s: ELASTIC_FAULTS[s % 4]);
# without it, seed DEFAULT_SEED alone.
ELASTIC_FAULTS = ("kill-node", "cut-node", "two-in-turn", "kill-head-rank")
DEFAULT_SEED = 3


@dataclass(frozen=True)
class Draw:
    seed: int
    fault: str
    step: int  # the step whose progress line sets the fault off
    node: int  # the node it hits (kill-node, cut-node)

    @classmethod
    def of(cls, seed: int) -> Draw:
        rng = random.Random(seed)
        return cls(seed, ELASTIC_FAULTS[seed % len(ELASTIC_FAULTS)], rng.randint(20, 300),
                   rng.choice((1, 2)))


def chaos_seeds() -> list[int]:
    given = os.environ.get("CPUDIST_CHAOS_SEEDS", "").strip()
    return [int(s) for s in given.split(",")] if given else [DEFAULT_SEED]


def kill_rank(hosts: NetnsCluster, i: int) -> None:
    found = ranks(hosts, i)
    assert len(found) == 1, (i, found)
    os.kill(found[0], signal.SIGKILL)


@pytest.mark.parametrize("seed", chaos_seeds())
def test_a_drawn_elastic_fault_costs_no_restart_and_leaves_one_model(site: World,
                                                                     seed: int) -> None:
    """A node's rank killed, a node's link cut, two nodes lost one after the other, or the head's
    own rank killed (its Lighthouse stays: the other nodes go on, and the head's rank joins again
    like any node's, healing from a peer)."""
    draw, hosts = Draw.of(seed), site.hosts
    say = f"seed {seed} ({draw}); reproduce with CPUDIST_CHAOS_SEEDS={seed}"
    print(say)
    out, name = f"chaos-{seed}", hosts.name(draw.node)
    proc = site.operator_popen(laptop_argv(hosts, out), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    seen: list[str] = []
    back = f"training on {NODES} of {NODES} node(s)"
    try:
        seen += read_until(proc, back, timeout=300)
        seen += read_until(proc, f"step {draw.step}/{STEPS}", timeout=300)
        if draw.fault == "kill-node":
            kill_rank(hosts, draw.node)
            returned: tuple[int, ...] = (draw.node,)
        elif draw.fault == "cut-node":
            cut(hosts, draw.node, down=True)
            try:
                seen += read_until(proc, f"{name} left the run", timeout=120)
            finally:
                cut(hosts, draw.node, down=False)
            returned = (draw.node,)
        elif draw.fault == "two-in-turn":
            kill_rank(hosts, 1)
            seen += read_until(proc, f"{hosts.name(1)} left the run", timeout=120)
            kill_rank(hosts, 2)
            returned = (1, 2)
        else:  # kill-head-rank
            kill_rank(hosts, 0)
            returned = ()
        seen += read_until(proc, back, timeout=300)
        seen += read_until(proc, None, timeout=900)
        proc.wait(60)
    finally:
        kill_tree(proc)
    text = "".join(seen)
    lost = [0] if draw.fault == "kill-head-rank" else list(returned)
    for i in lost:
        assert f"{hosts.name(i)} left the run" in text, f"{say}\n{text[-4000:]}"
        assert f"starting {hosts.name(i)} again" in text, f"{say}\n{text[-4000:]}"
    result = one_model(site, out, text, proc.returncode, returned)
    # the head's record holds the steps before the fault too (a head started again keeps them)
    assert steps(site.operator_path(f"runs/{out}"))[0]["step"] <= draw.step, say
    assert all(came_back(result, i) for i in lost), (say, result["membership"])
