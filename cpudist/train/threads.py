"""How many compute threads a rank runs: worked out where it runs, from the CPUs it may use there.

The launcher cannot see another node's cpuset or cgroup quota (Slurm, containers and `taskset` set
them), so each rank reads its own: the physical cores of its affinity mask and its cgroup CPU quota.
The ranks of a node share what their masks cover together (one all-gather at start-up tells each
rank its node's others), so 2 ranks on a node limited to 1 of its 2 cores run 1 thread each, not 2;
a rank that a launcher bound to its own cores (Intel MPI's pin domains, Slurm's task binding) keeps
to those. Slurm's `--cpus-per-task` (SLURM_CPUS_PER_TASK) caps it, and a number the user pins wins
over all: `--env OMP_NUM_THREADS=N` (the launcher then sets CPUDIST_THREADS=N).
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cpudist.cpu import read_cpu, read_cpu_quota, usable_cores
from cpudist.errors import BadInput


@dataclass(frozen=True)
class CpuShare:
    """The CPUs one rank may use: its node, the physical cores of its affinity mask, its cgroup
    quota."""

    host: str
    cores: frozenset[str]
    quota: float | None


def pinned_threads(env: Mapping[str, str]) -> int | None:
    """A thread count fixed from outside: CPUDIST_THREADS=N, or OMP_NUM_THREADS for a rank started
    by hand."""
    value = env.get("CPUDIST_THREADS", env.get("OMP_NUM_THREADS", "auto")).strip()
    if value == "auto":
        return None
    if not value.isdigit() or int(value) < 1:
        raise BadInput(f"thread count '{value}' is not a positive number",
                       "Pass --env OMP_NUM_THREADS=N with N >= 1")
    return int(value)


def threads_for(own: CpuShare, everyone: Sequence[CpuShare], allotted: int | None = None) -> int:
    """Threads for one rank: its node's usable cores split among the node's ranks, within its own
    mask."""
    local = [s for s in everyone if s.host == own.host] or [own]
    together = frozenset[str]().union(*(s.cores for s in local))
    quotas = [s.quota for s in local if s.quota is not None]
    node_cores = usable_cores(max(1, len(together)), min(quotas) if quotas else None)
    threads = min(max(1, len(own.cores)), node_cores // len(local))
    if allotted is not None:
        threads = min(threads, allotted)
    return max(1, threads)


def my_share() -> CpuShare:
    """This process's CPUs, read from /proc/cpuinfo, its affinity mask and its cgroup."""
    return CpuShare(socket.gethostname(), read_cpu().core_ids, read_cpu_quota())


def rank_threads(env: Mapping[str, str], world_size: int) -> int:
    """This rank's thread count; with several ranks, after learning the others' shares (one
    all-gather)."""
    pinned = pinned_threads(env)
    if pinned is not None:
        return pinned
    mine = my_share()
    everyone: list[CpuShare] = [mine]
    if world_size > 1:
        import torch.distributed as dist

        gathered: list[object] = [None] * world_size
        dist.all_gather_object(gathered, mine)
        everyone = [s for s in gathered if isinstance(s, CpuShare)]
    return threads_for(mine, everyone, allotted_cpus(env))


def allotted_cpus(env: Mapping[str, str]) -> int | None:
    """The CPUs a scheduler gave each task (Slurm's --cpus-per-task), if it said."""
    allotted = env.get("SLURM_CPUS_PER_TASK", "")
    return int(allotted) if allotted.isdigit() else None
