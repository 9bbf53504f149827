"""`cpudist hosts bench`: an all-reduce probe of the links between a hostfile's nodes, kept for
`cpudist plan`.

The ranks start from the same launch spec as training (run/payloads.py, its Probe payload: the
launcher, nodes and rendezvous of run/prepare.resolve) and run `python -m cpudist.hosts.bench_rank`.
Bandwidths follow nccl-tests: algorithm bandwidth = bytes / time, bus bandwidth = algorithm
bandwidth x 2(N-1)/N, which for a ring all-reduce is the rate each node's link carried. Results go
to `$CPUDIST_HOME/bench/<hostfile>-<time>.json`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from cpudist import state
from cpudist.errors import BadInput, JobFailed
from cpudist.launch import runner
from cpudist.launch.runner import failed_host
from cpudist.launch.spec import Launch, RunSpec
from cpudist.traffic import ring_factor
from cpudist.wire import events

DEFAULT_SIZES = "1MB,8MB,32MB,64MB"
UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20,
         "gib": 2**30}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_sizes(text: str) -> tuple[int, ...]:
    """Byte counts from `1MB,8MB,512KiB,4096` (MB = 10^6 bytes, MiB = 2^20), multiples of 4
    (fp32)."""
    sizes = []
    for part in text.split(","):
        m = _SIZE.match(part)
        unit = m.group(2).lower() if m else ""
        if m is None or unit not in UNITS or float(m.group(1)) * UNITS[unit] < 4:
            raise BadInput(f"--sizes: '{part.strip()}' is not a size of at least 4 bytes",
                           "Write sizes like 1MB,8MB,64MB (also KB, GB, KiB, MiB, GiB, or bytes)")
        sizes.append(int(float(m.group(1)) * UNITS[unit]) // 4 * 4)
    return tuple(sorted(set(sizes)))


def human(nbytes: int) -> str:
    """64MB, 512KiB, 1000B: the shortest exact name of a size."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3), ("GiB", 2**30), ("MiB", 2**20),
                        ("KiB", 2**10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"


@dataclass(frozen=True)
class BenchPoint:
    """One size: the median time of its all-reduce and the bandwidths that follow."""

    bytes: int
    median_s: float
    algbw_gbps: float
    busbw_gbps: float


def points(sizes: Sequence[int], medians: Sequence[float], world: int) -> tuple[BenchPoint, ...]:
    """Bandwidths in Gbit/s as nccl-tests define them (bus = algorithm x 2(N-1)/N)."""
    out = []
    for nbytes, t in zip(sizes, medians, strict=True):
        alg = nbytes * 8 / t / 1e9 if t > 0 else 0.0
        out.append(BenchPoint(nbytes, t, alg, alg * ring_factor(world)))
    return tuple(out)


@dataclass(kw_only=True, frozen=True)
class BenchResult:
    """What a probe measured, as kept in ~/.cpudist/bench/."""

    hostfile: str
    rank_hosts: tuple[str, ...]
    world_size: int
    ppn: int
    launcher: str
    iters: int
    warmup: int
    created_at: str
    points: tuple[BenchPoint, ...]
    cpu: dict[str, Any] = field(default_factory=dict)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.rank_hosts))

    @property
    def link_gbps(self) -> float:
        """The link rate a plan takes: bus bandwidth at the largest size (least latency-bound)."""
        return max(self.points, key=lambda p: p.bytes).busbw_gbps

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "nodes": list(self.nodes), "link_gbps": self.link_gbps}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchResult:
        return cls(hostfile=data["hostfile"], rank_hosts=tuple(data["rank_hosts"]),
                   world_size=int(data["world_size"]), ppn=int(data["ppn"]),
                   launcher=data["launcher"], iters=int(data["iters"]), warmup=int(data["warmup"]),
                   created_at=data["created_at"],
                   points=tuple(BenchPoint(**p) for p in data["points"]),
                   cpu=dict(data.get("cpu", {})))


def save(result: BenchResult) -> Path:
    """Write the result as <hostfile name>-<time>.json under the bench folder; returns its path."""
    stamp = datetime.fromisoformat(result.created_at).strftime("%Y%m%d-%H%M%S")
    path = state.bench_dir() / f"{Path(result.hostfile).name}-{stamp}.json"
    state.write_atomic(path, json.dumps(result.to_dict(), indent=2) + "\n")
    return path


def read_bench(path: Path) -> BenchResult:
    """A saved probe result; a missing or foreign file is bad input."""
    try:
        result = BenchResult.from_dict(json.loads(path.read_text()))
    except FileNotFoundError:
        raise BadInput(f"no bench result at {path}",
                       "Run `cpudist hosts bench --hostfile H` on the head") from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise BadInput(f"{path} is not a `cpudist hosts bench` result ({e})",
                       f"Pass a file from {state.bench_dir()}/") from None
    if not result.points:
        raise BadInput(f"{path} holds no measured sizes", "Run `cpudist hosts bench` again")
    return result


def newest_bench() -> Path | None:
    """The most recently written result in the bench folder, if any."""
    found = list(state.bench_dir().glob("*.json")) if state.bench_dir().is_dir() else []
    return max(found, key=lambda p: p.stat().st_mtime, default=None)


def run_probe(hostfile: str, spec: RunSpec, launch: Launch, timeout_s: float,
              on_line: Callable[[str], None]) -> BenchResult:
    """Run the ranks to the end and return what rank 0 reported."""
    found: list[dict[str, Any]] = []
    outcome = runner.execute(launch, os.environ, lambda e: found.append(e)
                             if events.kind(e) == events.BENCH else None,
                             on_line, timeout_s)
    if outcome.timed_out:
        raise JobFailed(f"the probe ran past --timeout {timeout_s:g}s and was stopped",
                        "Raise --timeout, or measure fewer/smaller --sizes or fewer --iters")
    if outcome.returncode != 0 or not found:
        host = failed_host(outcome.last_lines)
        raise JobFailed(f"the probe failed{' on ' + host if host else ''} (launcher exit code "
                        f"{outcome.returncode})",
                        "See the rank output above; `cpudist hosts doctor --hostfile ...` checks "
                        "every node")
    e = found[-1]
    return BenchResult(hostfile=hostfile, rank_hosts=tuple(e["hosts"]),
                       world_size=int(e["world_size"]), ppn=spec.ppn, launcher=spec.launcher,
                       iters=int(e["iters"]), warmup=int(e["warmup"]),
                       created_at=datetime.now().isoformat(timespec="seconds"),
                       points=points(e["sizes"], e["medians"], int(e["world_size"])),
                       cpu=dict(e["cpu"]))
