"""torchrun across hosts (the zero-MPI path), and threads sized by each rank from the CPUs its host
gives it.

Four network-namespace hosts with a real sshd each (tests/harness/netns.py), `cpudist hosts
ssh-setup` once; cpudist runs on host 0, the head. Host 1's sshd is pinned to one CPU (`taskset`),
host 2's sits in a cgroup holding it to half a core (cgroup v1 or v2, whichever has the cpu
controller: tests/harness/quota.py): everything they start inherits that, as ranks under a Slurm
cpuset or in a container do. Needs root (tests/harness/setup.sh installs the rest; CI runs as root).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.machine import physical_cores
from tests.harness.netns import NetnsCluster, missing_requirements
from tests.harness.power import kill_namespace
from tests.harness.quota import QuotaGroup, cpu_controller_version, quota_unavailable
from tests.integration.helpers import (
    CPUDIST,
    cmdline,
    keyed_hosts,
    kill_tree,
    leftovers,
    read_until,
    wait_no_leftovers,
)

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(missing_requirements() is not None,
                                 reason=str(missing_requirements()))]
NOTICE_NODE_LOSS_S = 60  # #23 asks for 30 s; twice that for a busy CI machine


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsCluster]:
    with keyed_hosts(4, tmp_path_factory.mktemp("torchrun"), "ctr") as c:
        yield c


@contextlib.contextmanager
def limited(c: NetnsCluster, pinned: int, held: int, quota: float) -> Iterator[None]:
    """Host `pinned` may use one CPU only; host `held` gets `quota` of a core (a cgroup CPU quota,
    v1 or v2)."""
    version = cpu_controller_version() or 1
    why = quota_unavailable(version)
    if why is not None:
        # not on CI's allowlist (tests/conftest.py): a CI machine has a cpu controller to use
        pytest.skip(why)
    sshd, held_sshd = c.sshd_pid(pinned), c.sshd_pid(held)
    before = os.sched_getaffinity(sshd)
    group = QuotaGroup(f"{c.prefix}-quota", quota, version).create()
    try:
        os.sched_setaffinity(sshd, {min(before)})
        group.join(held_sshd)
        # `ip netns exec` gave the hosts a /sys without cgroup mounts: mount the cpu controller's
        # hierarchy in host `held` as a machine has it, so its ranks can read their quota.
        subprocess.run(["nsenter", "--target", str(held_sshd), "--mount", "--", "sh", "-c",
                        group.mount_command()],
                       check=True)
        yield
    finally:
        os.sched_setaffinity(sshd, before)
        group.remove()


def run_argv(c: NetnsCluster, data: Path, out: Path, *extra: str,
             hosts: tuple[int, ...] = (0, 1, 2, 3)) -> list[str]:
    """`cpudist run` with torchrun on `hosts` (one rank each; 64 rows: what is checked is not the
    data)."""
    hostfile = c.state / ("hosts-" + "-".join(map(str, hosts)))
    hostfile.write_text("".join(f"{c.name(i)}\n" for i in hosts))
    return [*CPUDIST, "run", "mrpc", "--launcher", "torchrun", "--hostfile", str(hostfile), "--np",
            str(len(hosts)), "--ppn", "1", "--data-dir", str(data / "glue" / "MRPC"), "--model",
            "tiny", "--max-train-samples", "64", "--output-dir", str(out), *extra]


# Past the first test, two hosts: stopping the job when one host's torchrun dies or the host
# vanishes is the same with more. --max-steps, not --epochs: 64 rows make short epochs, and these
# runs must go on until stopped.
GO_ON = ("--max-steps", "100000", "--no-eval", "--log-every", "1")



def test_four_hosts_each_rank_sizing_its_threads(hosts: NetnsCluster, shared_data: Path,
                                                 tmp_path: Path) -> None:
    """4 distinct hosts in result.json; the rank under `taskset -c CPU` and the one held to half a
    core run one thread, the others one per physical core (the hosts' /sys has no cgroup mounts: no
    quota they could read); `hosts doctor` shows the difference per node."""
    cores = physical_cores()
    if cores < 2:
        pytest.skip("needs 2 physical cores to tell a limited host from a full one; this process "
                    f"may use {cores}")
    with limited(hosts, pinned=1, held=2, quota=0.5):
        r = hosts.run(0,
                      run_argv(hosts, shared_data, tmp_path / "run", "--max-steps", "3",
                               "--max-eval-samples", "32"),
                      timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr[-4000:]
        doctor = hosts.run(0,
                           [*CPUDIST, "hosts", "doctor", "--hostfile", str(hosts.hostfile),
                            "--json"])
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["launcher"] == "torchrun" and result["world_size"] == 4
    assert sorted(result["nodes"]) == [hosts.name(i) for i in range(4)]
    threads = dict(zip(result["rank_hosts"], result["rank_threads"], strict=True))
    assert threads == {hosts.name(0): cores, hosts.name(1): 1, hosts.name(2): 1,
                       hosts.name(3): cores}
    assert f"[{hosts.name(3)}] rank " in r.stderr  # every host's output, prefixed with its name
    command = (tmp_path / "run" / "command.txt").read_text()
    assert command.count(
        "--rdzv-backend c10d") == 4 and f"--rdzv-endpoint {hosts.name(0)}:" in command
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    usable = {n["host"]: (n["facts"]["usable_cores"], n["problems"])
              for n in json.loads(doctor.stdout)}
    assert usable[hosts.name(1)][0] == 1 and usable[hosts.name(2)][0] == 1
    assert usable[hosts.name(3)] == (cores, [])
    assert f"1 usable cores != head's {cores} (cgroup quota 0.5 CPUs)" in usable[hosts.name(2)][1]
    assert leftovers(hosts) == []


def test_killing_one_hosts_torchrun_ends_the_job_everywhere(hosts: NetnsCluster, shared_data: Path,
                                                            tmp_path: Path) -> None:
    """Also: an --env value is on no process's command line (the user's own `cpudist run` aside)
    while the run lasts, and command.txt names it only (each host's tether takes it from the run's
    secrets file)."""
    token = "hf-env-3f9d27c1b8"
    argv = run_argv(hosts, shared_data, tmp_path / "kill", *GO_ON, "--env", f"HF_TOKEN={token}",
                    hosts=(0, 2))
    proc = subprocess.Popen(hosts.exec_argv(0, argv), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        seen = read_until(proc, "step 2/")
        assert not shown_on_command_lines(hosts, (0, 2), token, proc.pid)
        agents = [pid for pid in hosts.pids(2)
                  if cmdline(pid).split()[1:3] == ["-m", "torch.distributed.run"]]
        assert len(agents) == 1, "".join(seen)[-3000:] + "\n".join(leftovers(hosts))
        os.kill(agents[0], signal.SIGKILL)
        killed = time.monotonic()
        out, _ = proc.communicate(timeout=60)
        took = time.monotonic() - killed
    finally:
        kill_tree(proc)
    assert proc.returncode == 1 and took < 60
    error = [line for line in out.splitlines() if line.startswith("Error: ")]
    assert len(error) == 1 and f"the job failed on {hosts.name(2)} (torchrun exit code 137, " \
                               "killed by SIGKILL)" in error[0], out[-3000:]
    command = (tmp_path / "kill" / "command.txt").read_text()
    assert command.count("--from-secrets HF_TOKEN") == 2, command  # a line per host
    assert token not in command, command
    assert wait_no_leftovers(hosts, within_s=10) == []


def shown_on_command_lines(c: NetnsCluster, on: tuple[int, ...], value: str, own: int) -> list[str]:
    """The lines of `ps -eo pid,args` in each host's namespace, the run's processes only, that hold
    `value`; the process `own` (the user's `cpudist` command, whose own --env argument holds it)
    left out."""
    found = []
    for i in on:
        ps = c.run(i, ["ps", "-ww", "-eo", "pid=,args="]).stdout  # -ww: whole lines
        mine = set(c.pids(i)) - {own}  # the hosts share one process table: this host's netns only
        found += [f"{c.name(i)}: {line}" for line in ps.splitlines()
                  if line.split(maxsplit=1)[:1] and int(line.split()[0]) in mine and value in line]
    return found


PRELOAD = "/lib/x86_64-linux-gnu/libuuid.so.1"  # a library no rank loads by itself
SHOW_ENV = f"""
import hashlib, os, pathlib, sys, time
rank = pathlib.Path(f"/proc/{{os.getppid()}}")  # the rank's Python (cpudist.run.script_rank)
began = (rank / "environ").read_bytes().split(b"\\0")  # its environment when it started
preloaded = b"script_rank" in (rank / "cmdline").read_bytes() \\
    and b"LD_PRELOAD={PRELOAD}" in began and "{PRELOAD}" in (rank / "maps").read_text()
token = hashlib.sha256(os.environ.get("HF_TOKEN", "").encode()).hexdigest()
print("token", token, "preloaded", preloaded, flush=True)
deadline = time.monotonic() + 120
while not pathlib.Path(sys.argv[1]).exists() and time.monotonic() < deadline:
    time.sleep(0.2)
"""


def test_env_values_reach_every_hosts_ranks_off_every_command_line(
        hosts: NetnsCluster, tmp_path: Path) -> None:
    """`cpudist launch --launcher torchrun --hostfile H --env HF_TOKEN=... --env LD_PRELOAD=...`:
    while the ranks run, `ps` on each host shows neither value (ssh's command line on the head held
    them); each rank has the token, and the library was preloaded into the rank's Python from its
    start."""
    if not Path(PRELOAD).exists():
        pytest.skip(f"{PRELOAD} is not installed")
    token, go = "hf-env-ps-8c41d0e7a2", tmp_path / "go"
    (tmp_path / "show_env.py").write_text(SHOW_ENV)
    tmp_path.chmod(0o755)
    hostfile = hosts.state / "hosts-0-1"
    hostfile.write_text(f"{hosts.name(0)}\n{hosts.name(1)}\n")
    argv = [*CPUDIST, "launch", "--launcher", "torchrun", "--hostfile", str(hostfile), "--np", "2",
            "--ppn", "1", "--env", f"HF_TOKEN={token}", "--env", f"LD_PRELOAD={PRELOAD}",
            "--output-dir", str(tmp_path / "run"), "--ledger", str(tmp_path / "ledger.jsonl"),
            "--workdir", str(tmp_path), "--", "python", "show_env.py", str(go)]
    proc = subprocess.Popen(hosts.exec_argv(0, argv), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        seen = read_until(proc, " preloaded ") + read_until(proc, " preloaded ")
        tethers = [line for i in (0, 1) for pid in hosts.pids(i)
                   if (line := cmdline(pid)).split()[1:3] == ["-m", "cpudist.launch.tether"]]
        leaked = shown_on_command_lines(hosts, (0, 1), token, proc.pid)
        go.touch()
        out, _ = proc.communicate(timeout=120)
    finally:
        kill_tree(proc)
    assert leaked == []
    assert len(tethers) == 2, tethers
    assert all("--from-secrets HF_TOKEN,LD_PRELOAD --" in line for line in tethers), tethers
    digest = hashlib.sha256(token.encode()).hexdigest()
    ranks = [line for line in seen if " preloaded " in line]
    assert len(ranks) == 2, "".join(seen)
    assert all(f"token {digest} preloaded True" in line for line in ranks), "".join(seen)
    assert proc.returncode == 0, "".join(seen) + out[-3000:]
    assert token not in (tmp_path / "run" / "command.txt").read_text()
    assert leftovers(hosts) == []


def test_a_host_that_vanishes_ends_the_job_naming_it(hosts: NetnsCluster, shared_data: Path,
                                                     tmp_path: Path) -> None:
    """#23: host 3 powered off mid-run (its link down first, so no FIN or RST reaches anyone, then
    everything on it killed): the head's node watch (cpudist/launch/watch.py) stops the job in
    bounded time with one line naming it. Last in the module: host 3 stays off."""
    argv = run_argv(hosts, shared_data, tmp_path / "vanish", *GO_ON, hosts=(0, 3))
    proc = subprocess.Popen(hosts.exec_argv(0, argv), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        read_until(proc, "step 2/")
        subprocess.run(["ip", "-n", hosts.name(3), "link", "set", "eth0", "down"], check=True)
        gone = time.monotonic()
        kill_namespace(hosts.name(3))
        out, _ = proc.communicate(timeout=NOTICE_NODE_LOSS_S)
        took = time.monotonic() - gone
    finally:
        kill_tree(proc)
    error = [line for line in out.splitlines() if line.startswith("Error: ")]
    assert proc.returncode == 1 and took < NOTICE_NODE_LOSS_S, (took, out[-3000:])
    assert len(error) == 1 and f"node {hosts.name(3)} stopped answering" in error[0], out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    print(f"{error[0]}\n(the job ended {took:.1f}s after host 3 went silent)")
    assert wait_no_leftovers(hosts, skip=(3,)) == []
