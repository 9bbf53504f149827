"""--launcher slurm against a real Slurm (slurm-wlm 22.05, munge) on two network-namespace hosts.

tests/harness/slurm.py starts slurmctld on host 0 (the login node, and a compute node too) and a
slurmd on each host under its own hostname; cpudist runs on host 0 as a user of an HPC login node
would. Needs root and Debian's slurm-wlm and munge (tests/harness/setup.sh installs them; CI runs as
root).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from cpudist.cli.main import cli
from cpudist.wire.stop_marker import NAME as MARKER
from tests.harness import netns
from tests.harness import slurm as slurm_harness
from tests.harness.slurm import SlurmCluster
from tests.integration.helpers import cmdline, kill_tree, read_until

MISSING = netns.missing_requirements() or slurm_harness.missing_requirements()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(MISSING is not None, reason=str(MISSING))]
CPUDIST = [sys.executable, "-m", "cpudist.cli"]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    with slurm_harness.on_namespace_hosts(2, tmp_path_factory.mktemp("slurm-hosts"),
                                          "slm") as cluster:
        yield cluster


def mrpc(data: Path, out: Path, *extra: str) -> list[str]:
    """`cpudist run mrpc` on 64 rows (what is checked here is Slurm's side, not the data's)."""
    return [*CPUDIST, "run", "mrpc", "--data-dir", str(data / "glue" / "MRPC"), "--model", "tiny",
            "--max-train-samples", "64", "--output-dir", str(out), *extra]


# --max-steps, not --epochs, for a run that must go on until stopped: 64 rows make short epochs.
GO_ON = ("--max-steps", "100000", "--no-eval")


def job_state(slurm: SlurmCluster, job_id: str) -> str:
    out = slurm.run(0, ["scontrol", "show", "job", "-o", job_id]).stdout
    return re.search(r"JobState=(\S+)", out).group(1)  # type: ignore[union-attr]


def ranks_left(slurm: SlurmCluster) -> list[str]:
    return [cmdline(pid)[:100] for i in range(slurm.hosts.n) for pid in slurm.hosts.pids(i)
            if "cpudist.rank" in cmdline(pid) or "slurmstepd" in cmdline(pid)]


def one_error(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, stderr[-3000:]
    return errors[0]


def test_sbatch_on_two_nodes(slurm: SlurmCluster, shared_data: Path, tmp_path: Path) -> None:
    """From the login node: the script is written, submitted and followed; result.json names both
    nodes."""
    r = slurm.run(0,
                  mrpc(shared_data, tmp_path / "run", "--launcher", "slurm", "--nodes", "2",
                       "--ppn", "1",
                       "--max-steps", "5", "--max-eval-samples", "32"), cwd=str(tmp_path),
                  timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert sorted(result["nodes"]) == [slurm.hosts.name(0), slurm.hosts.name(1)]
    assert result["launcher"] == "slurm" and result["world_size"] == 2 and result["slurm_job_id"]
    assert f"Slurm job {result['slurm_job_id']}: RUNNING" in r.stderr and "step 5/5" in r.stderr
    script = (tmp_path / "run" / "job.sbatch").read_text()
    assert "#SBATCH --nodes=2" in script and "export CPUDIST_THREADS=auto" in script \
        and "exec srun " in script
    assert (tmp_path / "run" / "command.txt").read_text().startswith("sbatch --parsable ")
    # rank 0 saved it from its node into the run folder the nodes share
    model = tmp_path / "run" / "model"
    assert result["model_dir"] == str(model.resolve()) and (model / "model.safetensors").is_file()
    # the login side's record wrote the card again
    assert "launched with slurm" in (model / "README.md").read_text()
    ledger = Path(os.environ["CPUDIST_HOME"]) / "results.jsonl"
    assert json.loads(ledger.read_text().splitlines()[-1])["slurm_job_id"] == result["slurm_job_id"]
    assert slurm.jobs() == [] and ranks_left(slurm) == []


def test_inside_an_allocation_srun_runs_the_ranks(slurm: SlurmCluster, shared_data: Path,
                                                  tmp_path: Path) -> None:
    """`salloc -N 2 cpudist run ...` (the default --launcher auto): srun within the allocation, no
    sbatch."""
    r = slurm.run(0,
                  ["salloc", "-N", "2",
                   *mrpc(shared_data, tmp_path / "run", "--nodes", "2", "--ppn", "1",
                          "--max-steps", "3", "--no-eval")],
                  cwd=str(tmp_path), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    granted = re.search(r"Granted job allocation (\d+)", r.stderr)
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert granted and result["slurm_job_id"] == granted.group(1)
    assert len(set(result["nodes"])) == 2 and result["launcher"] == "slurm"
    assert (tmp_path / "run" / "command.txt").read_text().startswith("srun --nodes=2 --ntasks=2 ")
    assert not (tmp_path / "run" / "job.sbatch").exists()


def test_a_failing_rank_is_reported_with_the_job_state(slurm: SlurmCluster, shared_data: Path,
                                                       tmp_path: Path) -> None:
    # A rank that fails where it runs (gloo finds no such interface on the node), past every check
    # the login side can make: a bad --env CPUDIST_THREADS, which this test used, is now refused
    # before the job is submitted.
    r = slurm.run(0, mrpc(shared_data, tmp_path / "run", "--launcher", "slurm", "--max-steps", "3",
                          "--env", "GLOO_SOCKET_IFNAME=nosuch0"), cwd=str(tmp_path), timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr[-4000:]
    error = one_error(r.stderr)
    assert re.match(r"Error: Slurm job \d+ ended FAILED on \S+ after \S+, exit code 1:0",
                    error), error
    assert "Unable to find address for: nosuch0" in r.stdout + r.stderr
    assert slurm.jobs() == []


def test_ctrl_c_cancels_the_job(slurm: SlurmCluster, shared_data: Path, tmp_path: Path) -> None:
    proc = slurm.popen(0,
                       mrpc(shared_data, tmp_path / "run", "--launcher", "slurm", "--nodes", "2",
                            "--ppn", "1", *GO_ON, "--log-every", "1"),
                       cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        seen = read_until(proc, "step 2/")
        job = re.search(r"submitted Slurm job (\d+)", "".join(seen))
        assert job, "".join(seen)[-3000:]
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=90)
    finally:
        kill_tree(proc)
    assert proc.returncode == 130 \
        and f"interrupted: Slurm job {job.group(1)} was cancelled (scancel)" in out, out
    # they checkpointed on the way out
    assert "the ranks stopped at step " in out and "--resume auto" in out, out
    assert job_state(slurm, job.group(1)) == "CANCELLED"
    assert slurm.jobs() == [] and ranks_left(slurm) == []


def test_time_limit_is_reported_as_timeout(slurm: SlurmCluster, shared_data: Path,
                                           tmp_path: Path) -> None:
    """--time 00:00:30 (Slurm rounds it up to a minute): the job ends TIMEOUT, said in one line,
    exit 1.

    The rank is held (SIGSTOP) once its first step is logged: a minute of training cost a minute of
    CPU on each core, for nothing this checks. At the time limit Slurm's signals end it all the same
    (SIGTERM, and SIGKILL KillWait later)."""
    proc = slurm.popen(0,
                       mrpc(shared_data, tmp_path / "run", "--launcher", "slurm", "--time",
                            "00:00:30", *GO_ON,
                            "--log-every", "1"), cwd=str(tmp_path), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT)
    held: list[int] = []
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        # to the end: the time limit ends the job (a slow start may not reach step 1)
        for line in proc.stdout:
            lines.append(line)
            if not held and "step 1/" in line:
                held = [pid for i in range(slurm.hosts.n) for pid in slurm.hosts.pids(i)
                        if cmdline(pid).split()[1:3] == ["-m", "cpudist.rank"]]
                for pid in held:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGSTOP)
        proc.wait(timeout=120)
    finally:
        for pid in held:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        kill_tree(proc)
    out = "".join(lines)
    # one stream: stdout and stderr
    r = subprocess.CompletedProcess(proc.args, proc.returncode, out, out)
    assert r.returncode == 1, r.stdout + r.stderr[-4000:]
    error = one_error(r.stderr)
    assert re.match(r"Error: Slurm job \d+ ended TIMEOUT on \S+ after 00:01:\d\d, time limit "
                    r"00:01:00", error), error
    assert "Raise --time" in error
    if (tmp_path / "run" / MARKER).exists():  # the ranks had time to checkpoint at Slurm's SIGTERM
        assert "--resume auto" in error
    assert slurm.jobs() == []


def test_dry_run_prints_the_script(shared_data: Path, tmp_path: Path) -> None:
    # in this process (Click's runner): a dry run starts nothing, and a `cpudist` process costs ~3
    # CPU-s to import
    r = CliRunner().invoke(cli,
                           ["run", "mrpc", "--data-dir", str(shared_data / "glue" / "MRPC"),
                            "--model", "tiny", "--launcher", "slurm", "--nodes", "2", "--ppn", "2",
                            "--partition", "batch", "--time", "10", "--exclusive",
                            "--sbatch-arg=--mem=0", "--output-dir", str(tmp_path / "dry"),
                            "--dry-run"])
    assert r.exit_code == 0, r.output
    note, *lines = r.stdout.splitlines()  # first what the 4 ranks do to the learning rate
    assert note == "# 4 ranks x batch 16 = global batch 64: lr 2e-05 x 4 = 8e-05 (--lr-scaling " \
                   "auto: linear on more than one rank; --lr-scaling none keeps 2e-05)"
    assert lines[0] == f"# {tmp_path / 'dry' / 'job.sbatch'} (written and submitted with " \
                       f"`sbatch --parsable {tmp_path / 'dry' / 'job.sbatch'}`)"
    assert lines[1] == "#!/bin/bash"
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2", "#SBATCH --partition=batch",
                 "#SBATCH --time=10", "#SBATCH --exclusive", "#SBATCH --mem=0"):
        assert line in lines
    assert lines[-1].startswith("exec srun --nodes=2 --ntasks=4 --ntasks-per-node=2 ")
    assert not (tmp_path / "dry").exists()
