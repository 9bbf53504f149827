"""`cpudist launch` with an HF Trainer fine-tuning script on 2 ranks of this machine: the Trainer
(through Accelerate's multi-CPU state) sees a world of 2 from the variables cpudist sets under
MPICH's Hydra, logs the same losses as the script started by hand with torchrun, and its
all_results.json (--metric-file) fills the run's train time, samples/s and loss in the ledger."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.helpers import launch_beside_torchrun
from tests.integration.user_scripts import LEAVE, LOGGED, TRAINER_SCRIPT

pytestmark = pytest.mark.slow
pytest.importorskip("accelerate")  # the test extra installs it (HF Trainer needs it)


def test_a_trainer_script_on_two_ranks_logs_torchruns_losses_and_hands_back_its_metrics(
    tmp_path: Path) -> None:
    r, hand_out, ours, hand = launch_beside_torchrun(tmp_path, TRAINER_SCRIPT + LEAVE,
                                                     "hf-out/all_results.json")
    assert "world 2 process 0" in r.stderr and "world 2 process 1" in r.stderr
    logged = LOGGED.findall(r.stderr)
    assert len(logged) == 4 and logged == LOGGED.findall(hand_out), (r.stderr, hand_out)
    theirs = json.loads((hand / "hf-out" / "all_results.json").read_text())
    mine = json.loads((ours / "hf-out" / "all_results.json").read_text())
    assert mine["train_loss"] == theirs["train_loss"]
    entry = json.loads((tmp_path / "ledger.jsonl").read_text())
    assert (entry["world_size"], entry["final_loss"], entry["train_time_s"],
            entry["train_samples_per_s"]) == (
        2, mine["train_loss"], mine["train_runtime"], mine["train_samples_per_second"])
    assert entry["metrics"]["train_steps_per_second"] == mine["train_steps_per_second"]
