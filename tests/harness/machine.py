"""This machine's shape as cpudist sees it, for tests that must hold on any machine CI lands on (2
cores here, 4 or 16 elsewhere, hyperthreads or not): the physical cores of this process's affinity
mask (cpudist/cpu.py), and one logical CPU on each of them."""

from __future__ import annotations

import os
from pathlib import Path

from cpudist.cpu import parse_cpuinfo, read_cpu


def physical_cores() -> int:
    """Physical cores this process may run on: what cpudist sizes threads by (not os.cpu_count(),
    which counts every logical CPU of the machine, hyperthreads and CPUs outside the affinity mask
    included)."""
    return read_cpu().physical_cores


def cpus_on_distinct_cores() -> list[int]:
    """One logical CPU of each physical core this process may use, lowest first: two of these never
    share a core (two hyperthreads of one core do)."""
    text = Path("/proc/cpuinfo").read_text()
    seen: set[str] = set()
    cpus = []
    for cpu in sorted(os.sched_getaffinity(0)):
        core = parse_cpuinfo(text, {cpu}).core_ids
        if core and not core & seen:
            seen |= core
            cpus.append(cpu)
    return cpus
