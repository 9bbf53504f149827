"""`cpudist logs -f` and `cpudist stop` from other processes, on a real run (real launcher, ranks
and gloo)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.integration.helpers import CPUDIST, kill_tree, output_of, read_until, wait_for

pytestmark = pytest.mark.slow


def test_logs_follows_a_run_that_stop_ends_with_its_checkpoint(shared_data: Path,
                                                               tmp_path: Path) -> None:
    """A run checkpointing every 2 steps: `logs -f <id prefix>` from another process shows its step
    lines as they come and ends when the run ends; `stop <id>` interrupts it (the run exits 130,
    run.json says interrupted) and prints the resume command naming the checkpoint's step; a second
    stop is one line, exit 2."""
    out = tmp_path / "runs" / "r"
    args = ["run", "mrpc", "--data-dir", str(shared_data / "glue" / "MRPC"), "--model", "tiny",
            "--np", "1",
            "--max-steps", "200", "--checkpoint-every", "2", "--no-eval", "--output-dir", str(out)]
    run_err, follow_err = (tmp_path / "run.err").open("w"), (tmp_path / "follow.err").open("w")
    run = subprocess.Popen([*CPUDIST, *args], cwd=tmp_path, stdout=subprocess.DEVNULL,
                           stderr=run_err, text=True)
    follow: subprocess.Popen[str] | None = None
    try:
        wait_for(lambda: (out / "run.json").is_file() or run.poll() is not None, 300,
                 "the run's run.json")
        assert run.poll() is None, (tmp_path / "run.err").read_text()[-3000:]
        run_id = json.loads((out / "run.json").read_text())["id"]
        follow = subprocess.Popen([*CPUDIST, "logs", "-f", run_id[:17]], cwd=tmp_path,
                                  stdout=subprocess.PIPE, stderr=follow_err, text=True)
        seen = read_until(follow, "[cpudist] step ", timeout=120)
        assert any("rank 0/1 ready" in line for line in seen), seen
        wait_for(lambda: list((out / "checkpoints").glob("step-*")), 60,
                 "the run's first checkpoint")

        stop = subprocess.run([*CPUDIST, "stop", run_id], cwd=tmp_path, capture_output=True,
                              text=True, timeout=150, env=os.environ.copy())
        assert stop.returncode == 0, stop.stdout + stop.stderr
        said, resume = stop.stdout.strip().splitlines()
        assert said.startswith(f"run {run_id} stopped, run.json says interrupted: interrupted: all "
                               "ranks were stopped; the ranks stopped at step "), said
        assert "(the user's stop on " in said, said
        step = int(said.split("at step ")[1].split()[0])
        assert (out / "checkpoints" / f"step-{step:06d}").is_dir()
        assert resume.startswith("resume: cpudist run mrpc ") and resume.endswith(
            f"--resume auto --output-dir {out}") and resume.count("--output-dir") == 1, resume
        assert run.wait(timeout=30) == 130
        recorded = json.loads((out / "run.json").read_text())
        assert recorded["state"] == "interrupted" and recorded["resume"] == resume.removeprefix(
            "resume: ")
        assert not (out / "preempted.json").exists()  # the user's stop: nothing was preempted
        assert not list((out / "checkpoints").glob("*.tmp"))
        # what `logs` shows, the stop's own lines included
        log = (out / "cpudist.log").read_text().splitlines()
        assert f"[cpudist] checkpoint at step {step}: {out / 'checkpoints' / f'step-{step:06d}'}" \
            in log, log[-5:]
        assert log[-1].startswith("[cpudist] run interrupted: interrupted: all ranks were stopped; "
                                  "the ranks "
                                  f"stopped at step {step} ") and log[-1].endswith(
                                      resume.removeprefix("resume: "))

        assert follow.wait(timeout=30) == 0  # -f ended by itself: the run did
        assert f"run {run_id} is interrupted" in (tmp_path / "follow.err").read_text()
        # (its own reader: communicate would skip what read_until buffered)
        assert follow.stdout is not None
        lines = seen + follow.stdout.read().splitlines(keepends=True)
        steps = [int(line.split()[2].split("/")[0]) for line in lines
                 if line.startswith("[cpudist] step ")]
        assert steps and steps == sorted(set(steps)) and steps[-1] <= step, lines[-10:]
        saved = [int(line.split()[4].rstrip(":")) for line in lines
                 if line.startswith("[cpudist] checkpoint at step ")]
        assert saved and saved == sorted(set(saved)) and saved[-1] <= step, lines[-10:]

        again = subprocess.run([*CPUDIST, "stop", run_id[:17]], cwd=tmp_path, capture_output=True,
                               text=True, timeout=60)
        assert again.returncode == 2 and again.stdout == "", again.stdout
        assert again.stderr == (f"Error: run {run_id} is not running (it is interrupted). Nothing "
                                "to stop; "
                                "`cpudist runs` shows every run's state\n")

        # The printed command goes on from the stop's checkpoint; a write a kill cut off is removed,
        # never read.
        partial = out / "checkpoints" / f"step-{step + 1:06d}.tmp"
        partial.mkdir()
        (partial / "state.pt").write_bytes(b"cut off")
        words = shlex.split(resume.removeprefix("resume: "))
        resumed = subprocess.run([*CPUDIST, *words[1:]], cwd=tmp_path,
                                 capture_output=True, text=True, timeout=600)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert f"removed {partial}, a checkpoint an earlier part left half-written" in (
            resumed.stdout + resumed.stderr)
        assert f"resuming from {out / 'checkpoints' / f'step-{step:06d}'} at step {step}" in (
            resumed.stdout + resumed.stderr)
        assert not partial.exists() and (out / "result.json").is_file()
    except BaseException:
        print(output_of(run), (tmp_path / "run.err").read_text()[-3000:])
        raise
    finally:
        kill_tree(run)
        if follow is not None:
            kill_tree(follow)
        run_err.close()
        follow_err.close()
