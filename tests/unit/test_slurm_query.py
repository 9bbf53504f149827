"""What Slurm says of a job, through hiccups: launch/slurm_query.py against stand-in `scontrol` and
`sacct` programs first on the PATH (real processes that print what Slurm 22.05 prints, fail as a
busy slurmctld fails, or never answer), and the --requeue batch script as data."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cpudist.config import TrainConfig, from_argv
from cpudist.errors import JobFailed
from cpudist.hostfile import Host
from cpudist.launch import slurm_query
from cpudist.launch.batch import BatchOptions
from cpudist.launch.kinds import plan
from cpudist.launch.slurm_query import final_info, job_info, parse_sacct
from cpudist.wire.stop_marker import NAME as MARKER
from tests.unit.specs import run_spec

RUNNING = ("JobId=42 JobName=cpudist-mrpc UserId=root(0) JobState=RUNNING Reason=None "
           "Dependency=(null) RunTime=00:00:07 TimeLimit=UNLIMITED NodeList=n0 ExitCode=0:0")
ENDED = RUNNING.replace("JobState=RUNNING", "JobState=COMPLETED")


def program(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "bin"
    d.mkdir()
    monkeypatch.setenv("PATH", f"{d}:/usr/bin:/bin")
    monkeypatch.setattr(slurm_query, "RETRY_S", 0.05)
    return d


def flaky_scontrol(bin_dir: Path, failures: int, answer: str) -> Path:
    """scontrol that fails `failures` times as a busy slurmctld does, then prints `answer`; its
    calls counted."""
    calls = bin_dir / "calls"
    program(bin_dir, "scontrol",
            f'echo x >> {calls}\nif [ $(wc -l < {calls}) -le {failures} ]; then\n'
            '  echo "slurm_load_jobs error: Socket timed out on send/recv '
            'operation" >&2; exit 1\n'
            f"fi\necho '{answer}'\n")
    return calls


def test_a_busy_slurmctld_is_asked_again(bin_dir: Path) -> None:
    calls = flaky_scontrol(bin_dir, 3, RUNNING)
    info = job_info("42")
    assert info is not None and info.state == "RUNNING" and info.nodes == "n0"
    assert len(calls.read_text().split()) == 4


def test_a_slurmctld_that_stays_away_is_one_line_within_the_patience(bin_dir: Path) -> None:
    flaky_scontrol(bin_dir, 10**6, RUNNING)
    started = time.monotonic()
    with pytest.raises(JobFailed) as e:
        job_info("42", patience_s=0.5)
    assert time.monotonic() - started < 5
    assert e.value.what.startswith("slurmctld did not answer `scontrol show job 42` for 0.5s "
                                   "(slurm_load_jobs error: Socket timed out"), e.value.what
    assert "may still be running" in e.value.what and "scancel 42" in e.value.message


def test_a_call_that_hangs_is_cut_and_retried(bin_dir: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slurm_query, "CALL_TIMEOUT_S", 0.3)
    program(bin_dir, "scontrol", "exec sleep 30\n")
    with pytest.raises(JobFailed, match=r"no answer within 0.3s"):
        job_info("42", patience_s=1.0)


def test_a_forgotten_job_is_none_at_once(bin_dir: Path) -> None:
    program(bin_dir, "scontrol",
            'echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1\n')
    assert job_info("42", patience_s=30) is None  # no retry: that answer is final


def test_ended_jobs_come_from_sacct_when_there_is_accounting(bin_dir: Path) -> None:
    program(bin_dir, "sacct", "echo '42|CANCELLED by 0|0:15|n[0-1]|00:01:02|00:05:00|None'\n")
    live = parse_sacct("")
    assert live is None
    info = final_info("42", None)  # slurmctld forgot it (MinJobAge): the database still knows
    assert (info.state, info.exit_code, info.nodes, info.run_time) == (
        "CANCELLED", "0:15", "n[0-1]", "00:01:02")


def test_without_accounting_scontrol_says_how_it_ended(bin_dir: Path) -> None:
    program(bin_dir, "sacct", 'echo "Slurm accounting storage is disabled" >&2; exit 1\n')
    program(bin_dir, "scontrol", f"echo '{ENDED}'\n")
    started = time.monotonic()
    live = job_info("42")
    assert live is not None and final_info("42", live).state == "COMPLETED"
    assert time.monotonic() - started < 5  # "disabled" is an answer, not a hiccup to wait out
    assert final_info("42", None).state == "UNKNOWN"


def test_sacct_behind_slurmctld_does_not_hide_the_end(bin_dir: Path) -> None:
    # slurmdbd not told yet
    program(bin_dir, "sacct", "echo '42|RUNNING|0:0|n0|00:00:07|UNLIMITED|None'\n")
    live = parse_sacct("42|COMPLETED|0:0|n0|00:00:09|UNLIMITED|None\n")
    assert live is not None and final_info("42", live).state == "COMPLETED"


def test_a_sacct_error_falls_back_to_scontrol_at_once(bin_dir: Path) -> None:
    calls = bin_dir / "sacct-calls"
    program(bin_dir, "sacct", f"echo x >> {calls}\n"
                              'echo "sacct: error: Problem talking to the database: Connection '
                              'refused" >&2; exit 1\n')
    live = parse_sacct("42|COMPLETED|0:0|n0|00:00:09|UNLIMITED|None\n")
    assert live is not None and final_info("42", live).state == "COMPLETED"
    assert final_info("42", None).state == "UNKNOWN"
    assert len(calls.read_text().split()) == 2  # once each: an error is no record on its way


def test_a_record_sacct_has_not_got_yet_is_asked_for_again_when_nothing_else_knows(
    bin_dir: Path) -> None:
    calls = bin_dir / "sacct-calls"
    program(bin_dir, "sacct",
            f"echo x >> {calls}\nif [ \"$2\" = 42 ] && [ $(wc -l < {calls}) -ge 3 ]; then\n"
            # slurmdbd told late
            "  echo '42|COMPLETED|0:0|n0|00:00:09|UNLIMITED|None'\nfi\n")
    assert final_info("42", None).state == "COMPLETED"
    assert len(calls.read_text().split()) == 3
    # never recorded: the lag has an end
    assert final_info("43", None, lag_s=0.2).state == "UNKNOWN"

def test_requeue_script() -> None:
    spec = run_spec(train=TrainConfig(task="mrpc", output_dir="runs/r1", model="tiny",
                                      run_id="20261126-1"), np=2,
                   ppn=1, hosts=(Host("slurm-node-0"), Host("slurm-node-1")), launcher="slurm",
                   launcher_path="/usr/bin/srun", python="/py/bin/python", master_addr="",
                    master_port=29500,
                   physical_cores=8, cwd="/home/u",
                    batch=BatchOptions(time="10", requeue=True, signal_s=180))
    script = plan(spec).script
    assert script is not None
    lines = script.splitlines()
    for line in ("#SBATCH --requeue", "#SBATCH --signal=B:USR1@180", "#SBATCH --open-mode=append",
                 "trap 'stop=1; scancel --signal=TERM \"$SLURM_JOB_ID\"' USR1",
                 f"if [ \"$stop\" != 0 ] && [ -e /home/u/runs/r1/{MARKER} ]; then",
                 '  scontrol requeue "$SLURM_JOB_ID"'):
        assert line in lines, line
    srun = next(line for line in lines if line.startswith("srun "))
    assert srun.endswith(" &")
    train = from_argv(srun.removesuffix(" &").split()[srun.split().index("cpudist.rank") + 1:])
    # a requeued start goes on with this run only
    assert train.resume == "auto" and train.run_id == "20261126-1"
