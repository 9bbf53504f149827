"""Resume goes on exactly where the straight run went: dropout on, and every --sync strategy's own
state.

A straight run writes checkpoints; another run resumes from an early one in a folder of its own and
writes none. From there on its losses and gradient norms must equal the straight run's at every
step. Measured: bit-identical (same ranks, same order of every reduction). The bound is 1e-6
relative: room for a BLAS that picks another kernel elsewhere, and 90x below the least that a state
left behind moved the first step it touched (measured by leaving each out in turn: rank 1's AdamW
moments 9e-5, PowerSGD's error feedback 3e-4 of the gradient norm, DiLoCo's momentum 5e-4, the
--second-moment-every count 9e-4, the ranks' RNG 3e-3). The straight run also checkpoints after the
step the resume starts from: a checkpoint that changed the run (local SGD averaging at a checkpoint,
as it did: 6e-4) shows there.

Each run is three processes that import torch, and the training is the least of it: a run here
serves as many checks as it can (a resume that is stopped by SIGTERM and resumed again checks both
kinds of checkpoint; one local SGD run holds every state local SGD and DiLoCo keep).
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest

from tests.integration.helpers import cmdline, cpudist, descendants
from tests.integration.test_resume import sigterm_ranks_at

pytestmark = pytest.mark.slow


STEPS = 16
REL = 1e-6


def common(shared_data: Path, steps: int = STEPS) -> list[str]:
    """Two ranks of the tiny model with its own dropout (0.1) on: every step draws masks on every
    rank. Rows do not matter beyond the steps' own (800 of MRPC's train on 24 steps of 2 x 16), nor
    evaluation or the model saved."""
    return ["mrpc", "--data-dir", str(shared_data / "glue" / "MRPC"), "--model", "tiny",
            "--max-steps", str(steps),
            "--precision", "fp32", "--log-every", "1", "--no-eval", "--lr", "1e-3", "--np", "2",
            "--max-train-samples", "800", "--max-eval-samples", "16", "--save-model", "none"]


def steps(run_dir: Path) -> dict[int, dict[str, float]]:
    return {s["step"]: s
            for s in map(json.loads, (run_dir / "steps.jsonl").read_text().splitlines())}


def assert_goes_on_as(straight: Path, resumed: Path, after: int, total: int = STEPS) -> None:
    """The resumed run's steps past `after` are the straight run's, loss and gradient norm."""
    one, two = steps(straight), steps(resumed)
    assert set(range(after + 1, total + 1)) <= set(two), sorted(two)
    for n in range(after + 1, total + 1):
        a, b = one[n], two[n]
        assert abs(a["loss"] - b["loss"]) <= REL * abs(a["loss"]), (n, a, b)
        assert abs(a["grad_norm"] - b["grad_norm"]) <= REL * abs(a["grad_norm"]), (n, a, b)


def checkpoint_steps(run_dir: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in (run_dir / "checkpoints").glob("step-*"))


def straight_run(shared_data: Path, run_dir: Path, total: int, *extra: str) -> Path:
    """The run to go on as: checkpoints every 5 steps, all kept; returns its step-5 checkpoint
    (rank_state: each rank's own sync state is in it)."""
    r = cpudist("run", *common(shared_data, total), *extra, "--checkpoint-every", "5",
                "--keep-checkpoints", "10", "--output-dir", run_dir)
    assert r.returncode == 0, r.stderr
    assert checkpoint_steps(run_dir) == list(range(5, total, 5))
    at = run_dir / "checkpoints" / "step-000005"
    assert json.loads((at / "meta.json").read_text())["rank_state"] is True
    return at


# compresses from step 3 (10% of 24, at least 2 plain steps)
POWERSGD = ["--grad-compression", "powersgd:2"]


def test_sigterm_with_dropout_then_resume_goes_on_bit_identical(shared_data: Path,
                                                                tmp_path: Path) -> None:
    """--fast-dropout (the default): every rank's RNG goes into the stop's checkpoint and comes
    back; and so does PowerSGD's state (its error feedback, each rank's own), from a periodic
    checkpoint and from a stop's.

    The straight run checkpoints at 5, 10, 15, 20; a run resumes from 5 (PowerSGD already
    compressing), every rank is SIGTERMed once it logged a step, and that run is resumed in its
    folder with --resume auto."""
    total = 24
    straight = tmp_path / "straight"
    at5 = straight_run(shared_data, straight, total, *POWERSGD)
    run_dir = tmp_path / "run"
    args = [*common(shared_data, total), *POWERSGD, "--output-dir", str(run_dir)]
    stopped = sigterm_ranks_at([*args, "--resume", str(at5)], run_dir, 1, tmp_path)
    assert stopped.returncode == 75, stopped.stderr
    at = json.loads((run_dir / "preempted.json").read_text())["step"]
    assert 6 <= at < total, at
    # the stop's: a resume takes no --checkpoint-every from its checkpoint
    assert checkpoint_steps(run_dir) == [at]
    assert not [p for p in descendants(os.getpid()) if "cpudist.rank" in cmdline(p)]
    # up to the stop: the resume from 5, and the stop changed nothing
    assert_goes_on_as(straight, run_dir, 5, at)
    resumed = cpudist("run", *args, "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from {run_dir}/checkpoints/step-{at:06d}" in resumed.stderr
    assert_goes_on_as(straight, run_dir, 5, total)


def test_time_based_checkpoints_are_written_and_resume_with_torch_dropout(shared_data: Path,
                                                                          tmp_path: Path) -> None:
    """--checkpoint-every-min alone: checkpoints come by the clock (0.001 min: at least after the
    first step, whose warm-up alone is longer, on any machine), and a run resumed from the first
    goes on exactly; with torch's own dropout, whose masks come from the same per-rank generator."""
    timed = tmp_path / "timed"
    r = cpudist("run", *common(shared_data), "--torch-dropout", "--checkpoint-every-min", "0.001",
                "--keep-checkpoints", "100", "--output-dir", timed)
    assert r.returncode == 0, r.stderr
    written = checkpoint_steps(timed)
    assert written and written[0] < STEPS, written
    first = timed / "checkpoints" / f"step-{written[0]:06d}"
    assert json.loads((first / "meta.json").read_text())["config"]["checkpoint_every"] is None
    resumed = tmp_path / "resumed"
    r = cpudist("run", *common(shared_data), "--torch-dropout", "--output-dir", resumed, "--resume",
                first)
    assert r.returncode == 0, r.stderr
    assert not (resumed / "checkpoints").exists()
    assert_goes_on_as(timed, resumed, written[0])


# One run holds every state that local SGD and DiLoCo keep, so that leaving out any one of them
# moves it: each rank's model and AdamW moments mid-window (cpudist/train/local_sgd.py's
# rank_state), the last average that a bf16 wire's changes start from, DiLoCo's outer momentum, and
# the count of averages that --second-moment-every follows (the state load() restores, one line
# each). Averages at 4, 8, 12, 16: the resume starts between two.
LOCAL = ["--sync", "local-sgd", "--sync-every", "4", "--outer-optimizer", "nesterov",
         "--average-moments", "both", "--grad-compression", "bf16", "--second-moment-every", "2"]


def test_resume_restores_every_ranks_local_sgd_and_diloco_state(shared_data: Path,
                                                                tmp_path: Path) -> None:
    """Checkpoints at 5, 10, 15; the resume starts at 5 (mid-window) and writes none.

    On another number of ranks no rank could take up its own state: refused, before any rank starts
    (the refusal reads meta.json's rank_state, asserted for PowerSGD's checkpoint too:
    cpudist/train/resume.py)."""
    straight = tmp_path / "straight"
    at = straight_run(shared_data, straight, STEPS, *LOCAL)
    resumed = tmp_path / "resumed"
    r = cpudist("run", *common(shared_data), *LOCAL, "--output-dir", resumed, "--resume", at)
    assert r.returncode == 0, r.stderr
    assert_goes_on_as(straight, resumed, 5)
    one = cpudist("run", *common(shared_data), *LOCAL, "--np", "1", "--output-dir",
                  tmp_path / "one", "--resume", at)
    assert one.returncode == 2, one.stderr
    assert "holds each of 2 ranks' own" in one.stderr and "Resume with --np 2" in one.stderr
    assert not (tmp_path / "one" / "steps.jsonl").exists()


def test_a_cosine_schedule_stopped_and_resumed_logs_the_straight_runs_rates_and_losses(
    shared_data: Path,
    tmp_path: Path) -> None:
    """--lr-scheduler cosine with --warmup-steps, as a user stops and resumes it: every rank
    SIGTERMed mid-run (the stop's checkpoint, exit 75), then the same command with --resume auto.
    Its steps.jsonl, both parts, holds the straight run's learning rate at every step, exactly, and
    its losses."""
    total = 24
    cosine = ["--lr-scheduler", "cosine", "--warmup-steps", "3"]
    straight = tmp_path / "straight"
    r = cpudist("run", *common(shared_data, total), *cosine, "--output-dir", straight)
    assert r.returncode == 0, r.stderr
    lrs = [steps(straight)[n]["lr"] for n in range(1, total + 1)]
    # warm-up, then decay
    assert lrs[0] < lrs[1] < lrs[2] and all(a > b for a, b in itertools.pairwise(lrs[3:])), lrs
    run_dir = tmp_path / "run"
    args = [*common(shared_data, total), *cosine, "--output-dir", str(run_dir)]
    stopped = sigterm_ranks_at(args, run_dir, 4, tmp_path)
    assert stopped.returncode == 75, stopped.stderr
    at = json.loads((run_dir / "preempted.json").read_text())["step"]
    assert 4 <= at < total, at
    resumed = cpudist("run", *args, "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from {run_dir}/checkpoints/step-{at:06d}" in resumed.stderr
    both = steps(run_dir)
    assert sorted(both) == list(range(1, total + 1))
    assert [both[n]["lr"] for n in range(1, total + 1)] == lrs
    assert_goes_on_as(straight, run_dir, 0, total)
