"""What this CPU offers: model, vector extensions, physical cores, and how many of them this process
may use (affinity mask, cgroup CPU quota): parsed from text, then read."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

INTERESTING_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_vnni")


@dataclass(frozen=True)
class CpuInfo:
    """The facts about a CPU that decide precision and thread counts."""

    model: str
    flags: frozenset[str]
    logical_cpus: int
    physical_cores: int
    # "socket:core" of each core counted
    core_ids: frozenset[str] = field(default=frozenset(), compare=False)

    @property
    def has_bf16(self) -> bool:
        """Native bf16 arithmetic (AVX512-BF16 or AMX); without it bf16 is emulated and slow."""
        return bool(self.flags & {"avx512_bf16", "amx_bf16"})

    @property
    def kind(self) -> str:
        """The class of CPU that decides the fast path: amx-bf16, avx512-bf16, avx512, avx2 or
        other."""
        for flag, name in (("amx_bf16", "amx-bf16"), ("avx512_bf16", "avx512-bf16"),
                           ("avx512f", "avx512"), ("avx2", "avx2")):
            if flag in self.flags:
                return name
        return "other"

    def summary(self) -> dict[str, object]:
        return {"model": self.model, "flags": sorted(self.flags & set(INTERESTING_FLAGS)),
                "logical_cpus": self.logical_cpus, "physical_cores": self.physical_cores,
                "bf16": self.has_bf16, "kind": self.kind}


def parse_cpuinfo(text: str, allowed: set[int] | None = None) -> CpuInfo:
    """Parse /proc/cpuinfo; `allowed` restricts counting to the CPUs this process may use."""
    blocks = [b for b in text.strip().split("\n\n") if b.strip()]
    model, flags = "unknown", frozenset[str]()
    cores: set[tuple[str, str]] = set()
    logical = 0
    for block in blocks:
        fields = dict(_kv(line) for line in block.splitlines() if ":" in line)
        cpu = int(fields.get("processor", "-1"))
        if allowed is not None and cpu not in allowed:
            continue
        logical += 1
        model = fields.get("model name", model)
        flags = frozenset(fields.get("flags", "").split()) or flags
        cores.add((fields.get("physical id", "0"), fields.get("core id", str(cpu))))
    return CpuInfo(model, flags, logical, max(1, len(cores)),
                   frozenset(f"{s}:{c}" for s, c in cores))


def _kv(line: str) -> tuple[str, str]:
    key, _, value = line.partition(":")
    return key.strip(), value.strip()


def read_cpu() -> CpuInfo:
    """This machine's CPU, counting only the cores this process is allowed to run on."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        n = os.cpu_count() or 1
        return CpuInfo("unknown", frozenset(), n, n)
    return parse_cpuinfo(text, set(os.sched_getaffinity(0)))


def parse_cgroup_paths(text: str) -> dict[str, str]:
    """/proc/self/cgroup as {controller: path}; the cgroup v2 line (`0::/path`) is under ""."""
    paths = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                paths[controller] = parts[2]
    return paths


def parse_cfs_quota(quota_us: str, period_us: str) -> float | None:
    """Cores allowed by cgroup v1's cpu.cfs_quota_us / cpu.cfs_period_us; None when unlimited
    (-1)."""
    quota, period = int(quota_us.strip()), int(period_us.strip())
    return None if quota <= 0 or period <= 0 else quota / period


def parse_cpu_max(text: str) -> float | None:
    """Cores allowed by cgroup v2's cpu.max (`QUOTA PERIOD`, or `max PERIOD` when unlimited)."""
    quota, _, period = text.strip().partition(" ")
    if quota == "max" or not period:
        return None
    return parse_cfs_quota(quota, period)


def _quota_at(folder: Path) -> float | None:
    try:
        if (folder / "cpu.max").is_file():
            return parse_cpu_max((folder / "cpu.max").read_text())
        return parse_cfs_quota((folder / "cpu.cfs_quota_us").read_text(),
                               (folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None


def quota_folders(paths: Mapping[str, str], root: Path = Path("/sys/fs/cgroup")) -> list[Path]:
    """The cgroup folders whose CPU limits apply to this process: its own and every ancestor's."""
    candidates = []
    if "cpu" in paths:  # cgroup v1, as this machine mounts it: /sys/fs/cgroup/cpu/<path>
        candidates += [(root / "cpu", paths["cpu"]), (root / "cpu,cpuacct", paths["cpu"])]
    if "" in paths:  # cgroup v2: the unified hierarchy at the root, or beside v1 controllers
        candidates += [(root, paths[""]), (root / "unified", paths[""])]
    folders = []
    for mount, rel in candidates:
        here = mount / rel.lstrip("/")
        while True:
            folders.append(here)
            if here == mount:
                break
            here = here.parent
    return folders


def read_cpu_quota() -> float | None:
    """The tightest CPU quota (in cores) over this process's cgroup and its ancestors; None: no
    limit."""
    try:
        paths = parse_cgroup_paths(Path("/proc/self/cgroup").read_text())
    except OSError:
        return None
    quotas = [q for q in (_quota_at(f) for f in quota_folders(paths)) if q is not None]
    return min(quotas, default=None)


def usable_cores(physical_cores: int, quota: float | None) -> int:
    """Cores a process can keep busy: those in its affinity mask, no more than its quota (rounded
    up, at least 1: a 0.5-core quota still runs one thread)."""
    if quota is None:
        return physical_cores
    return max(1, min(physical_cores, math.ceil(quota - 1e-9)))
