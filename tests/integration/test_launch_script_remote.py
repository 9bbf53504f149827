"""`cpudist launch --hostfile H --head ADDR` from the laptop namespace (tests/harness/world.py's
on-prem site of test_remote_onprem.py: the laptop's files are hidden from the hosts, so everything
the ranks read was staged): one run of a plain DDP script on one rank per host checks the losses
(those of the same 2-rank DDP worked out in one process; test_launch_script.py checks them against
torchrun by hand on one machine), torchrun's variables, a --stage file outside the script's folder
named in the command, --metric-file, --collect coming home, the snapshot of the folder, the ledger
on the laptop and nothing left on the hosts; a second, sleeping script checks that Ctrl-C on the
laptop stops every rank on every host."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cpudist.launch.tools import free_port
from tests.harness.netns import missing_requirements
from tests.harness.world import OPERATOR_HOME, World
from tests.integration.helpers import LAUNCHED, cmdline, kill_tree, read_until, wait_no_leftovers
from tests.integration.test_launch_script import DDP_SCRIPT, losses
from tests.integration.test_launch_script_hosts import one_process_losses
from tests.integration.test_remote_onprem import site
from tests.integration.user_scripts import ACCELERATE_SCRIPT, LEAVE, LOGGED, STEP, TRAINER_SCRIPT

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(missing_requirements() is not None,
                                 reason=str(missing_requirements()))]
__all__ = ["site"]  # the module's fixture: two on-prem hosts and the laptop (its own World here)
CPUDIST = [sys.executable, "-m", "cpudist.cli"]
# The DDP script, a line that reads the file named on its command line (staged with --stage), and
# one that shows the digest of a --secret (its value reaches the hosts' ranks by the secrets file
# only: ssh passes no environment).
SCRIPT = DDP_SCRIPT + '''
if rank == 0 and len(sys.argv) > 1:
    print("staged " + open(sys.argv[1]).read().strip(), flush=True)
import hashlib
print("secret " + hashlib.sha256(os.environ.get("CPD_TOKEN", "").encode()).hexdigest(), flush=True)
''' + LEAVE
TOKEN = "cpd-tok-7e3a11b5"
# The HF Trainer and the Accelerate script of the local tests, and the metric file each hands back.
USER_SCRIPTS = {"trainer": (TRAINER_SCRIPT + LEAVE, "hf-out/all_results.json"),
                "accelerate": (ACCELERATE_SCRIPT + LEAVE, "metrics.json")}
SLEEPER = '''
import os, time
print("up " + os.environ["RANK"], flush=True)
time.sleep(600)
'''


def laptop_argv(w: World, folder: str, *args: str) -> list[str]:
    """`cpudist launch` on the laptop in its folder `folder` (the script's: no --workdir), one rank
    per host."""
    return ["env", "-C", f"{OPERATOR_HOME}/{folder}", *CPUDIST, "launch", "--np", "2", "--ppn", "1",
            "--hostfile", f"{OPERATOR_HOME}/hosts", "--head", w.hosts.public_addr(0), "--user",
            "root", "--identity", f"{OPERATOR_HOME}/.ssh/id_ed25519", "--remote-python",
            sys.executable, *args]


def left_on_hosts(w: World, script: str) -> list[str]:
    return [f"{w.hosts.name(i)}: {cmdline(pid)[:80]}" for i in range(w.hosts.n)
            for pid in w.hosts.pids(i)
            if script in cmdline(pid)]


def test_a_script_from_the_laptop_staged_run_on_every_host_and_brought_home(site: World) -> None:
    job = site.operator_path("job")
    job.mkdir()
    (job / "ddp.py").write_text(SCRIPT)
    site.operator_path("label.txt").write_text("from-the-laptop\n")  # outside the script's folder
    label = f"{OPERATOR_HOME}/label.txt"
    r = site.operator_run(laptop_argv(site, "job", "--output-dir", "runs/remote", "--stage", label,
                                      "--metric-file", "metrics.json", "--collect", "outputs",
                                      "--secret", "CPD_TOKEN",
                                      "--", "ddp.py", label), env={"CPD_TOKEN": TOKEN}, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    assert r.stderr.count(f"secret {digest}") == 2, r.stderr[-4000:]
    assert [float(loss) for _, loss in losses(r.stderr)] == pytest.approx(
        one_process_losses(), abs=1e-6), r.stderr
    seen = {v["RANK"]: v
            for v in (json.loads(line.split("vars ", 1)[1]) for line in r.stderr.splitlines()
                      if "vars {" in line)}
    assert {k: (v["GROUP_RANK"], v["WORLD_SIZE"], v["LOCAL_WORLD_SIZE"], v["sum"]) for k,
            v in seen.items()} \
        == {"0": ("0", "2", "1", 3.0), "1": ("1", "2", "1", 3.0)}, r.stderr
    # the --stage file, at the path the command now names
    assert "staged from-the-laptop" in r.stderr
    out = job / "runs" / "remote"
    assert (out / "collected" / "outputs" / "model.txt").read_text() == "weights"
    # the folder as staged: the script, not the runs folder the run folder is in
    assert sorted(p.name for p in (out / "script").iterdir()) == ["ddp.py"]
    result = json.loads((out / "result.json").read_text())
    assert sorted(result["nodes"]) == sorted([site.hosts.name(0), site.hosts.name(1)])
    assert result["staging"]["script_sent_bytes"] > 0 and result["staging"]["script_copies"] == 2
    staged = result["staging"]["script_folder"]
    # outputs went to the run's own working folder on the head, never into the content-addressed
    # staged copy
    listed = site.hosts.run(0, ["ls", "-A", staged]).stdout.split()
    assert "ddp.py" in listed and not {"outputs", "metrics.json"} & set(listed), listed
    ledger = [json.loads(line)
              for line in site.operator_path(".cpudist/results.jsonl").read_text().splitlines()]
    assert (ledger[-1]["task"], ledger[-1]["world_size"], ledger[-1]["train_samples"],
            ledger[-1]["metrics"]) \
        == ("script", 2, 64, {"sum": 3.0})
    assert ledger[-1]["run_dir"] == str(OPERATOR_HOME / "job/runs/remote") and ledger[-1]["run_id"]
    run = json.loads((out / "run.json").read_text())
    assert run["state"] == "finished" and run["where"] == f"head:{site.hosts.public_addr(0)}"
    assert losses((out / "ranks.log").read_text()) == losses(r.stderr)
    shown = [r.stdout, r.stderr,
             *(p.read_text(errors="replace") for p in out.iterdir() if p.is_file())]
    assert ("CPUDIST_SECRETS" in (out / "command.txt").read_text()
            and not [s for s in shown if TOKEN in s])
    assert wait_no_leftovers(site.hosts, names=LAUNCHED) == []


def rank0(output: str) -> str:
    """Rank 0's lines of a run's output (`[host:0] ...`)."""
    return "\n".join(line for line in output.splitlines() if line.startswith("[") and
                     line.split("] ", 1)[0].endswith(":0"))


def test_a_trainer_and_an_accelerate_script_from_the_laptop_log_torchruns_losses(
    site: World, tmp_path: Path) -> None:
    """The HF Trainer and the Accelerate script of the local tests, each from the laptop on one rank
    per host, log the losses of the same script started by hand with torchrun on 2 processes of this
    machine (same world size, same rows: the same losses wherever the ranks run); their metric files
    reach the run's record."""
    pytest.importorskip("accelerate")  # the test extra installs it
    by_hand = {}
    for name, (text, _) in USER_SCRIPTS.items():  # the references run meanwhile
        (tmp_path / name).mkdir()
        (tmp_path / name / "train.py").write_text(text)
        by_hand[name] = subprocess.Popen([sys.executable, "-m", "torch.distributed.run",
                                          "--nproc-per-node", "2",
                                          "--master-port", str(free_port()), "train.py"],
                                         cwd=tmp_path / name,
                                         text=True, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT)
    ours = {}
    for name, (text, metric_file) in USER_SCRIPTS.items():
        site.operator_path(name).mkdir()
        site.operator_path(f"{name}/train.py").write_text(text)
        ours[name] = site.operator_run(laptop_argv(site, name, "--output-dir", "runs/r",
                                                   "--metric-file",
                                                   metric_file, "--", "train.py"), timeout=300)
    hand = {name: p.communicate(timeout=300)[0] for name, p in by_hand.items()}
    assert [p.returncode for p in by_hand.values()] == [0, 0], hand
    trainer, accelerate = ours["trainer"], ours["accelerate"]
    assert trainer.returncode == 0, trainer.stderr[-4000:]
    assert ("world 2 process 0" in trainer.stderr
            and "world 2 process 1" in trainer.stderr), trainer.stderr[-4000:]
    # both print on each node's first process: here on both ranks, by hand (one node) on rank 0 only
    logged = LOGGED.findall(rank0(trainer.stderr))
    assert len(logged) == 4 and logged == LOGGED.findall(hand["trainer"]), (
        trainer.stderr, hand["trainer"])
    theirs = json.loads((tmp_path / "trainer" / "hf-out" / "all_results.json").read_text())
    mine = json.loads(site.operator_path("trainer/runs/r/result.json").read_text())
    assert (mine["world_size"], mine["final_loss"]) == (2, theirs["train_loss"])
    assert accelerate.returncode == 0, accelerate.stderr[-4000:]
    assert all(f"state DistributedType.MULTI_CPU 2 {i}" in accelerate.stderr
               for i in (0, 1)), accelerate.stderr
    steps = STEP.findall(rank0(accelerate.stderr))
    assert len(steps) == 4 and steps == STEP.findall(hand["accelerate"]), (
        accelerate.stderr, hand["accelerate"])
    mine = json.loads(site.operator_path("accelerate/runs/r/result.json").read_text())
    assert (mine["world_size"], mine["train_samples"]) == (2, 64)
    assert wait_no_leftovers(site.hosts, names=LAUNCHED) == []


def test_ctrl_c_on_the_laptop_stops_every_rank_on_every_host(site: World) -> None:
    folder = site.operator_path("sleeper")
    folder.mkdir()
    (folder / "sleeper.py").write_text(SLEEPER)
    proc = site.operator_popen(laptop_argv(site, "sleeper", "--output-dir", "runs/stopped", "--",
                                           "sleeper.py"),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        seen = read_until(proc, "up 1", timeout=240)
        # a wrapper and a script each
        assert len(left_on_hosts(site, "sleeper.py")) >= 2, "".join(seen)[-3000:]
        running = {h for i in range(2) for h in [site.hosts.name(i)]
                   if any("sleeper.py" in cmdline(p) for p in site.hosts.pids(i))}
        assert running == {site.hosts.name(0), site.hosts.name(1)}
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        kill_tree(proc)
    assert proc.returncode == 130, rest[-3000:]
    assert "interrupted: all ranks were stopped on every node" in rest, rest[-3000:]
    assert wait_no_leftovers(site.hosts, names=LAUNCHED) == []
    assert left_on_hosts(site, "sleeper.py") == []
    assert (json.loads((folder / "runs" / "stopped" / "run.json").read_text())["state"]
            == "interrupted")


COUNTER = '''
import json, os
world = int(os.environ["WORLD_SIZE"])
if os.environ["RANK"] == "0":
    # as HF Trainer's all_results.json of a fixed --max_steps: more ranks, more epochs (the
    # report's group keeps them)
    json.dump({"train_samples": 1000 * world, "epoch": world / 2}, open("metrics.json", "w"))
    open("out.txt", "w").write(f"world {world}")
'''


def test_a_sweep_over_1_and_2_hosts_gives_the_speedup_table_and_each_runs_outputs(
    site: World) -> None:
    """--sweep from the laptop (1 and 2 hosts here to keep it short; 4 works the same way): one run
    folder per count with its outputs home, the report of exactly these runs on stdout (JSON:
    parsed), two ledger lines."""
    folder = site.operator_path("counter")
    folder.mkdir()
    (folder / "count.py").write_text(COUNTER)
    ledger = site.operator_path(".cpudist/results.jsonl")
    before = len(ledger.read_text().splitlines()) if ledger.exists() else 0
    argv = laptop_argv(site, "counter", "--output-dir", "runs/sweep", "--metric-file",
                       "metrics.json", "--collect", "out.txt", "--json", "--", "count.py")
    argv[argv.index("--np"):argv.index("--np") + 2] = ["--sweep", "1,2"]
    r = site.operator_run(argv, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    rows = json.loads(r.stdout)
    assert [(row["nodes"], row["ranks"], row["group"]) for row in rows] == \
        [(1, 1, "script count.py"), (2, 2, "script count.py")], r.stdout
    assert rows[0]["speedup"] == 1.0 and rows[1]["speedup"] > 0
    for n in (1, 2):
        assert (folder / f"runs/sweep/nodes{n}/collected/out.txt").read_text() == f"world {n}"
    staging = json.loads((folder / "runs/sweep/nodes2/result.json").read_text())["staging"]
    # on the head already: to n1 only
    assert staging["script_sent_bytes"] == 0 and staging["script_copies"] == 1
    entries = [json.loads(line) for line in ledger.read_text().splitlines()][before:]
    assert [(e["world_size"], len(e["nodes"]), e["train_samples"])
            for e in entries] == [(1, 1, 1000), (2, 2, 2000)]
    assert wait_no_leftovers(site.hosts, names=LAUNCHED) == []
