"""The planner checked against measured runs, and what it fits from them: DDP's hidden share f of
the communication, and the sync's CPU cost c per byte (cpudist/results/planner.py describes
both)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from cpudist.results.planner import (
    DEFAULT_LATENCY_S,
    Link,
    baseline_of,
    hides,
    predict,
    sync_of,
    wire_bytes,
)
from cpudist.results.schema import RunResult
from cpudist.strategies import SyncSpec

# without measured multi-node DDP runs: assume DDP hides nothing (conservative)
DEFAULT_OVERLAP = 0.0
GOAL = 0.15  # the plan should be within 15% of every measured speedup


def measured_overlap(runs: Sequence[RunResult]) -> tuple[float, tuple[str, ...]]:
    """(f, the runs it came from): median of 1 - exposed/comm over measured multi-node DDP runs,
    else 0."""
    ddp = [r for r in runs if len(r.nodes) > 1 and r.comm_time_s > 0 and hides(sync_of(r))]
    if not ddp:
        return DEFAULT_OVERLAP, ()
    shares = [min(1.0, max(0.0, 1 - r.exposed_comm_s / r.comm_time_s)) for r in ddp]
    return statistics.median(shares), tuple(r.run_id for r in ddp)


def comparable(a: RunResult, b: RunResult) -> bool:
    """Two runs whose step times compare: same work per rank and node, on the same CPU."""
    def key(r: RunResult) -> tuple[object, ...]:
        # other steps, other bytes
        lora = (r.peft.get("r"), tuple(r.peft.get("targets", ()))) if r.peft else None
        return (r.task, r.model, r.precision, r.backend, r.per_rank_batch_size, r.grad_accum,
                r.max_seq_len, r.ppn, r.cpu.get("model"), lora)
    return key(a) == key(b)


@dataclass(kw_only=True, frozen=True)
class Row:
    """Measured against predicted speedup of one multi-node run."""

    run_id: str
    baseline_id: str
    sync: str
    nodes: int
    world_size: int
    measured_speedup: float
    predicted_speedup: float
    error: float  # predicted / measured - 1
    flagged: bool  # |error| > GOAL
    measured_step_s: float
    predicted_step_s: float
    overlap: float
    traffic_error: float | None  # measured / expected bytes between nodes - 1, when counted
    cpu_s_per_byte: float = 0.0  # c used for this prediction


def base_of(r: RunResult, runs: Sequence[RunResult]) -> RunResult | None:
    """The newest 1-node run comparable to `r` (same work per rank and node, same CPU), if any."""
    bases = [b for b in runs if len(b.nodes) == 1 and b.steps > 0 and b.train_time_s > 0
             and comparable(b, r)]
    return max(bases, key=lambda x: x.started_at) if bases else None


def same_nodes(a: RunResult, b: RunResult) -> bool:
    return (a.cpu.get("model"), a.threads_per_rank) == (b.cpu.get("model"), b.threads_per_rank)


def measured_sync_cpu(runs: Sequence[RunResult], link: Link, like: RunResult | None = None,
                      overlap: float | None = None,
                      sync: SyncSpec | None = None) -> tuple[float, tuple[str, ...]]:
    """(c, the runs it came from): seconds of a node's step per byte on its busiest link beyond the
    wire time.

    The median over measured multi-node runs (on `like`'s CPU model and threads per rank, when
    given) of (measured step - t_c - (1 - f) t_m) / wire bytes, never below 0; 0 without such runs.
    With `sync`, only the runs of its kind when there are any (a gather moves bytes without summing
    them, a ring sums each).
    """
    per_byte, ids, kinds = [], [], []
    for r in runs:
        b = base_of(r, runs)
        if (len(r.nodes) < 2 or r.steps < 1 or b is None
                or (like is not None and not same_nodes(r, like))):
            continue
        base, ran = baseline_of(b), sync_of(r)
        wire = wire_bytes(ran, base.shapes, len(r.nodes), base.ppn, r.steps)
        if wire <= 0:
            continue
        f = overlap if overlap is not None else measured_overlap([x for x in runs if x is not r])[0]
        without = predict(base, ran, len(r.nodes), link, f, r.steps).step_s
        per_byte.append(max(0.0, (r.train_time_s / r.steps - without) / wire))
        ids.append(r.run_id)
        kinds.append(kind(ran))
    if sync is not None and kind(sync) in kinds:  # the same strategy's own cost, where measured
        pick = [i for i, k in enumerate(kinds) if k == kind(sync)]
        per_byte, ids = [per_byte[i] for i in pick], [ids[i] for i in pick]
    return (statistics.median(per_byte), tuple(ids)) if per_byte else (0.0, ())


def kind(sync: SyncSpec) -> tuple[str, str]:
    """What sets a sync's CPU work per byte: the collective (ring all-reduce, gather and scatter)
    and the compression around it (PowerSGD's matrix products, bf16's casts)."""
    return sync.strategy, sync.grad_compression if sync.row.cpu_by_compression else "none"


def validate(runs: Sequence[RunResult], link_gbps: float, latency_s: float = DEFAULT_LATENCY_S,
             overlap: float | None = None, cpu_s_per_byte: float | None = None) -> list[Row]:
    """Every multi-node run that has a comparable 1-node run, predicted from that run alone.

    Without `overlap`, DDP's f comes from the other measured DDP runs, and without `cpu_s_per_byte`,
    c from the other measured multi-node runs (never the run checked itself).
    """
    link = Link(link_gbps, latency_s)
    rows = []
    for r in runs:
        b = base_of(r, runs)
        if len(r.nodes) < 2 or b is None or r.steps < 1:
            continue
        others = [x for x in runs if x is not r]
        f = overlap if overlap is not None else measured_overlap(others)[0]
        c = (cpu_s_per_byte if cpu_s_per_byte is not None
             else measured_sync_cpu(others, link, r, overlap, sync_of(r))[0])
        p = predict(baseline_of(b), sync_of(r), len(r.nodes), link, f, r.steps, c)
        measured = r.train_samples_per_s / b.train_samples_per_s
        error = p.speedup / measured - 1 if measured else math.inf
        rows.append(Row(run_id=r.run_id, baseline_id=b.run_id, sync=p.sync, nodes=len(r.nodes),
                        world_size=r.world_size, measured_speedup=measured,
                        predicted_speedup=p.speedup,
                        error=error,
                        flagged=abs(error) > GOAL, measured_step_s=r.train_time_s / r.steps,
                        predicted_step_s=p.step_s, overlap=f
                        if hides(sync_of(r)) else 0.0,
                        traffic_error=r.traffic_error, cpu_s_per_byte=c))
    return rows
