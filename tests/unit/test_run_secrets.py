"""--secret / --env-file (issue 23 item 3): values reach the ranks by a 0600 file, never a command
line or a shown file, whatever the launcher; the rank entry reads them into its environment."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cpudist import secrets
from cpudist.cli.main import cli
from cpudist.config import TrainConfig
from cpudist.errors import BadInput
from cpudist.hostfile import Host
from cpudist.launch import secret_files
from cpudist.launch.batch import BatchOptions
from cpudist.launch.kinds import plan
from cpudist.launch.spec import RunSpec, file_pairs, redacted
from cpudist.run.request import LaunchOptions, RunRequest
from tests.unit.specs import run_spec

SECRET = "tok-6f1c2e9a"
HOSTS = (Host("10.0.0.1", 2), Host("10.0.0.2", 2))


def spec(launcher: str, **kw: object) -> RunSpec:
    base = dict(train=TrainConfig(task="synthetic", output_dir="/r/out", run_id="r1"), np=4, ppn=2,
                hosts=HOSTS, launcher=launcher, launcher_path=f"/bin/{launcher}",
                python="/usr/bin/python3", master_addr="10.0.0.1", master_port=29500,
                physical_cores=4, hostfile="/r/hostfile", ssh="/h/.cpudist/cluster/ssh",
                secrets=(("HF_TOKEN", SECRET),))
    return run_spec(**{**base, **kw})


@pytest.mark.parametrize("launcher", ["mpich", "impi", "openmpi", "torchrun", "slurm"])
def test_no_launcher_puts_a_secret_on_a_line_or_in_its_script(launcher: str) -> None:
    """Hydra's -genv, Open MPI's -x, torchrun's per-host ssh lines and job.sbatch carry the file's
    path only."""
    extra = {"batch": BatchOptions(partition="cpu", time="10", account=None, exclusive=True,
                                   sbatch_args=()),
             "hostfile": None} if launcher == "slurm" else {}
    launch = plan(spec(launcher, **extra))
    shown = " ".join([*launch.argv, launch.shell(), launch.script or "",
                      json.dumps(launch.rank_env)])
    assert SECRET not in shown and "HF_TOKEN" not in shown
    assert launch.rank_env[secrets.SECRETS_ENV] == "~/.cpudist/secrets/r1.json"
    assert "~/.cpudist/secrets/r1.json" in shown  # every rank is told where its node's file is
    assert SECRET not in json.dumps(redacted(spec(launcher)).launch.secrets)


def test_without_secrets_no_file_is_named() -> None:
    assert secrets.SECRETS_ENV not in plan(spec("mpich", secrets=())).rank_env


def test_env_file_and_secret_names(tmp_path: Path) -> None:
    f = tmp_path / "wandb.env"
    f.write_text("# keys\nexport WANDB_API_KEY='k=1 2'\n\nHF_TOKEN=\"abc\"\nPLAIN = x \n")
    assert secrets.parse_env_file(f) == (("WANDB_API_KEY", "k=1 2"), ("HF_TOKEN", "abc"),
                                         ("PLAIN", "x"))
    f.write_text("OK=1\nnot a pair\n")
    with pytest.raises(BadInput, match="line 2: not of the form NAME=value"):
        secrets.parse_env_file(f)
    with pytest.raises(BadInput, match=r"cannot|No such file"):
        secrets.parse_env_file(tmp_path / "none.env")
    assert secrets.from_environment(("A",), {"A": "1"}) == (("A", "1"),)
    with pytest.raises(BadInput, match="--secret B: B is not set"):
        secrets.from_environment(("B",), {"A": "1"})


def test_rank_entry_reads_the_file_into_its_environment(tmp_path: Path) -> None:
    where = str(tmp_path / "s.json")
    path = secrets.write_here(where, (("HF_TOKEN", SECRET),))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    env: dict[str, str] = {secrets.SECRETS_ENV: where, "HF_TOKEN": "old"}
    secrets.load_into(env)
    assert env["HF_TOKEN"] == SECRET
    with pytest.raises(BadInput, match=r"secrets file .* cannot be read on this node"):
        secrets.load_into({secrets.SECRETS_ENV: str(tmp_path / "gone.json")})


def test_placed_writes_0600_here_for_the_run_and_removes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On one machine (no other node): the file is there, 0600, while the block runs, and gone
    after, also when the launch fails."""
    monkeypatch.setenv("HOME", str(tmp_path))
    s = spec("mpich", hostfile=None)
    path = tmp_path / ".cpudist" / "secrets" / "r1.json"
    with pytest.raises(RuntimeError), secret_files.placed(s):
        assert json.loads(path.read_text()) == {"HF_TOKEN": SECRET}
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        raise RuntimeError("the launch failed")
    assert not path.exists()


def test_the_remote_agents_request_carries_secrets_and_dry_run_hides_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The request crosses to the head as data (stdin), secrets included; `--dry-run` from outside
    shows ***."""
    req = RunRequest(train=TrainConfig(task="synthetic", output_dir="/r"),
                     launch=LaunchOptions(np=2, ppn=1, secrets=(("K", SECRET),)))
    assert RunRequest.from_json(req.to_json()) == req
    monkeypatch.setenv("CPD_TEST_TOKEN", SECRET)
    (tmp_path / "h").write_text("10.9.0.1\n10.9.0.2\n")
    env_file = tmp_path / "e.env"
    env_file.write_text(f"OTHER={SECRET}x\n")
    r = CliRunner().invoke(cli,
                           ["run", "synthetic", "--np", "2", "--ppn", "1", "--hostfile",
                            str(tmp_path / "h"),
                             "--head", "10.9.0.1", "--secret", "CPD_TEST_TOKEN", "--env-file",
                            str(env_file),
                             "--output-dir", str(tmp_path / "out"), "--dry-run"])
    assert r.exit_code == 0, r.output
    assert (SECRET not in r.output
            and '"secrets": [["OTHER", "***"], ["CPD_TEST_TOKEN", "***"]]' in r.output)
    r = CliRunner().invoke(cli,
                           ["run", "synthetic", "--secret", "CPD_NOT_SET_ANYWHERE", "--dry-run"])
    assert r.exit_code == 2 and "CPD_NOT_SET_ANYWHERE is not set" in r.output


def test_a_detached_agent_leaves_its_request_file_without_values(tmp_path: Path) -> None:
    """`run --detach` from outside: the request file on the head keeps no --env or secret value once
    the agent took it (the thread count stays shown); an unreadable request file is removed."""
    from cpudist.run.agent import take_request

    launch = LaunchOptions(np=2, ppn=1, env=(("HF_TOKEN", SECRET), ("OMP_NUM_THREADS", "2")),
                           secrets=(("K", SECRET),))
    req = RunRequest(train=TrainConfig(task="synthetic", output_dir="/r"), launch=launch)
    path = tmp_path / "agent.request.json"
    path.write_text(req.to_json())
    assert take_request(path) == req
    kept = path.read_text()
    assert SECRET not in kept and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert RunRequest.from_json(kept).launch.env == (("HF_TOKEN", "***"), ("OMP_NUM_THREADS", "2"))
    path.write_text(req.to_json()[:-9])
    with pytest.raises(ValueError):
        take_request(path)
    assert not path.exists()


def test_a_local_dry_run_names_the_file_not_the_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CPD_TEST_TOKEN", SECRET)
    r = CliRunner().invoke(cli,
                           ["run", "synthetic", "--np", "2", "--model", "tiny", "--secret",
                            "CPD_TEST_TOKEN", "--dry-run"])
    assert r.exit_code == 0, r.output
    assert SECRET not in r.output and "CPUDIST_SECRETS=~/.cpudist/secrets/" in r.output


def test_write_command_takes_the_values_on_stdin(tmp_path: Path) -> None:
    """What a node runs over ssh: the path in its words, the values only on stdin; the file 0600."""
    where = secrets.file_for("r/1")
    command = secrets.write_command(where)
    assert SECRET not in command and where.removeprefix("~/") in command
    env = {**os.environ, "HOME": str(tmp_path)}
    subprocess.run(["sh", "-c", command], input=secrets.render((("K", SECRET),)), text=True,
                   env=env, check=True)
    path = tmp_path / where.removeprefix("~/")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and json.loads(path.read_text()) == {
        "K": SECRET}
    subprocess.run(["sh", "-c", secrets.remove_command(where)], env=env, check=True)
    assert not path.exists()


def test_rank_output_hides_secret_values() -> None:
    """A rank that prints its token shows *** in ranks.log and on screen; a short value (a thread
    count) is left."""
    hide = secret_files.hider(spec("mpich",
                                   secrets=(("HF_TOKEN", SECRET), ("CPUDIST_THREADS", "3"))))
    assert hide(f"[h:0] token={SECRET} threads=3") == "[h:0] token=*** threads=3"
    assert secret_files.hider(spec("mpich", secrets=()))("a b") == "a b"


# what the batch script calls, as programs on its PATH: srun as the ranks' end (or a notice first)
FAKE_SLURM = {
    "scontrol": 'if [ "$1 $2" = "show hostnames" ]; then echo n1; fi\n',
    "scancel": "true\n",
    "srun": 'echo "ranks get ${WANDB_API_KEY:-nothing}"\n'
            'if [ -n "$NOTICE" ]; then touch "$NOTICE"; kill -USR1 "$PPID"; sleep 0.3; fi\n'
            'exit 0\n',
}


@pytest.mark.parametrize("requeue", [False, True])
def test_a_batch_script_holds_no_value_and_its_end_removes_the_secrets_file(
        tmp_path: Path, requeue: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A detached Slurm job outlives `cpudist run`: its batch script (a file Slurm copies too) names
    the --env values, which it exports from the secrets file for the ranks; it removes that file
    when it ends, and keeps it when it requeued the job (the next start reads it again). Run by
    bash, with Slurm's commands faked."""
    monkeypatch.setenv("HOME", str(tmp_path))
    out, key = tmp_path / "out", "wandb-7d1e0c4b"
    options = BatchOptions(partition="cpu", time="10", account=None, exclusive=False,
                           sbatch_args=(), requeue=requeue)
    s = spec("slurm", batch=options, hostfile=None,
             train=TrainConfig(task="synthetic", output_dir=str(out), run_id="r1"),
             env=(("WANDB_API_KEY", key), ("OMP_NUM_THREADS", "2")))
    script = plan(s).script
    assert script is not None and SECRET not in script and key not in script
    assert "export OMP_NUM_THREADS=2" in script.splitlines()  # a thread count stays shown
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in FAKE_SLURM.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    where = Path(str(secret_files.left_for_job(s))).expanduser()
    assert json.loads(where.read_text()) == {"HF_TOKEN": SECRET, "WANDB_API_KEY": key}
    out.mkdir()
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "SLURM_JOB_ID": "7",
           "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_CPUS_PER_NODE": "2",
           "NOTICE": str(out / "preempted.json") if requeue
           else ""}
    ran = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env,
                         timeout=30)
    assert ran.returncode == 0, ran.stderr
    assert f"ranks get {key}" in ran.stdout, ran.stdout + ran.stderr
    assert ("requeueing Slurm job 7" in ran.stdout) == requeue, ran.stdout
    assert where.exists() == requeue, ran.stdout + ran.stderr


def test_a_batch_script_keeps_the_secrets_file_for_a_requeue_that_slurm_started(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`scontrol requeue` or a node failure: slurmctld has counted the restart when this start's
    end runs its trap, so the file stays for the next start; that start's own end (its count
    unchanged) removes it."""
    monkeypatch.setenv("HOME", str(tmp_path))
    s = spec("slurm",
             batch=BatchOptions(partition="cpu", time="10", account=None, exclusive=False,
                                sbatch_args=()), hostfile=None)
    script = plan(s).script
    assert script is not None
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = {**FAKE_SLURM, "scontrol": 'if [ "$1 $2" = "show job" ]; then '
                                      'echo "JobId=7 Restarts=1 Requeue=1"; else echo n1; fi\n'}
    for name, body in fake.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "SLURM_JOB_ID": "7",
           "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_CPUS_PER_NODE": "2", "NOTICE": ""}
    where = Path(str(secret_files.left_for_job(s))).expanduser()
    # the first start, which Slurm requeued; then the next, the job's last
    for restart_count, kept in ((None, True), ("1", False)):
        count = {"SLURM_RESTART_COUNT": restart_count} if restart_count else {}
        ran = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                             env={**env, **count})
        assert ran.returncode == 0, ran.stderr
        assert where.exists() == kept, (restart_count, ran.stderr)


def test_torchrun_hosts_take_env_values_from_the_secrets_file(tmp_path: Path) -> None:
    """Across a hostfile each host's ssh line (shown by `ps` while the run lasts) names the --env
    values and shows the thread count; the file holds the values, and the tether starts its command
    with them in its environment."""
    s = spec("torchrun",
             env=(("WANDB_API_KEY", "wandb-2b7e51"), ("OMP_NUM_THREADS", "2")))
    launch = plan(s)
    assert "wandb-2b7e51" not in launch.shell() and SECRET not in launch.shell()
    for _, argv in launch.per_host:
        assert "--from-secrets WANDB_API_KEY --" in argv[-1], argv
        assert "OMP_NUM_THREADS=2" in argv[-1], argv
    assert dict(file_pairs(s)) == {"HF_TOKEN": SECRET, "WANDB_API_KEY": "wandb-2b7e51"}
    where = str(tmp_path / "s.json")
    secrets.write_here(where, file_pairs(s))
    show = "import os; print(os.environ.get('WANDB_API_KEY'), os.environ.get('HF_TOKEN'))"
    command = [sys.executable, "-m", "cpudist.launch.tether", "--from-secrets", "WANDB_API_KEY",
               "--", sys.executable, "-c", show]
    tether = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, secrets.SECRETS_ENV: where})
    assert tether.stdout is not None and tether.stdin is not None
    out = tether.stdout.read()  # stdin open until the command ended (its end stops the tether's)
    tether.stdin.close()
    assert tether.wait(timeout=60) == 0
    assert out.split() == ["wandb-2b7e51", "None"], out  # the named ones only
