"""Training learns: the README's pretrained MiniLM fine-tuned on MRPC for 100 optimizer steps
through the real `cpudist run` ends above 0.75 dev accuracy, where answering the majority class
scores 0.684.

Every other run in the suite trains the random-weight `tiny` preset for a few steps and checks that
accuracy is a number between 0 and 1: a change that stopped the model learning (gradients never
applied or zeroed by a sync, labels shuffled against their rows, an optimizer or scheduler that does
not step, evaluation of another model than the trained one) would pass them all, and the README's
main job only counted by its exit code.

Settings, measured here (seeds by hand, on 1 rank): 100 steps of batch 32 reached 0.70-0.74 (lr 1e-4
or 2e-4, dropout on or off, either sampler) and batch 16 at lr 1e-4 stayed at the majority class;
batch 64 per rank at lr 2e-4 on 2 ranks (3.5 epochs) is the shortest setting that cleared the floor
on every seed tried. Evaluated every 20 steps (seed 1, fp32 on an AMD EPYC): 0.684, 0.588, 0.787,
0.799, then 0.777 at step 100 (0.782 in bf16 on a Xeon); 60 steps of batch 32 per rank ended at
0.726, so fewer rows is no saving this test can take.

Under `.ci/run` the evidence is the README main job CI has just run (`CPUDIST_MAIN_JOB_LOG`): the
same assertions on the README's own command, one training fewer. Tried: a main job log whose run
shows 0.72, or 60 steps, fails here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.helpers import cpudist

pytestmark = pytest.mark.slow

MAJORITY = 0.684  # MRPC's dev set: 279 of 408 pairs are paraphrases
FLOOR = 0.75
REPO = Path(__file__).resolve().parents[2]
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
# `.ci/run` names here the log of the README's main job it has just run (pretrained MiniLM on MRPC,
# 2 ranks, 3 epochs, through the same `cpudist run` on the same checkout): CI then holds that run to
# this test's assertions instead of training the model a second time, which cost the suite a sixth
# of its CPU (862 CPU-s of 5079 on an AMD EPYC). Without it (a developer's `pytest`), the test
# trains its own 100 steps.
MAIN_JOB_LOG = "CPUDIST_MAIN_JOB_LOG"


def train_100_steps(shared_data: Path, tmp_path: Path) -> tuple[Path, str]:
    """The shortest setting that cleared the floor on every seed tried (module docstring): its
    output dir and log."""
    out = tmp_path / "learn"
    # --lr 1e-4 for one rank's batch: --lr-scaling auto trains the 2 ranks at the measured 2e-4
    r = cpudist("run", "mrpc", "--np", "2", "--batch-size", "64", "--lr", "1e-4", "--dropout", "0",
                "--max-steps", "100", "--seed", "1", "--data-dir", shared_data / "glue" / "MRPC",
                "--model", MINILM, "--output-dir", out, timeout=2900)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    result = json.loads((out / "result.json").read_text())
    assert (result["steps"] == 100 and result["global_batch_size"] == 128
            and result["lr"] == 2e-4), result
    return out, r.stdout


def the_main_jobs_run(log_path: Path) -> tuple[Path, str]:
    """The run folder the README main job's closing line points at (relative paths are the
    repository's) and its log."""
    log = log_path.read_text(errors="replace")
    done = [line for line in log.splitlines() if line.startswith("done:")]
    assert done, f"{log_path} has no `done:` line: the README main job did not finish"
    found = re.search(r"-> (\S+)/result\.json", done[-1])
    assert found, done[-1]
    out = Path(found.group(1))
    out = out if out.is_absolute() else REPO / out
    assert json.loads((out / "result.json").read_text())["model"] == MINILM
    return out, log


# A bound for a hang, not a speed check. The run trains 12,800 rows: ~2 minutes on a quiet 2-core
# Xeon with AMX (bf16), 7.5 on a quiet 2-core AMD EPYC with AVX2 only (fp32, 31 samples/s), and over
# 23 there beside the suite's other workers (it ran out of the former 1400 s bound so): the bound
# leaves twice that.
@pytest.mark.timeout(3000)
def test_pretrained_minilm_learns_mrpc_in_100_steps(shared_data: Path, tmp_path: Path) -> None:
    given = os.environ.get(MAIN_JOB_LOG)
    out, log = the_main_jobs_run(Path(given)) if given else train_100_steps(shared_data, tmp_path)
    result = json.loads((out / "result.json").read_text())
    assert result["task"] == "mrpc" and result["world_size"] == 2 and result["steps"] >= 100, result
    assert result["metrics"]["accuracy"] > FLOOR > MAJORITY, result["metrics"]
    losses = [json.loads(line)["loss"] for line in (out / "steps.jsonl").read_text().splitlines()]
    # training loss fell
    assert len(losses) == result["steps"] and sum(losses[-10:]) < sum(losses[:10]), losses
    # CI reads the README main job's accuracy from the same closing line: its parser must read this
    # one.
    (tmp_path / "run.log").write_text(log)
    check = subprocess.run([sys.executable, str(REPO / ".ci" / "accuracy_floor.py"),
                            str(tmp_path / "run.log"),
                            str(FLOOR)], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stderr
    assert float(check.stdout.split()[2]) == pytest.approx(result["metrics"]["accuracy"],
                                                           abs=5e-5), check.stdout
