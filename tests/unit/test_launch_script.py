"""`cpudist launch` without training: the rank wrapper's variables (real processes), the metric
file's merge into the record, and what --dry-run shows for each launcher."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cpudist.cli.main import cli
from cpudist.run.script_rank import script_argv, script_env, torchrun_env
from cpudist.run.script_result import Ranks, build, split_metrics
from cpudist.train.dist import discover_rank

SHOW_ENV = ("import json, os; print(json.dumps({k: os environ.get(k) for k in ('RANK', "
            "'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'GROUP_RANK', 'GROUP_WORLD_SIZE', "
            "'OMP_NUM_THREADS', 'CPUDIST_RUN_DIR')}))"
            ).replace("os environ", "os.environ")
HYDRA_RANK_3_OF_4 = {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1",
                     "MPI_LOCALNRANKS": "2"}


def test_mpi_ranks_get_torchruns_variables() -> None:
    for env in (HYDRA_RANK_3_OF_4, {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
                                    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                                    "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}):
        got = torchrun_env(discover_rank(env))
        assert {k: got[k]
                for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                          "GROUP_WORLD_SIZE")} == {"RANK": "3", "WORLD_SIZE": "4",
                                                   "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                                                   "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2"}, env


def test_a_torchrun_launch_keeps_its_own_variables_and_threads_are_set() -> None:
    by_torchrun = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                   "GROUP_RANK": "0", "OMP_NUM_THREADS": "1", "PATH": "/bin"}
    out = script_env(by_torchrun, discover_rank(by_torchrun), 3, "/runs/x")
    assert out["GROUP_RANK"] == "0" and out["RANK"] == "1" and out["PATH"] == "/bin"
    assert out["OMP_NUM_THREADS"] == "3" and out["CPUDIST_RUN_DIR"] == "/runs/x"
    # A stale GROUP_RANK in an MPI rank's environment is replaced: the MPI numbering is the truth
    # there.
    mpi = {**HYDRA_RANK_3_OF_4, "GROUP_RANK": "7"}
    assert script_env(mpi, discover_rank(mpi), 1, "")["GROUP_RANK"] == "1"
    assert script_argv(["train.py", "--lr", "1"], "/py") == ["/py", "train.py", "--lr", "1"]
    assert script_argv(["accelerate", "launch", "t.py"], "/py") == ["accelerate", "launch", "t.py"]


def _wrapper(*command: str, env: dict[str, str], cwd: Path | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "cpudist.run.script_rank", "--run-dir", "out",
                             "--", *command],
                            env={**os.environ, **env}, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            text=True)


def test_the_wrapper_runs_the_command_with_the_variables_and_ends_as_it_failed(
    tmp_path: Path) -> None:
    p = _wrapper(sys.executable, "-c", SHOW_ENV + "; raise SystemExit(3)",
                 env={**HYDRA_RANK_3_OF_4, "CPUDIST_THREADS": "2"}, cwd=tmp_path)
    out, err = p.communicate(timeout=60)
    event, shown = out.splitlines()
    assert json.loads(event.split("@@cpudist ", 1)[1]) | {"host": "h"} == {
        "event": "script_rank", "rank": 3, "host": "h", "threads": 2, "source": "PMI_RANK"}
    # every line of the script tagged with its rank
    assert shown.startswith(f"[{socket.gethostname()}:3] {{")
    assert json.loads(shown.split("] ", 1)[1]) == {
                                 "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                                 "LOCAL_WORLD_SIZE": "2",
                                 "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "OMP_NUM_THREADS": "2",
                                 "CPUDIST_RUN_DIR": str(tmp_path / "out")}
    # Under Hydra (PMI_RANK) a failed script ends its rank by SIGTERM: Hydra then stops the other
    # ranks at once (it waits for them after a plain error code); the line says which rank failed
    # and how.
    assert p.returncode == -signal.SIGTERM
    assert err.strip().endswith("error: `" + sys.executable + " -c " + SHOW_ENV
                                + "; raise SystemExit(3)` exited with "
                                "code 3 on rank 3"), err
    # Open MPI stops the others itself
    ompi = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}
    p = _wrapper(sys.executable, "-c", "raise SystemExit(3)", env=ompi)
    p.communicate(timeout=60)
    assert p.returncode == 3


def test_a_signal_to_the_wrapper_reaches_the_script(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    p = _wrapper(sys.executable, "-c",
                 f"import pathlib, time; pathlib.Path({str(ready)!r}).touch(); time.sleep(60)",
                 env={})
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=30)  # within seconds, not the script's 60
    assert p.returncode == 128 + signal.SIGTERM


HF_ALL_RESULTS = {"epoch": 1.0, "eval_accuracy": 0.75, "eval_loss": 0.6, "train_loss": 0.69,
                  "train_runtime": 12.5, "train_samples": 100, "train_samples_per_second": 8.0,
                  "total_flos": 1234.0, "note": "text"}


def test_a_metric_file_fills_fields_by_their_own_or_hf_names_and_the_rest_are_metrics() -> None:
    fields, metrics = split_metrics(HF_ALL_RESULTS)
    assert fields == {"epochs": 1.0, "final_loss": 0.69, "train_time_s": 12.5, "train_samples": 100,
                      "train_samples_per_s": 8.0}
    assert metrics == {"eval_accuracy": 0.75, "eval_loss": 0.6, "total_flos": 1234.0}
    ranks = Ranks(command=("python", "t.py"), world_size=2, ppn=2, rank_hosts=("a", "a"),
                  rank_threads=(1, 1), wall_time_s=20.0, started_at="2026-11-26T10:00:00+00:00",
                  run_id="id", run_dir="/r")
    r = build(ranks, {"train_samples": 400}, {}, {"launcher": "mpich"})
    # samples / wall time
    assert (r.train_time_s, r.wall_time_s, r.train_samples_per_s) == (20.0, 20.0, 20.0)
    assert (r.model == "python t.py" and r.task == "script" and r.nodes == ("a",)
            and r.launcher == "mpich")
    r = build(ranks, HF_ALL_RESULTS, {}, {})
    assert (r.train_time_s, r.wall_time_s, r.train_samples_per_s, r.final_loss) == (12.5, 20.0, 8.0,
                                                                                    0.69)


def test_dry_run_shows_the_wrapper_under_each_launcher_and_starts_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("raise SystemExit('must not run')\n")
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost\n127.0.0.2\n")
    runner = CliRunner()
    mpi = runner.invoke(cli,
                        ["launch", "--np", "2", "--dry-run", "--env", "TOKEN=s3cret", "train.py",
                         "--lr", "1"])
    assert mpi.exit_code == 0, mpi.output
    assert " -np 2 " in mpi.output and "-m cpudist.run.script_rank --run-dir " in mpi.output
    assert mpi.output.rstrip().endswith("-- train.py --lr 1") and "s3cret" not in mpi.output
    torch = runner.invoke(cli,
                          ["launch", "--np", "2", "--launcher", "torchrun", "--dry-run", "--",
                           "python", "train.py"])
    assert "torch.distributed.run --nnodes 1 --nproc-per-node 2" in torch.output, torch.output
    assert "-m cpudist.run.script_rank" in torch.output
    across = runner.invoke(cli,
                           ["launch", "--np", "2", "--ppn", "1", "--hostfile", str(hosts),
                            "--dry-run", "--workdir", str(tmp_path), "--", "python", "train.py"])
    assert across.exit_code == 0, across.output
    assert ("localhost:1\n127.0.0.2:1" in across.output
            and f"--workdir {tmp_path} --" in across.output)
    slurm = runner.invoke(cli,
                          ["launch", "--launcher", "slurm", "--nodes", "2", "--ppn", "1",
                           "--partition", "cpu", "--dry-run", "--", "python", "train.py"])
    assert slurm.exit_code == 0, slurm.output
    assert "#SBATCH --partition=cpu" in slurm.output and "#SBATCH --nodes=2" in slurm.output
    assert "srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=1" in slurm.output
    run_dir = (tmp_path / slurm.output.split("# ", 1)[1].split("/job.sbatch")[0]).resolve()
    assert slurm.output.rstrip().endswith(f"-m cpudist.run.script_rank --run-dir {run_dir} -- "
                                          "python train.py")
    assert not Path("runs").exists()


@pytest.mark.parametrize(("args", "says"), [
    (["--np", "2", "--", "python", "missing.py"], "missing.py: no such file"),
    (["--np", "2", "--hostfile", "hosts", "--", "python", "t.py"], "--hostfile needs --ppn"),
    (["--np", "2", "--workdir", "nowhere", "--", "python", "t.py"], "nowhere"),
    (["--np", "2", "--detach", "--", "python", "t.py"],
     "--detach: not an option of cpudist launch (not yet"),
    (["--np", "2", "--nodez", "2", "python", "t.py"], "--nodez: not an option of cpudist launch"),
])
def test_bad_input_is_one_line_before_anything_starts(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                       args: list[str], says: str) -> None:
    monkeypatch.chdir(tmp_path)
    Path("t.py").write_text("")
    r = CliRunner().invoke(cli, ["launch", *args, "--dry-run"])
    assert r.exit_code == 2 and says in r.output, r.output


def test_collect_copies_outputs_and_a_missing_output_or_metric_file_is_a_note(
    tmp_path: Path) -> None:
    from cpudist.run.script import collect, given_metrics
    from cpudist.wire.payload import Script

    work, out = tmp_path / "work", tmp_path / "run"
    (work / "outputs" / "deep").mkdir(parents=True)
    (work / "outputs" / "deep" / "w.bin").write_bytes(b"\0\1")
    (work / "log.txt").write_text("log")
    (work / "bad.json").write_text("[1, 2]")
    notes: list[str] = []
    script = Script(command=("python", "t.py"), workdir=str(work), metric_file="bad.json",
                    collect=("outputs", "log.txt", "gone"))
    collect(script, out, notes.append)
    assert (out / "collected" / "outputs" / "deep" / "w.bin").read_bytes() == b"\0\1"
    assert (out / "collected" / "log.txt").read_text() == "log"
    assert [n for n in notes
            if "gone" in n] == [f"--collect gone: {work / 'gone'} does not exist after the run; "
                                "nothing copied"]
    assert given_metrics(script, notes.append) == {}
    assert notes[-1].startswith(f"--metric-file {work / 'bad.json'} holds a list, not an object")
    (work / "bad.json").write_text('{"train_samples": 8}')
    assert given_metrics(script, notes.append) == {"train_samples": 8}
