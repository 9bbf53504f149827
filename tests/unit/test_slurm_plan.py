"""--launcher slurm as data: the batch script, the srun line, Slurm's count lists and job states."""

from __future__ import annotations

import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cpudist.config import TrainConfig, from_argv
from cpudist.errors import BadInput
from cpudist.hostfile import Host
from cpudist.launch.batch import BatchOptions
from cpudist.launch.kinds import plan
from cpudist.launch.slurm import Allocation, JobInfo, expand_counts, failure, parse_job
from cpudist.launch.spec import RunSpec
from cpudist.train.dist import discover_rank
from tests.unit.specs import run_spec


def spec(np: int = 4, ppn: int = 2, **kw: object) -> RunSpec:
    base: dict[str, object] = dict(
        train=TrainConfig(task="mrpc", output_dir="runs/r1", model="tiny", max_steps=5), np=np,
        ppn=ppn,
        hosts=tuple(Host(f"slurm-node-{i}") for i in range(np // ppn)), launcher="slurm",
        launcher_path="/usr/bin/srun", python="/py/bin/python", master_addr="", master_port=29500,
        physical_cores=8, cwd="/home/u/work",
        batch=BatchOptions(partition="cpu", time="00:30:00", account="proj", exclusive=True,
                           sbatch_args=("--mem=0", "--constraint=icelake")))
    base.update(kw)
    return run_spec(**base)


def test_batch_script() -> None:
    launch = plan(spec())
    script = launch.script
    assert script is not None and script.startswith("#!/bin/bash\n")
    assert launch.argv == ("sbatch", "--parsable", "/home/u/work/runs/r1/job.sbatch")
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2", "#SBATCH --partition=cpu",
                 "#SBATCH --time=00:30:00", "#SBATCH --account=proj", "#SBATCH --exclusive",
                 "#SBATCH --mem=0", "#SBATCH --constraint=icelake", "#SBATCH --chdir=/home/u/work",
                 "#SBATCH --output=/home/u/work/runs/r1/slurm-%j.out", "export OMP_NUM_THREADS=4",
                 "export CPUDIST_THREADS=auto", "export PYTHONUNBUFFERED=1",
                 'nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))',
                 'export MASTER_ADDR="${nodes[0]}"'):
        assert line in script.splitlines(), line
    srun = script.splitlines()[-1].split()
    assert srun[:7] == ["exec", "srun", "--nodes=2", "--ntasks=4", "--ntasks-per-node=2",
                        "--kill-on-bad-exit=1", "--label"]
    assert from_argv(srun[srun.index("cpudist.rank") + 1:]) == spec().train


def test_batch_script_is_valid_bash_and_works_out_the_cpus() -> None:
    """The script's own lines, with scontrol and srun replaced by echoes of what they would get."""
    script = plan(spec()).script
    assert script is not None
    body = (script.replace("scontrol show hostnames", "echo n7 n8; true")
            .replace("exec srun", "echo srun"))
    env = {"SLURM_JOB_NODELIST": "n[7-8]", "SLURM_JOB_ID": "123",
           "SLURM_JOB_CPUS_PER_NODE": "16(x2)", "PATH": "/usr/bin:/bin"}
    body = body.replace("echo srun", 'echo "$MASTER_ADDR $MASTER_PORT $SRUN_CPUS_PER_TASK" srun')
    out = subprocess.run(["bash", "-c", body], capture_output=True, text=True, env=env,
                         check=True).stdout
    assert out.startswith("n7 20123 8 srun --nodes=2")


def test_srun_inside_an_allocation() -> None:
    alloc = Allocation("77", ("c1", "c2", "c3"), 16)
    launch = plan(spec(allocation=alloc, hosts=tuple(Host(n) for n in alloc.nodes),
                       master_addr="c1"))
    assert launch.script is None
    argv = list(launch.argv)
    assert argv[:7] == ["srun", "--nodes=2", "--ntasks=4", "--ntasks-per-node=2",
                        "--kill-on-bad-exit=1", "--label", "--cpus-per-task=8"]
    assert launch.rank_env["MASTER_ADDR"] == "c1"
    with pytest.raises(BadInput, match=r"allocation \(job 77\) has 3"):
        plan(spec(np=8, ppn=2, allocation=alloc, hosts=tuple(Host(f"x{i}") for i in range(4))))


@pytest.mark.parametrize(("text", "counts"),
                         [("2", [2]), ("2(x3)", [2, 2, 2]), ("2(x3),1", [2, 2, 2, 1]),
                          ("16(x2),8,4(x1)", [16, 16, 8, 4])])
def test_count_lists(text: str, counts: list[int]) -> None:
    assert expand_counts(text) == counts


@given(st.lists(st.tuples(st.integers(1, 128), st.integers(1, 5)), min_size=1, max_size=6))
def test_count_lists_round_trip(groups: list[tuple[int, int]]) -> None:
    text = ",".join(f"{n}(x{k})" if k > 1 else str(n) for n, k in groups)
    assert expand_counts(text) == [n for n, k in groups for _ in range(k)]


def test_ranks_per_node_from_srun() -> None:
    env = {"SLURM_PROCID": "6", "SLURM_NTASKS": "7", "SLURM_LOCALID": "0", "SLURM_NODEID": "3",
           "SLURM_STEP_TASKS_PER_NODE": "2(x3),1", "SLURM_NTASKS_PER_NODE": "2"}
    assert discover_rank(env).local_world_size == 1  # the last node holds one rank
    assert discover_rank({**env, "SLURM_NODEID": "0"}).local_world_size == 2
    with pytest.raises(BadInput, match="not a Slurm task count"):
        discover_rank({**env, "SLURM_STEP_TASKS_PER_NODE": "two"})


SCONTROL = ("JobId=42 JobName=cpudist-mrpc UserId=root(0) GroupId=root(0) Priority=1 "
            "JobState=TIMEOUT "
            "Reason=TimeLimit Dependency=(null) ExitCode=0:15 RunTime=00:01:00 TimeLimit=00:01:00 "
            "NodeList=n[1-2] BatchHost=n1 Command=/work/runs/r1/job.sbatch\n")


def test_job_state_from_scontrol() -> None:
    info = parse_job(SCONTROL)
    assert info == JobInfo(job_id="42", state="TIMEOUT", reason="TimeLimit", exit_code="0:15",
                           nodes="n[1-2]", run_time="00:01:00", time_limit="00:01:00")
    assert info.ended and not JobInfo(job_id="42",
                                      state="RUNNING").ended and not JobInfo(job_id="42",
                                                                             state="PENDING").ended
    assert parse_job("slurm_load_jobs error: Invalid job id specified\n") is None


def test_a_failed_job_is_one_line_naming_its_state() -> None:
    info = parse_job(SCONTROL)
    assert info is not None
    message, hint = failure(info, "/work/runs/r1/slurm-42.out", None)
    assert message == ("Slurm job 42 ended TIMEOUT on n[1-2] after 00:01:00, time limit 00:01:00, "
                       "exit code 0:15")
    assert "--time" in hint
    message, hint = failure(JobInfo(job_id="43", state="FAILED", reason="NonZeroExitCode",
                                    exit_code="1:0", nodes="n1", run_time="00:00:09"),
                            "out", "0: [n1:0] error: data directory not found")
    assert message.startswith("Slurm job 43 ended FAILED on n1 after 00:00:09, exit code 1:0: 0: "
                              "[n1:0] error: ")
    assert "\n" not in message and hint == "See the rank output above and out"
    assert "sinfo -R" in failure(JobInfo(job_id="44", state="NODE_FAIL"), "out", None)[1]
