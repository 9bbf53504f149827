"""`cpudist launch` with an Accelerate training loop on 2 ranks of this machine: Accelerate's state (it reads RANK,
WORLD_SIZE, LOCAL_RANK and MASTER_ADDR, or the MPI names) sees a multi-CPU world of 2 under MPICH's Hydra, and
the loop logs the same losses as the script started by hand with torchrun (the run `accelerate launch` makes on
CPUs: torchrun's variables); rank 0's metric file reaches the ledger."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cpudist.launch.tools import free_port
from tests.integration.helpers import cpudist
from tests.integration.user_scripts import ACCELERATE_SCRIPT, STEP

pytestmark = pytest.mark.slow
pytest.importorskip("accelerate")  # the test extra installs it


def test_an_accelerate_loop_on_two_ranks_logs_torchruns_losses(tmp_path: Path) -> None:
    ours, hand = tmp_path / "ours", tmp_path / "by-hand"
    for folder in (ours, hand):
        folder.mkdir()
        (folder / "train.py").write_text(ACCELERATE_SCRIPT)
    by_hand = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                                "--master-port", str(free_port()), "train.py"], cwd=hand, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    r = cpudist("launch", "--np", "2", "--output-dir", ours / "run", "--ledger", tmp_path / "ledger.jsonl",
                "--workdir", ours, "--metric-file", "metrics.json", "train.py", timeout=300)
    hand_out, _ = by_hand.communicate(timeout=300)
    assert by_hand.returncode == 0, hand_out
    assert r.returncode == 0, r.stderr
    assert "state DistributedType.MULTI_CPU 2 0" in r.stderr and "DistributedType.MULTI_CPU 2 1" in r.stderr, r.stderr
    ours_steps = STEP.findall(r.stderr)
    assert len(ours_steps) == 4 and ours_steps == STEP.findall(hand_out), (r.stderr, hand_out)  # 64 rows / (2 x 8)
    entry = json.loads((tmp_path / "ledger.jsonl").read_text())
    assert (entry["world_size"], entry["train_samples"]) == (2, 64)
    assert entry["final_loss"] == pytest.approx(float(ours_steps[-1][1]), abs=1e-7)
