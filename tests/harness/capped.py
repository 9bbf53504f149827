"""A miniature cluster: namespace hosts (netns.py) whose CPU is capped by cgroups and whose links
are shaped.

    python -m tests.harness.capped up --hosts 4 --cores-per-host 0.5 --link-gbps 0.68
    python -m tests.harness.capped exec 0 -- python -c "import os; print(os.sched_getaffinity(0))"
    python -m tests.harness.capped status --hosts 4
    python -m tests.harness.capped down --hosts 4

Host i runs in a cgroup of its own, `cpudist-<prefix>-n<i>`: cgroup v1 `cpu` (cfs quota/period) and
`cpuset` (its core, memory node 0) where the machine mounts them, else cgroup v2 `cpu.max` and
`cpuset.cpus`. Its sshd joins the group the moment it starts, so everything it spawns (launcher
agents, ranks, gloo's threads) is capped too; commands run with `exec_argv`/`run` join it before
they enter the host. Layouts: `cores_per_host=1` puts host i alone on core i; `0.5` puts two hosts
on each core (hosts 0,1 on core 0; 2,3 on core 1) with a quota of half a core each, so they never
compete: each gets its half whether the other is busy or idle. Links: `tc tbf` on both ends of every
host's link (its eth0 and its bridge port), a full-duplex NIC of the given rate. Teardown stops only
this cluster's sshds and deletes only its own groups, once they are empty.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.harness.netns import NetnsCluster, missing_requirements

CGROUP_ROOT = Path("/sys/fs/cgroup")
# short periods: a throttled host waits at most ~5 ms, like a slower core, not a paused one
PERIOD_US = 10_000
# Ten times a default task's CPU weight: background work of the machine (outside the cluster) cannot
# take a host's quota, as it could not take a dedicated node's cores; the quota still caps the host.
WEIGHT_V1, WEIGHT_V2 = 10240, 1000
TBF_LATENCY_MS = 20  # queue of 20 ms at the rate: deep enough that TCP keeps the link busy
TBF_MIN_BURST = 64 * 1024  # at least one GSO packet (veth hands tbf up to 64 KiB at once)
TBF_BURST_S = 0.002  # 2 ms worth of bytes at the rate: hrtimer-paced tbf needs little more


@dataclass(frozen=True)
class HostCap:
    """What host i may use: cores (a cpuset list) and a CFS quota per period."""

    cpus: str
    quota_us: int
    period_us: int = PERIOD_US

    @property
    def cores(self) -> float:
        return self.quota_us / self.period_us


def layout(cores_per_host: float, cores: Sequence[int],
           period_us: int = PERIOD_US) -> list[HostCap]:
    """One HostCap per host that fits on `cores` without two hosts sharing more than one core's
    time."""
    if cores_per_host >= 1:
        whole = int(cores_per_host)
        if whole != cores_per_host:
            raise ValueError(f"cores per host {cores_per_host}: give a whole number of cores, or "
                             "1/k of one")
        return [HostCap(",".join(map(str, cores[i * whole:(i + 1) * whole])), whole * period_us,
                        period_us)
                for i in range(len(cores) // whole)]
    share = round(1 / cores_per_host)
    if not math.isclose(share * cores_per_host, 1):
        raise ValueError(f"cores per host {cores_per_host}: a fraction must divide a core evenly "
                         "(0.5, 0.25, ...)")
    quota = round(period_us * cores_per_host)
    return [HostCap(str(core), quota, period_us) for core in cores for _ in range(share)]


def cgroup_version(root: Path = CGROUP_ROOT) -> int | None:
    """1 where v1 mounts `cpu` and `cpuset`, 2 where the unified hierarchy has both, else None."""
    if (root / "cpu" / "cpu.cfs_quota_us").exists() and (root / "cpuset" / "cpuset.cpus").exists():
        return 1
    controllers = root / "cgroup.controllers"
    if controllers.exists() and {"cpu", "cpuset"} <= set(controllers.read_text().split()):
        return 2
    return None


def group_dirs(version: int, group: str, root: Path = CGROUP_ROOT) -> list[Path]:
    """The folders of one group: one per v1 controller, or the single v2 folder."""
    return [root / "cpuset" / group, root / "cpu" / group] if version == 1 else [root / group]


def group_settings(version: int, group: str, cap: HostCap,
                   root: Path = CGROUP_ROOT) -> list[tuple[Path, str]]:
    """(file, value) writes that cap a group, in an order the kernel accepts (cpuset before any task
    joins)."""
    if version == 1:
        cpuset, cpu = group_dirs(1, group, root)
        return [(cpuset / "cpuset.cpus", cap.cpus), (cpuset / "cpuset.mems", "0"),
                (cpu / "cpu.cfs_period_us", str(cap.period_us)),
                (cpu / "cpu.cfs_quota_us", str(cap.quota_us)), (cpu / "cpu.shares", str(WEIGHT_V1))]
    (folder,) = group_dirs(2, group, root)
    return [(root / "cgroup.subtree_control", "+cpu +cpuset"), (folder / "cpuset.cpus", cap.cpus),
            (folder / "cpuset.mems", "0"), (folder / "cpu.max", f"{cap.quota_us} {cap.period_us}"),
            (folder / "cpu.weight", str(WEIGHT_V2))]


def tbf_spec(gbps: float) -> str:
    """A tbf that really delivers `gbps` to bulk TCP (verified by
    tests/integration/test_capped.py)."""
    rate = gbps * 1e9
    burst = max(TBF_MIN_BURST, int(rate / 8 * TBF_BURST_S))
    return f"tbf rate {round(rate / 1e3)}kbit burst {burst} latency {TBF_LATENCY_MS}ms"


def capped_requirements(root: Path = CGROUP_ROOT) -> str | None:
    """Why this machine cannot host a capped cluster, or None when it can."""
    missing = missing_requirements()
    if missing:
        return missing
    version = cgroup_version(root)
    if version is None:
        return ("no cgroup cpu+cpuset controllers (v1 under /sys/fs/cgroup/{cpu,cpuset}, or v2 "
                "with both in cgroup.controllers)")
    if version == 2:
        try:  # child groups get the controllers only where the parent passes them on (idempotent)
            (root / "cgroup.subtree_control").write_text("+cpu +cpuset")
        except OSError as e:
            return (f"cgroup v2 at {root} will not pass cpu+cpuset to child groups ({e}): it holds "
                    "processes of its own (a container's cgroup); run where /sys/fs/cgroup is the "
                    "machine's root cgroup")
    return None


@dataclass(frozen=True)
class CappedCluster(NetnsCluster):
    """NetnsCluster whose hosts are capped to `cores_per_host` (their own cores) and linked at
    `link_gbps`."""

    cores_per_host: float = 1.0
    link_gbps: float | None = None  # None: links unshaped
    cores: tuple[int, ...] = ()  # cores to lay hosts on [default: those this process may use]
    cgroup_root: Path = CGROUP_ROOT

    @property
    def version(self) -> int:
        v = cgroup_version(self.cgroup_root)
        if v is None:
            raise RuntimeError(str(capped_requirements()))
        return v

    @property
    def caps(self) -> list[HostCap]:
        slots = layout(self.cores_per_host, self.cores or sorted(os.sched_getaffinity(0)))
        if self.n > len(slots):
            raise ValueError(f"{self.n} hosts of {self.cores_per_host} core(s) need "
                             f"{self.n * self.cores_per_host:g} "
                             f"cores; {len(slots)} fit here without hosts competing for cores")
        return slots[: self.n]

    def group(self, i: int) -> str:
        return f"cpudist-{self.prefix}-n{i}"

    def group_dirs(self, i: int) -> list[Path]:
        return group_dirs(self.version, self.group(i), self.cgroup_root)

    @property
    def link_spec(self) -> str | None:
        return None if self.link_gbps is None else tbf_spec(self.link_gbps)

    def up(self) -> CappedCluster:
        """Groups first (so a bad layout fails before anything else exists), then hosts, then
        shaping."""
        caps = self.caps
        try:
            for i, cap in enumerate(caps):
                for folder in self.group_dirs(i):
                    folder.mkdir(exist_ok=True)
                for path, value in group_settings(self.version, self.group(i), cap,
                                                  self.cgroup_root):
                    path.write_text(value)
            super().up()
            if self.link_spec:
                self.shape(self.link_spec)
        except BaseException:
            self.down()
            raise
        return self

    def _launch_sshd(self, i: int, new_key: bool) -> None:
        super()._launch_sshd(i, new_key)
        # before any login: every session it forks inherits the group
        self.join(i, self.sshd_pid(i))

    def join(self, i: int, pid: int) -> None:
        """Move one process (not yet running anything else) into host i's group."""
        for folder in self.group_dirs(i):
            (folder / "cgroup.procs").write_text(str(pid))

    def exec_argv(self, i: int, argv: list[str]) -> list[str]:
        """Host i's argv (netns.py) behind a shell that first joins host i's group, then execs
        it."""
        joins = " && ".join(f"echo $$ > '{folder}/cgroup.procs'" for folder in self.group_dirs(i))
        return ["sh", "-c", f'{joins} && exec "$@"', "capped", *super().exec_argv(i, argv)]

    def group_pids(self, i: int) -> list[int]:
        """Processes in host i's group (all of its controllers)."""
        pids: set[int] = set()
        for folder in self.group_dirs(i):
            if (folder / "cgroup.procs").exists():
                pids |= {int(p) for p in (folder / "cgroup.procs").read_text().split()}
        return sorted(pids)

    def stop_processes(self, grace_s: float = 10.0) -> None:
        """Stop every process in this cluster's groups (SIGTERM, then SIGKILL after `grace_s`): all
        were started on its hosts (by its sshds or its exec_argv). For a run cut short: killing a
        `cpudist run` leaves its launcher and ranks behind, which down() would then refuse to tear
        down."""
        import signal

        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in {p for i in range(self.n) for p in self.group_pids(i)}:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + grace_s
            while any(self.group_pids(i) for i in range(self.n)) and time.monotonic() < deadline:
                time.sleep(0.1)

    def down(self) -> None:
        """Stop our sshds and namespaces (netns.py), then delete our groups once their processes are
        gone."""
        super().down()
        left: dict[str, list[int]] = {}
        for i in range(self.n):
            deadline = time.monotonic() + 10
            while self.group_pids(i) and time.monotonic() < deadline:
                time.sleep(0.1)  # sessions of a stopped sshd end on their own
            if self.group_pids(i):
                left[self.group(i)] = self.group_pids(i)
                continue
            for folder in self.group_dirs(i):
                if folder.exists():
                    folder.rmdir()
        if left:
            raise RuntimeError(f"cgroups still hold processes, left in place: {left}")

    def describe(self) -> dict[str, object]:
        """The facts a result must carry: layout, quota, cpuset, link rate and tbf parameters."""
        return {"hosts": self.n, "cores_per_host": self.cores_per_host,
                "cgroup_version": self.version,
                "caps": [{"host": self.name(i), "cpuset": c.cpus, "quota_us": c.quota_us,
                          "period_us": c.period_us}
                         for i, c in enumerate(self.caps)],
                "link_gbps": self.link_gbps, "tbf": self.link_spec or "none (unshaped)"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["up", "down", "exec", "status"])
    ap.add_argument("args", nargs="*", help="exec: HOST -- COMMAND...")
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--cores-per-host", type=float, default=1.0)
    ap.add_argument("--link-gbps", type=float,
                    help="Shape every link to this rate [default: unshaped].")
    ap.add_argument("--state", type=Path,
                    default=Path(os.environ.get("CPD_STATE", "/tmp/cpd-capped")))
    ap.add_argument("--prefix", default="cap")
    a = ap.parse_args()
    cluster = CappedCluster(a.hosts, a.state, prefix=a.prefix, cores_per_host=a.cores_per_host,
                            link_gbps=a.link_gbps)
    if a.command == "up":
        cluster.up()
        print(json.dumps({"hostfile": str(cluster.hostfile), "user_key": str(cluster.user_key),
                          **cluster.describe()}))
    elif a.command == "down":
        cluster.down()
    elif a.command == "exec":
        argv = cluster.exec_argv(int(a.args[0]), a.args[1:])
        os.execvp(argv[0], argv)
    else:
        for i in range(a.hosts):
            print(cluster.name(i), cluster.addr(i), cluster.group(i), "pids:",
                  cluster.group_pids(i))


if __name__ == "__main__":
    main()
