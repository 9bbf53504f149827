"""--elastic's trainer on loopback: three one-rank nodes and torchft's own Lighthouse train what one
rank trains on their global batch.

The ranks are started as separate processes with the environment an elastic launch gives each node
(a world of 1, the Lighthouse, the planned node count), so what is checked is the trainer's part.
Nodes lost and back, through the launch as typed: tests/integration/test_elastic_hosts.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from cpudist.config import TrainConfig, to_argv
from cpudist.launch.tools import free_port
from cpudist.results.launched import RANK_REPORT
from cpudist.strategies import SyncSpec
from cpudist.train.checkpoint_meta import complete_checkpoints, step_of
from cpudist.wire import elastic, exits, names
from tests.harness.imds import ImdsServer
from tests.integration.helpers import kill_tree, wait_for

NODES, STEPS, TIMEOUT_S = 3, 20, 20


def lighthouse(tmp_path: Path, least: int = 1) -> tuple[subprocess.Popen[str], str]:
    """torchft's Lighthouse: a node silent for 1 s leaves the quorum; one waits 1 s for others to
    join; no quorum of fewer than `least` nodes."""
    port = free_port()
    log = (tmp_path / "lighthouse.log").open("w")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "torchft_lighthouse"),
                             "--min_replicas", str(least), "--bind", f"[::]:{port}",
                             "--quorum_tick_ms", "100", "--join_timeout_ms", "1000",
                             "--heartbeat_timeout_ms", "1000"],
                            stdout=log, stderr=subprocess.STDOUT, text=True)
    return proc, f"http://127.0.0.1:{port}"


def config(out: Path, shared_data: Path, **over: Any) -> TrainConfig:
    """The tiny model on 792 MRPC rows (33 whole global batches of 3 x 8), each node on 1 thread."""
    return TrainConfig(**{"task": "mrpc", "output_dir": str(out), "model": "tiny",
                          "data_dir": str(shared_data / "glue" / "MRPC"), "max_steps": STEPS,
                          "batch_size": 8, "precision": "fp32", "log_every": 1, "do_eval": False,
                          "lr": 1e-3, "max_train_samples": 792, "dist_timeout_s": TIMEOUT_S,
                          "elastic": True, **over})


def rank(cfg: TrainConfig, **env: str) -> subprocess.Popen[str]:
    """One rank in a world of its own, as an elastic launch starts each node's."""
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "OMP_NUM_THREADS": "1", **env}
    log = Path(cfg.output_dir).with_suffix(".log").open("w")  # a file: nobody reads a pipe
    return subprocess.Popen([sys.executable, "-m", "cpudist.rank", *to_argv(cfg)], env=env,
                            text=True, stdout=log, stderr=subprocess.STDOUT)


def node(i: int, out: Path, address: str, shared_data: Path, **over: Any) -> subprocess.Popen[str]:
    """Node i of NODES in the elastic run whose Lighthouse is at `address`."""
    return rank(config(out, shared_data, **over), **{
        elastic.LIGHTHOUSE: address, elastic.REPLICA_ID: f"node{i}", elastic.REPLICAS: str(NODES),
        elastic.ADVERTISE: "127.0.0.1"})


def said(out: Path) -> str:
    """The last lines a node printed."""
    path = out.with_suffix(".log")
    return "\n".join(path.read_text().splitlines()[-15:]) if path.exists() else "(nothing)"


def steps(out: Path) -> list[dict[str, Any]]:
    """The steps a node logged (whole lines only: the node may be writing the last)."""
    path = out / names.STEPS
    return [json.loads(line) for line in path.read_text().split("\n")[:-1]] if path.exists() else []


def weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(out / "model" / "model.safetensors"))


@pytest.mark.timeout(300)
def test_three_elastic_nodes_train_what_one_rank_trains_on_their_global_batch(
        shared_data: Path, tmp_path: Path) -> None:
    """Whoever takes part in a step, its global batch is cut among the participants and averaged:
    the weights equal one rank's on the same 24-row batches (no dropout, the lr unscaled), up to
    the order of float sums. The word embedding goes by its touched rows, as across nodes. A
    missing 1/n, a row trained twice or a share left out moves them by about the learning rate.
    The first node up waits for the others: every step has all three."""
    # fp32 on the wire (auto sends bf16 across nodes, which rounds): the sums' order is what is left
    same = {"dropout": 0.0, "lr_scaling": "none", "dist_timeout_s": 120,
            "sync": SyncSpec(grad_compression="none")}
    house, address = lighthouse(tmp_path)
    outs = [tmp_path / f"node{i}" for i in range(NODES)]
    # node0 first, the others once it waits for them: the first node up trains nothing alone
    procs = [node(0, outs[0], address, shared_data, **same)]
    try:
        wait_for(lambda: ('"event": "waiting"' in outs[0].with_suffix(".log").read_text()
                          or procs[0].poll() is not None), 120, "node0 to start")
        assert procs[0].poll() is None, f"node0 did not wait: {said(outs[0])}"
        procs += [node(i, out, address, shared_data, **same) for i, out in enumerate(outs)
                  if i > 0]
        procs.append(rank(config(tmp_path / "one", shared_data, batch_size=8 * NODES,
                                 elastic=False, **same)))
        for proc, out in zip(procs, [*outs, tmp_path / "one"], strict=True):
            assert proc.wait(240) == 0, said(out)
    finally:
        for proc in (*procs, house):
            kill_tree(proc)
    reference = weights(tmp_path / "one")
    for out in outs:
        mine = weights(out)
        worst = max(float((mine[k] - reference[k]).abs().max()) for k in reference)
        assert worst < 1e-4, (out, worst)
    assert len(steps(tmp_path / "one")) == STEPS
    # the record names who trained: all three from the first step, nobody left
    membership = json.loads((outs[0] / RANK_REPORT).read_text())["membership"]
    everyone = [f"node{i}" for i in range(NODES)]
    assert [(c["step"], c["nodes"], c["joined"], c["left"]) for c in membership] \
        == [(0, everyone, everyone, [])], membership


@pytest.mark.timeout(500)
def test_every_node_lost_at_once_goes_on_from_the_nodes_checkpoints(shared_data: Path,
                                                                     tmp_path: Path) -> None:
    """The nodes and the Lighthouse killed at once, once every node holds a checkpoint and long
    before the run's end; the same command with --resume auto ends with the weights of the same
    run untouched (a step trained twice, or a node's step, optimizer or schedule not put back, moves
    them), each step logged once, and the record going on across the restart. Every step is
    trained by all 3 nodes in both runs (no quorum of fewer), so their sums agree bit for bit."""
    total = 200  # a step takes tens of ms here: the kill lands long before the end
    same = {"dropout": 0.0, "max_steps": total}
    (tmp_path / "straight").mkdir()
    house, address = lighthouse(tmp_path / "straight", least=NODES)
    straight = [tmp_path / "straight" / f"node{i}" for i in range(NODES)]
    procs = [node(i, out, address, shared_data, **same) for i, out in enumerate(straight)]
    try:
        for proc, out in zip(procs, straight, strict=True):
            assert proc.wait(300) == 0, said(out)
    finally:
        for proc in (*procs, house):
            kill_tree(proc)
    outs = [tmp_path / f"node{i}" for i in range(NODES)]
    house, address = lighthouse(tmp_path, least=NODES)
    procs = [node(i, out, address, shared_data, checkpoint_every=10, **same)
             for i, out in enumerate(outs)]

    def newest(out: Path) -> int | None:
        found = complete_checkpoints(out / "checkpoints")
        return step_of(found[0].name) if found else None

    try:
        wait_for(lambda: all(newest(out) for out in outs), 200, "a checkpoint on every node",
                 lambda: [said(out) for out in outs])
        for proc in (*procs, house):
            kill_tree(proc)
        assert not any((out / "model").exists() for out in outs), "the run ended before the kill"
        cut = [newest(out) for out in outs]
        house, address = lighthouse(tmp_path, least=NODES)
        procs = [node(i, out, address, shared_data, checkpoint_every=10, resume="auto", **same)
                 for i, out in enumerate(outs)]
        for proc, out in zip(procs, outs, strict=True):
            assert proc.wait(300) == 0, said(out)
    finally:
        for proc in (*procs, house):
            kill_tree(proc)
    reference = weights(straight[0])
    for out in outs:
        mine = weights(out)
        worst = max(float((mine[k] - reference[k]).abs().max()) for k in reference)
        assert worst < 1e-6, (out, worst, cut)
    assert "resuming from" in outs[0].with_suffix(".log").read_text()
    assert [s["step"] for s in steps(outs[0])] == list(range(1, total + 1)), cut
    # the record from step 0 on, every node joining again after the restart, all there at the end
    membership = json.loads((outs[0] / RANK_REPORT).read_text())["membership"]
    everyone = [f"node{i}" for i in range(NODES)]
    assert membership[0]["step"] == 0, membership
    again = min(c for c in cut if c is not None)
    assert {n for c in membership if c["step"] >= again for n in c["joined"]} == set(everyone)
    assert membership[-1]["nodes"] == everyone, membership


@pytest.mark.timeout(300)
def test_a_spot_notice_takes_its_node_out_and_the_others_go_on(shared_data: Path,
                                                                tmp_path: Path) -> None:
    """Node 2 hears a spot notice (its own metadata service, polled every 5 s) mid-run: it leaves
    between steps (exit 75, saying why), the others train every step to the end, from then on two,
    and the record says node2 left."""
    total = 300  # a step takes tens of ms here: the run must outlast a poll
    outs = [tmp_path / f"node{i}" for i in range(NODES)]
    house, address = lighthouse(tmp_path)
    with ImdsServer("127.0.0.1") as imds:
        procs = [node(i, out, address, shared_data, imds=imds.url if i == 2 else "off",
                      max_steps=total) for i, out in enumerate(outs)]
        try:
            wait_for(lambda: len(steps(outs[2])) >= 5, 200, "node2's fifth step",
                     lambda: said(outs[2]))
            imds.schedule("terminate", time="2026-12-07T12:00:00Z")
            assert procs[2].wait(120) == exits.PREEMPTED, said(outs[2])
            assert len(steps(outs[0])) < total, "the run ended before the notice took effect"
            for proc, out in zip(procs[:2], outs[:2], strict=True):
                assert proc.wait(240) == 0, said(out)
        finally:
            for proc in (*procs, house):
                kill_tree(proc)
    left = outs[2].with_suffix(".log").read_text()
    assert "left the elastic run at step" in left, left[-3000:]
    assert "spot interruption notice" in left, left[-3000:]
    logged = steps(outs[0])
    assert [s["step"] for s in logged] == list(range(1, total + 1))
    membership = json.loads((outs[0] / RANK_REPORT).read_text())["membership"]
    assert any(c["left"] == ["node2"] for c in membership), membership
    assert membership[-1]["nodes"] == ["node0", "node1"], membership
    assert logged[-1]["replicas"] == 2 and logged[-1]["samples"] == 8 * NODES, logged[-1]
