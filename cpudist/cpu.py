"""What this CPU offers: model, vector extensions, physical cores (parsed, then read)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

INTERESTING_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_vnni")


@dataclass(frozen=True)
class CpuInfo:
    """The facts about a CPU that decide precision and thread counts."""

    model: str
    flags: frozenset[str]
    logical_cpus: int
    physical_cores: int

    @property
    def has_bf16(self) -> bool:
        """Native bf16 arithmetic (AVX512-BF16 or AMX); without it bf16 is emulated and slow."""
        return bool(self.flags & {"avx512_bf16", "amx_bf16"})

    @property
    def kind(self) -> str:
        """The class of CPU that decides the fast path: amx-bf16, avx512-bf16, avx512, avx2 or other."""
        for flag, name in (("amx_bf16", "amx-bf16"), ("avx512_bf16", "avx512-bf16"), ("avx512f", "avx512"),
                           ("avx2", "avx2")):
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
    return CpuInfo(model, flags, logical, max(1, len(cores)))


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
