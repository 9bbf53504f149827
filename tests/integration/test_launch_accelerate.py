"""`cpudist launch` with an Accelerate training loop on 2 ranks of this machine: Accelerate's state
(it reads RANK, WORLD_SIZE, LOCAL_RANK and MASTER_ADDR, or the MPI names) sees a multi-CPU world of
2 under MPICH's Hydra, and the loop logs the same losses as the script started by hand with torchrun
(the run `accelerate launch` makes on CPUs: torchrun's variables); rank 0's metric file reaches the
ledger."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.helpers import launch_beside_torchrun
from tests.integration.user_scripts import ACCELERATE_SCRIPT, LEAVE, STEP

pytestmark = pytest.mark.slow
pytest.importorskip("accelerate")  # the test extra installs it


def test_an_accelerate_loop_on_two_ranks_logs_torchruns_losses(tmp_path: Path) -> None:
    r, hand_out, _, _ = launch_beside_torchrun(tmp_path, ACCELERATE_SCRIPT + LEAVE, "metrics.json")
    assert ("state DistributedType.MULTI_CPU 2 0" in r.stderr
            and "DistributedType.MULTI_CPU 2 1" in r.stderr), r.stderr
    ours_steps = STEP.findall(r.stderr)
    # 64 rows / (2 x 8)
    assert len(ours_steps) == 4 and ours_steps == STEP.findall(hand_out), (r.stderr, hand_out)
    entry = json.loads((tmp_path / "ledger.jsonl").read_text())
    assert (entry["world_size"], entry["train_samples"]) == (2, 64)
    assert entry["final_loss"] == pytest.approx(float(ours_steps[-1][1]), abs=1e-7)
