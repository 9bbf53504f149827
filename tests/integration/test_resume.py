"""Spot-safe runs on this machine: SIGTERM every rank mid-run, resume, and reach the straight run's
model.

Dropout is off, so the only thing a resumed run could get wrong is state: weights, optimizer
moments, scheduler, data position or the loss weighting. Tolerance: 1e-5 relative per step on the
same world size (measured: bit-identical), 1e-4 across world sizes (fp32 reductions in another
order).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.helpers import CPUDIST, cmdline, cpudist, descendants, output_of

pytestmark = pytest.mark.slow


STEPS = 40


def common(shared_data: Path) -> list[str]:
    return ["mrpc", "--data-dir", str(shared_data / "glue" / "MRPC"), "--model", "tiny",
            "--max-steps", str(STEPS), "--dropout", "0", "--precision", "fp32", "--log-every", "1",
            "--max-eval-samples", "96", "--lr", "1e-3"]


def steps(run_dir: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]


def logged(pattern: Path) -> int:
    """Steps logged so far in the run folder(s) matching `pattern` (a glob under its parent)."""
    return sum(len(p.read_text().splitlines())
               for p in pattern.parent.glob(f"{pattern.name}/steps.jsonl"))


def sigterm_ranks_at(args: list[str], run_dir: Path, step: int,
                     cwd: Path) -> subprocess.CompletedProcess[str]:
    """Start `cpudist run ARGS`, SIGTERM every rank once `step` steps are logged, wait for the
    end."""
    proc = subprocess.Popen([*CPUDIST, "run", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cwd,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    deadline = time.monotonic() + 180
    while logged(run_dir) < step:
        assert proc.poll() is None and time.monotonic() < deadline, output_of(proc)
        time.sleep(0.01)
    ranks = [p for p in descendants(proc.pid) if "cpudist.rank" in cmdline(p)
             and "mpiexec" not in cmdline(p)]
    assert len(ranks) == 2, [cmdline(p) for p in descendants(proc.pid)]
    for pid in ranks:
        os.kill(pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="module")
def straight(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run the resumes must reach. It is also `--resume auto` into a new folder, which finds no
    checkpoint and starts from step 0 (the straight run it is)."""
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    r = cpudist("run", *common(shared_data), "--np", "2", "--output-dir", run_dir,
                "--checkpoint-every", "20", "--resume", "auto")
    assert r.returncode == 0, r.stderr
    assert "--resume auto: no checkpoint in" in r.stderr and "starting from step 0" in r.stderr
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "step-000020", "step-000040"]
    return run_dir


# The stopped run's folder, named as cpudist names its runs, so that --resume auto without
# --output-dir finds a copy of it under ./runs (cpudist/run/request.py unfinished_run); its
# checkpoints every 10 steps, the newest 3 kept.
STOPPED = "mrpc-tiny-np2-stopped"
EVERY_10 = ["--checkpoint-every", "10", "--keep-checkpoints", "3"]


@pytest.fixture(scope="module")
def stopped(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A run on 2 ranks checkpointing every 10 steps, every rank SIGTERMed at step 25 or later: its
    folder and the step it stopped at. The tests resume copies of it (so the stop's own assertions
    are made once, here): from its SIGTERM checkpoint, or with that one truncated, from step 20."""
    cwd = tmp_path_factory.mktemp("stopped")
    run_dir = cwd / "runs" / STOPPED
    r = sigterm_ranks_at([*common(shared_data), "--np", "2", *EVERY_10, "--output-dir",
                          str(run_dir)], run_dir, 25,
                         cwd)
    assert r.returncode == 75, r.stderr
    marker = json.loads((run_dir / "preempted.json").read_text())
    assert marker["reason"] == "SIGTERM" and marker["step"] >= 25
    assert f"--resume auto --output-dir {run_dir}" in r.stderr.splitlines()[-1]
    assert not (run_dir / "result.json").exists()
    assert not [p for p in descendants(os.getpid()) if "cpudist.rank" in cmdline(p)]
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names == ["step-000010", "step-000020", f"step-{marker['step']:06d}"], names
    return run_dir, marker["step"]


def copy_of(stopped: tuple[Path, int], to: Path) -> Path:
    shutil.copytree(stopped[0], to, symlinks=True)
    return to


def assert_same_losses(a: Path, b: Path, rel: float) -> None:
    one, two = steps(a), steps(b)
    assert [s["step"] for s in two] == list(range(1, STEPS + 1))
    for x, y in zip(one, two, strict=True):
        assert abs(x["loss"] - y["loss"]) <= rel * abs(x["loss"]), (x, y)
        assert abs(x["grad_norm"] - y["grad_norm"]) <= rel * 10 * abs(x["grad_norm"]), (x, y)


def test_sigterm_every_rank_then_resume_matches_the_straight_run(
        shared_data: Path, tmp_path: Path, straight: Path, stopped: tuple[Path, int]) -> None:
    run_dir = copy_of(stopped, tmp_path / "run")
    marker = {"step": stopped[1]}
    resumed = cpudist("run", *common(shared_data), "--np", "2", "--output-dir", run_dir, "--resume",
                      "auto")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from {run_dir}/checkpoints/step-{marker['step']:06d}" in resumed.stderr
    assert_same_losses(straight, run_dir, 1e-5)
    a, b = (json.loads((d / "result.json").read_text()) for d in (straight, run_dir))
    assert b["resumed_from_step"] == marker["step"] and b["parts"] == 2 and a["parts"] == 1
    assert b["steps"] == STEPS and b["train_samples"] == a["train_samples"]
    for k, v in a["metrics"].items():
        assert abs(b["metrics"][k] - v) <= 1e-6, (a["metrics"], b["metrics"])
    # Both parts' time is counted: more than this part's own (the second part is shorter than the
    # whole).
    part2 = sum(s["step_time_s"] for s in steps(run_dir)[marker["step"]:])
    assert b["train_time_s"] > part2 * 1.2
    assert not (run_dir / "preempted.json").exists()


def test_a_truncated_newest_checkpoint_is_skipped_other_world_sizes_keep_the_batch_or_refuse(
        shared_data: Path, tmp_path: Path, straight: Path, stopped: tuple[Path, int]) -> None:
    """No --output-dir: --resume auto finds the unfinished run of this task and model under ./runs.
    Its newest checkpoint truncated, the resume names it and goes on from step 20; on 1 rank instead
    of 2, with the global batch kept (3 ranks cannot split it: refused). One resume serves both:
    which checkpoint rank 0 picks, then how the batch is split after it. The same world size's exact
    match (1e-5) is the SIGTERM resume's, above."""
    run_dir = copy_of(stopped, tmp_path / "runs" / STOPPED)
    newest = f"step-{stopped[1]:06d}"
    state = run_dir / "checkpoints" / newest / "state.pt"
    with state.open("r+b") as f:
        f.truncate(state.stat().st_size // 2)

    def resume(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CPUDIST, "run", *common(shared_data), *EVERY_10, *args, "--resume",
                               "auto"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)

    refused = resume("--np", "3", "--oversubscribe")
    assert refused.returncode == 2
    assert "global batch of 32 cannot be split over 3 rank(s)" in refused.stderr \
        and "--np 2" in refused.stderr
    one = resume("--np", "1")
    assert one.returncode == 0, one.stderr
    assert f"going on with runs/{STOPPED}" in one.stderr
    assert f"resuming from step-000020 instead: {newest} is damaged (state.pt has" in one.stderr
    # the lr --lr-scaling auto gave the 2 ranks (1e-3 x 2) stays with the global batch: the losses
    # match below
    assert "2 -> 1 ranks: per-rank batch 32, global batch 32 and lr 0.002 kept" in one.stderr
    result = json.loads((run_dir / "result.json").read_text())
    assert result["resumed_from_step"] == 20
    assert (result["world_size"] == 1 and result["per_rank_batch_size"] == 32
            and result["global_batch_size"] == 32)
    assert_same_losses(straight, run_dir, 1e-4)


def test_a_checkpoint_of_another_run_or_none_is_refused(shared_data: Path, tmp_path: Path,
                                                        straight: Path) -> None:
    other = cpudist("run", *common(shared_data), "--np", "1", "--seed", "5", "--output-dir",
                    tmp_path / "other", "--resume", straight / "checkpoints" / "step-000020")
    assert other.returncode == 2, other.stderr
    assert "belongs to another run (seed: 42 there, 5 here)" in other.stderr
    (tmp_path / "empty").mkdir()
    none = cpudist("run", *common(shared_data), "--np", "1", "--output-dir", tmp_path / "x",
                   "--resume", tmp_path / "empty")
    assert none.returncode == 2 and f"no usable checkpoint in {tmp_path / 'empty'}" in none.stderr
    # --resume auto where there is no checkpoint starts from step 0: the straight run is one (its
    # fixture checks it)


@pytest.mark.parametrize("name", ["state.pt", "ranks.pt"])
def test_a_checkpoint_with_a_planted_pickle_is_refused_in_one_line_and_never_run(
        shared_data: Path, tmp_path: Path, straight: Path, name: str) -> None:
    """--resume PATH reads files that anyone may have made: they are unpickled safely, refused
    before any code in them runs (their sums in meta.json made to match, as whoever made them can).
    ranks.pt is read by rank 0 alone: its refusal reaches rank 1 too, which would otherwise wait for
    its part until --dist-timeout."""
    from tests.unit.test_checkpoint_untrusted import Planted, plant

    given = tmp_path / "given" / "step-000020"
    shutil.copytree(straight / "checkpoints" / "step-000020", given)
    marker = tmp_path / "ran"
    plant(given, name, {"model": Planted(marker)} if name == "state.pt"
          else [{}, {"x": Planted(marker)}])
    r = cpudist("run", *common(shared_data), "--np", "2", "--output-dir", tmp_path / "run",
                "--resume", given)
    # Found inside the ranks (the CLI's preflight imports no torch), so the job fails: exit 1, not
    # bad input's 2.
    assert r.returncode == 1, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert f"checkpoint {given}: {name} holds more than tensors and plain data, " \
           "refused unread" in last
    assert "Traceback" not in r.stderr and not marker.exists()
    assert r.stderr.count(f"{name} holds more") == 3  # each rank's line, then cpudist's own
