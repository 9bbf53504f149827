"""A real Slurm cluster on the namespace hosts of tests/harness/netns.py (Debian's slurm-wlm 22.05,
munge).

    # namespace hosts, munged, slurmctld, a slurmd on each
    python -m tests.harness.slurm up --hosts 2
    # on host 0, the login node (SLURM_CONF set, folder kept)
    python -m tests.harness.slurm exec 0 -- sinfo
    python -m tests.harness.slurm exec 0 -- cpudist run mrpc --launcher slurm --nodes 2 --ppn 1 ...
    # (--hosts, --state, --prefix as given to up)
    python -m tests.harness.slurm down
    # daemons a killed test left there
    python -m tests.harness.slurm reap --state $CPUDIST_SLURM_ROOT

One munged in this (root) namespace: its socket is a file path, and the namespace hosts share the
file system, so every daemon and command authenticates through it with one key. slurmctld runs on
host 0 (the login node, as on HPC systems, and a compute node too); each host runs its own slurmd
under its own hostname, which is what Debian's build needs (it has no --enable-multiple-slurmd).
Slurm commands work inside the hosts only: slurmctld listens on host 0's namespace address.

Two things this machine forces, both stated where they are set: the hosts' /sys is the one `ip netns
exec` mounted, without /sys/fs/cgroup, so cgroup.conf names cgroup/v1 explicitly (slurmd 22.05
initialises a cgroup plugin even when no cgroup plugin is used, and autodetection fails there); and
munged refuses a socket under a folder that is not world-executable (pytest's temporary folders are
0700), so the state of this harness lives in a folder of its own under /tmp.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness.netns import NetnsCluster

DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo", "salloc")
KILL_WAIT_S = 5  # Slurm's KillWait: SIGTERM to SIGKILL of a cancelled or timed-out job's processes


def missing_requirements() -> str | None:
    """Why this machine cannot run the Slurm cluster, or None when it can."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, daemons running as root)"
    for daemon in DAEMONS:
        if not Path(daemon).exists():
            return (f"{daemon} not installed "
                    "(apt-get install slurm-wlm munge; tests/harness/setup.sh does it)")
    for client in CLIENTS:
        if shutil.which(client) is None:
            return (f"{client} not installed "
                    "(apt-get install slurm-client; tests/harness/setup.sh does it)")
    return None


def state_root() -> str | None:
    """Where clusters keep their state: $CPUDIST_SLURM_ROOT (.ci/run sets it, to stop at its end
    whatever a killed test left running), else the system's temporary folder."""
    return os.environ.get("CPUDIST_SLURM_ROOT") or None


def reap(root: Path) -> list[str]:
    """Stop every daemon whose pid file lies under `root` and whose command line names it; what was
    stopped."""
    stopped = []
    for pid_file in sorted(root.glob("**/*.pid")):
        if _stop_pid(pid_file, str(root)):
            stopped.append(str(pid_file))
    return stopped


def node_hardware(slurmd_c: str) -> str:
    """The hardware part of `slurmd -C`'s NodeName line (CPUs=... RealMemory=...), to repeat in
    slurm.conf."""
    line = next(ln for ln in slurmd_c.splitlines() if ln.startswith("NodeName="))
    keys = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "RealMemory")
    found = dict(re.findall(r"(\w+)=(\S+)", line))
    return " ".join(f"{k}={found[k]}" for k in keys if k in found)


GRACE_S = 30  # PreemptMode=CANCEL's GraceTime: from the steps' SIGTERM to the job's end
PREEMPTION = f""" PriorityTier=1 PreemptMode=CANCEL GraceTime={GRACE_S}
PartitionName=urgent Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
PreemptType=preempt/partition_prio
PreemptMode=CANCEL"""


@dataclass
class SlurmCluster:
    """slurmctld on host 0 and a slurmd on every host of `hosts`; daemons are stopped by PID on
    down()."""

    hosts: NetnsCluster
    state: Path = field(
        default_factory=lambda: Path(tempfile.mkdtemp(prefix="cpudist-slurm-", dir=state_root())))
    # Preemption as sites set it up (preempt/partition_prio, PreemptMode=CANCEL): a job of the
    # `urgent` partition takes the nodes of `batch` jobs, whose steps get SIGTERM at once and the
    # whole job SIGKILL GRACE_S later.
    preemption: bool = False

    @property
    def conf(self) -> Path:
        return self.state / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.state / "munge" / "munge.sock"

    def env(self) -> dict[str, str]:
        """What Slurm's commands need to find this cluster (add it to a command's environment)."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def render_conf(self, hardware: str) -> str:
        """slurm.conf: every namespace host by its hostname and address, minimal plugins, fast
        timeouts."""
        s = self.state
        nodes = "\n".join(f"NodeName={self.hosts.name(i)} NodeAddr={self.hosts.addr(i)} {hardware} "
                          "State=UNKNOWN"
                          for i in range(self.hosts.n))
        return f"""# Written by tests/harness/slurm.py
ClusterName={self.hosts.prefix.replace("-", "")}
SlurmctldHost={self.hosts.name(0)}({self.hosts.addr(0)})
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
StateSaveLocation={s}/ctld
SlurmctldPidFile={s}/ctld/slurmctld.pid
SlurmctldLogFile={s}/ctld/slurmctld.log
# %n: each slurmd has its own spool (where batch scripts are written and executed), pid and \
log file.
SlurmdSpoolDir={s}/%n
SlurmdPidFile={s}/%n/slurmd.pid
SlurmdLogFile={s}/%n/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SchedulerType=sched/backfill
ReturnToService=2
# A job past its --time ends at once (no grace), its processes get KillWait seconds after SIGTERM,
# and slurmctld keeps ended jobs long enough for `scontrol show job` to tell their final state.
OverTimeLimit=0
KillWait={KILL_WAIT_S}
MinJobAge=600
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
{nodes}
PartitionName=batch Nodes=ALL Default=YES MaxTime=INFINITE \
State=UP{PREEMPTION if self.preemption else ""}
"""

    def up(self) -> SlurmCluster:
        """munged, slurmctld and the slurmds, then wait until every node is idle; a failed start
        cleans up."""
        self.state.chmod(0o755)  # munged wants every folder above its socket world-executable
        try:
            self._start_munged()
            hardware = node_hardware(self._host(0, ["slurmd", "-C"]).stdout)
            self.conf.write_text(self.render_conf(hardware))
            # slurmd 22.05 always initialises a cgroup plugin; the hosts' /sys has no cgroup mounts.
            (self.state / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nIgnoreSystemd=yes\n")
            (self.state / "ctld").mkdir(exist_ok=True)
            self._daemon(0, ["slurmctld", "-f", str(self.conf)], "slurmctld")
            for i in range(self.hosts.n):
                (self.state / self.hosts.name(i)).mkdir(exist_ok=True)
                self._daemon(i, ["slurmd", "-f", str(self.conf)], "slurmd")
            self.wait_idle()
        except BaseException:
            self.down()
            raise
        return self

    def _start_munged(self) -> None:
        d = self.state / "munge"
        d.mkdir(mode=0o755, exist_ok=True)
        d.chmod(0o755)
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        subprocess.run(["/usr/sbin/munged", f"--key-file={key}", f"--socket={self.munge_socket}",
                        f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log",
                        f"--seed-file={d}/munged.seed"],
                       check=True, capture_output=True, text=True)

    def _host(self, i: int, argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.hosts.exec_argv(i, argv), capture_output=True, text=True,
                              env=self.env(), timeout=60, **kw)  # type: ignore[call-overload]

    def _daemon(self, i: int, argv: list[str], what: str) -> None:
        p = self._host(i, argv)
        if p.returncode != 0:
            log = self.log_path(None if what == "slurmctld" else i)
            tail = log.read_text()[-2000:] if log.exists() else p.stderr
            raise RuntimeError(f"{what} on {self.hosts.name(i)} did not start (exit "
                               f"{p.returncode}): {tail}")

    def wait_idle(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            out = self.run(0, ["sinfo", "-h", "-N", "-o", "%N %T"]).stdout
            states = dict(line.split() for line in out.splitlines() if line.strip())
            if len(states) == self.hosts.n and all(s == "idle" for s in states.values()):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"Slurm nodes not idle after {timeout_s:g}s: {states}")
            time.sleep(0.5)

    # --- use -------------------------------------------------------------------------------

    def exec_argv(self, i: int, argv: list[str], cwd: str | None = None) -> list[str]:
        """argv running `argv` on host i in folder `cwd` (nsenter alone would start in /)."""
        return ["nsenter", "--target", str(self.hosts.sshd_pid(i)), "--net", "--uts", "--mount",
                f"--wd={cwd or os.getcwd()}", "--", *argv]

    def run(self, i: int, argv: list[str], timeout: float = 600, cwd: str | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run a command on host i to the end (SLURM_CONF set)."""
        return subprocess.run(self.exec_argv(i, argv, cwd), capture_output=True, text=True,
                              timeout=timeout,
                              env={**self.env(), **(env or {})}, stdin=subprocess.DEVNULL)

    def popen(self, i: int, argv: list[str], cwd: str | None = None,
              env: dict[str, str] | None = None,
              **kw: object) -> subprocess.Popen[str]:
        return subprocess.Popen(self.exec_argv(i, argv, cwd), env={**self.env(), **(env or {})},
                                text=True, **kw)  # type: ignore[call-overload]

    def log_path(self, i: int | None) -> Path:
        """slurmctld's log (None) or host i's slurmd's, where render_conf puts them."""
        return (self.state / "ctld" / "slurmctld.log" if i is None
                else self.state / self.hosts.name(i) / "slurmd.log")

    def logs(self, chars: int = 2000) -> str:
        """The tail of slurmctld's log and of each slurmd's: a failed wait's detail."""
        paths = [self.log_path(None), *(self.log_path(i) for i in range(self.hosts.n))]
        return "\n".join(f"--- {path.name} ({path.parent.name}):\n{path.read_text()[-chars:]}"
                         for path in paths if path.exists())

    def jobs(self) -> list[str]:
        """The jobs squeue still shows (pending, running or completing)."""
        return [ln for ln in self.run(0, ["squeue", "-h", "-o", "%i %T"]).stdout.splitlines()
                if ln.strip()]

    # --- teardown ----------------------------------------------------------------------------

    def down(self) -> None:
        """Cancel every job, stop the daemons this harness started (by PID) and what their jobs
        left."""
        if self.conf.exists():
            try:
                self.run(0, ["scancel", "--user=root"], timeout=30)
                deadline = time.monotonic() + KILL_WAIT_S + 10
                while self.jobs() and time.monotonic() < deadline:
                    time.sleep(0.5)
            except (subprocess.SubprocessError, OSError, FileNotFoundError):
                pass
        pid_files = [self.state / self.hosts.name(i) / "slurmd.pid" for i in range(self.hosts.n)]
        for pid_file in [*pid_files, self.state / "ctld" / "slurmctld.pid",
                         self.state / "munge" / "munged.pid"]:
            _stop_pid(pid_file, str(self.state))
        # job steps outlive a stopped slurmd: slurmstepd and its ranks
        for i in range(self.hosts.n):
            sshd = self.hosts.sshd_pid(i) if (self.hosts.node_dir(i) / "sshd.pid").exists() else -1
            for pid in self.hosts.pids(i):
                if pid != sshd and _is_job_process(pid):
                    _kill(pid)
        shutil.rmtree(self.state, ignore_errors=True)


@contextlib.contextmanager
def on_namespace_hosts(n: int, folder: Path, prefix: str,
                       preemption: bool = False) -> Iterator[SlurmCluster]:
    """`n` namespace hosts (names from `prefix` and this PID, so parallel workers never share one)
    and Slurm on them; both taken down, by PID, whatever the body raised: a test module's `slurm`
    fixture."""
    hosts = NetnsCluster(n, folder, prefix=f"{prefix}{os.getpid() % 10000}")
    hosts.up()
    try:
        cluster = SlurmCluster(hosts, preemption=preemption).up()
        try:
            yield cluster
        finally:
            cluster.down()
    finally:
        hosts.down()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _is_job_process(pid: int) -> bool:
    return any(w in _cmdline(pid) for w in ("slurmstepd", "cpudist", "torch.distributed", "sleep"))


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _stop_pid(pid_file: Path, marker: str) -> bool:
    """Stop the daemon of a pid file if its command line names our state folder (so it is ours)."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return False
    if marker not in _cmdline(pid):
        return False
    os.kill(pid, signal.SIGTERM)
    for _ in range(100):
        if not Path(f"/proc/{pid}").exists() or _state(pid) == "Z":
            return True
        time.sleep(0.05)
    _kill(pid)
    return True


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def main() -> None:
    argv = sys.argv[1:]
    command = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["up", "down", "exec", "reap"])
    ap.add_argument("host", nargs="?", type=int, default=0, help="exec: the host to run on")
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--state", type=Path, default=Path("/tmp/cpudist-slurm"))
    ap.add_argument("--prefix", default="slm")
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    hosts = NetnsCluster(a.hosts, a.state / "hosts", prefix=a.prefix)
    cluster = SlurmCluster(hosts, a.state / "slurm")
    if a.action == "up":
        cluster.state.mkdir(parents=True, exist_ok=True)
        hosts.up()
        try:
            cluster.up()
        except BaseException:
            hosts.down()
            raise
        print(json.dumps({"SLURM_CONF": str(cluster.conf), "hostfile": str(hosts.hostfile)}))
    elif a.action == "down":
        cluster.down()
        hosts.down()
    elif a.action == "reap":
        for what in reap(a.state):
            print(f"stopped the daemon of {what}")
    else:
        os.execvpe("nsenter", cluster.exec_argv(a.host, command), cluster.env())


if __name__ == "__main__":
    sys.exit(main())
