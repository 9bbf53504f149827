"""`cpudist launch` with a plain torch.distributed script on 2 ranks of this machine: the same
losses as the script started by hand with torchrun, torchrun's variables on every rank, a cpudist
run (run.json, logs, result, ledger, report, metric file, collected output), and one failing rank
stopping the others."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from cpudist.launch.tools import free_port
from tests.integration.helpers import CPUDIST, cmdline, cpudist, descendants, kill_tree, wait_for
from tests.integration.user_scripts import LEAVE

pytestmark = pytest.mark.slow

# The script a course would hand out: all_reduce of a tensor, then DDP steps of a tiny model, rank 0
# printing the mean loss of each step. Nothing in it knows cpudist; it reads what torchrun sets.
DDP_SCRIPT = '''
import json, os, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 16),
                                                                      torch.nn.Tanh(),
                                                                      torch.nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(1)
x, y = torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)
for step in range(4):
    rows = slice(step * 16 + rank, (step + 1) * 16, world)
    loss = torch.nn.functional.mse_loss(model(x[rows]), y[rows])
    opt.zero_grad()
    loss.backward()
    opt.step()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    if rank == 0:
        print(f"step {step} loss {mean.item() / world:.8f}", flush=True)
names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
         "MASTER_PORT")
print("vars " + json.dumps({k: os.environ.get(k) for k in names}
                           | {"sum": total.item(), "threads": torch.get_num_threads()}),
      flush=True)
if rank == 0 and "CPUDIST_RUN_DIR" in os.environ:
    with open("metrics.json", "w") as f:
        json.dump({"train_samples": 64, "final_loss": mean.item() / world, "sum": total.item()}, f)
    os.makedirs("outputs", exist_ok=True)
    with open("outputs/model.txt", "w") as f:
        f.write("weights")
'''


def losses(text: str) -> list[tuple[str, str]]:
    return re.findall(r"step (\d+) loss ([0-9.]+)", text)


@dataclass(frozen=True)
class Launched:
    folder: Path  # the script's folder
    out: Path  # the run folder
    ledger: Path
    run: subprocess.CompletedProcess[str]
    by_hand: str  # the same script under torchrun, started by hand


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Launched:
    """One `cpudist launch` run and one by-hand torchrun run of the same script, side by side."""
    folder = tmp_path_factory.mktemp("script")
    (folder / "ddp.py").write_text(DDP_SCRIPT + LEAVE)
    hand_dir = tmp_path_factory.mktemp("by-hand")
    (hand_dir / "ddp.py").write_text(DDP_SCRIPT + LEAVE)
    by_hand = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                                "2", "--master-port", str(free_port()), "ddp.py"], cwd=hand_dir,
                               text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, ledger = folder / "run", folder / "ledger.jsonl"
    run = cpudist("launch", "--np", "2", "--output-dir", out, "--ledger", ledger, "--workdir",
                  folder, "--metric-file", "metrics.json", "--collect", "outputs", "--", "python",
                  "ddp.py", timeout=240)
    hand_out, _ = by_hand.communicate(timeout=240)
    assert by_hand.returncode == 0, hand_out
    return Launched(folder, out, ledger, run, hand_out)


def test_the_same_losses_as_torchrun_by_hand_and_torchruns_variables_on_every_rank(
    launched: Launched) -> None:
    assert launched.run.returncode == 0, launched.run.stderr
    ours = losses(launched.run.stderr)  # rank output is progress: stderr
    assert len(ours) == 4 and ours == losses(launched.by_hand), (
        launched.run.stderr, launched.by_hand)
    seen = [json.loads(line.split("vars ", 1)[1]) for line in launched.run.stderr.splitlines()
            if "vars {" in line]
    by_rank = {v["RANK"]: v for v in seen}
    assert set(by_rank) == {"0", "1"} and all(v["sum"] == 3.0 for v in seen)
    for rank, v in by_rank.items():
        assert (v["LOCAL_RANK"], v["WORLD_SIZE"], v["LOCAL_WORLD_SIZE"],
                v["GROUP_RANK"]) == (rank, "2", "2", "0")
        assert v["MASTER_ADDR"] and v["MASTER_PORT"] and v["threads"] >= 1


def test_it_is_a_cpudist_run_with_its_record_metrics_and_outputs(launched: Launched) -> None:
    assert launched.run.returncode == 0, launched.run.stderr
    info = json.loads((launched.out / "run.json").read_text())
    assert (info["state"] == "finished" and info["task"] == "script"
            and info["model"] == "python ddp.py")
    result = json.loads((launched.out / "result.json").read_text())
    (entry,) = [json.loads(line) for line in launched.ledger.read_text().splitlines()]
    assert entry["run_id"] == result["run_id"] == info["id"]
    assert (entry["world_size"], entry["ppn"], len(entry["nodes"]),
            len(entry["rank_threads"])) == (2, 2, 1, 2)
    assert (entry["wall_time_s"] > 0 and entry["launcher"]
            and entry["command"].startswith("cpudist launch"))
    last = float(losses(launched.run.stderr)[-1][1])
    assert entry["final_loss"] == pytest.approx(last, abs=1e-7) and entry["metrics"] == {"sum": 3.0}
    assert entry["train_samples_per_s"] == pytest.approx(64 / entry["train_time_s"])
    assert (launched.out / "collected" / "outputs" / "model.txt").read_text() == "weights"
    assert "done: python ddp.py on 2 rank(s), 1 node(s)" in launched.run.stdout
    logs = cpudist("logs", launched.out, timeout=60)
    assert losses(logs.stdout) == losses(launched.run.stderr), logs.stderr
    report = cpudist("report", launched.ledger, "--format", "json", timeout=60)
    assert report.returncode == 0, report.stderr
    (row,) = json.loads(report.stdout)
    assert (row["run_id"], row["ranks"], row["speedup"]) == (info["id"], 2, 1.0)


FAILING = '''
import os, sys, time
if os.environ["RANK"] == "1":
    sys.exit("rank 1 gives up")
time.sleep(120)
'''


def test_one_failing_rank_stops_the_others_and_the_run_fails(tmp_path: Path) -> None:
    (tmp_path / "fail.py").write_text(FAILING)
    began = time.monotonic()
    r = cpudist("launch", "--np", "2", "--output-dir", tmp_path / "run", "--ledger",
                tmp_path / "ledger.jsonl", "--workdir", tmp_path, "fail.py", timeout=240)
    assert r.returncode == 1, r.stderr
    assert time.monotonic() - began < 100  # not rank 0's 120 s: its launcher stopped it
    assert "rank 1 gives up" in r.stderr and "the job failed" in r.stderr.splitlines()[-1], r.stderr
    assert json.loads((tmp_path / "run" / "run.json").read_text())["state"] == "failed"
    assert not (tmp_path / "ledger.jsonl").exists()


WAITING = '''
import os, time
print(f"rank {os.environ['RANK']} waiting", flush=True)
time.sleep(300)
'''


def test_stop_ends_every_rank_and_the_run_says_interrupted(tmp_path: Path) -> None:
    """`cpudist runs` lists the running launch; `cpudist stop <id>` from another shell (as the
    issue's Ctrl-C) ends both ranks' scripts and every process of the run; run.json says
    interrupted."""
    (tmp_path / "wait.py").write_text(WAITING)
    # under runs/: `runs` and `stop` find it by id from tmp_path
    out = tmp_path / "runs" / "waiting"
    launched = subprocess.Popen([*CPUDIST, "launch", "--np", "2", "--output-dir", str(out),
                                 "--ledger", str(tmp_path / "ledger.jsonl"), "--workdir",
                                 str(tmp_path), "wait.py"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    log = out / "cpudist.log"
    try:
        wait_for(lambda: (log.is_file() and log.read_text().count(" waiting") == 2)
                 or launched.poll() is not None,
                 120, "both ranks' waiting lines")
        assert launched.poll() is None, log.read_text()
        below = descendants(launched.pid)
        # each rank's script and wrapper
        assert len([pid for pid in below if "wait.py" in cmdline(pid)]) >= 2
        run_id = json.loads((out / "run.json").read_text())["id"]
        listed = subprocess.run([*CPUDIST, "runs", "--json"], cwd=tmp_path, capture_output=True,
                                text=True, timeout=60)
        assert [(r["id"], r["state"])
                for r in json.loads(listed.stdout)] == [(run_id, "running")], listed.stderr
        stop = subprocess.run([*CPUDIST, "stop", run_id[:17]], cwd=tmp_path, capture_output=True,
                              text=True, timeout=150)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert stop.stdout.startswith(
            f"run {run_id} stopped, run.json says interrupted"), stop.stdout
        assert "--checkpoint-every" not in stop.stderr  # a script's checkpoints are its own
        assert launched.wait(timeout=60) == 130
        # every launcher, wrapper and script is gone
        assert [cmdline(pid) for pid in below if cmdline(pid)] == []
        assert json.loads((out / "run.json").read_text())["state"] == "interrupted"
    finally:
        kill_tree(launched)
