"""Predict step time, speedup and cost at N nodes from a measured 1-node run; check it against measured runs.

The model (pure arithmetic; `cpudist plan` prints its inputs beside its answers):

- Compute per step: t_c = train_time_s / steps of the 1-node run. It moved nothing between nodes,
  so all of its time counts as compute (with several ranks on the node it includes their
  intra-node sync, which the model keeps at N nodes).
- N nodes run the same ranks per node and the same per-rank batch: N times the samples per step.
- Communication per step: t_m = wire bytes / link rate + latency x collectives, where the wire
  bytes are those of the busiest node's interface (cpudist/traffic.py, from the run's
  `param_shapes`): a ring all-reduce (DDP, `allreduce`, local SGD's averages) sends 2(W-1)/W of the
  payload on every node's link; gather-scatter moves (W - ppn) copies into the head and as many out
  again, one after the other (the mean needs every gradient first), so twice that over the head's
  link; local SGD averages every K steps (1/K per step, after its synchronous warm-up); bf16 halves
  the payload; PowerSGD sends its low-rank factors after its fp32 start steps. Collectives per step:
  DDP's buckets (`traffic.buckets`); PowerSGD three per bucket (uncompressed tensors, P, Q);
  `allreduce` one (every gradient flattened); gather-scatter two (a gather, a scatter); local SGD
  one bucket set per average. The link rate is `--link-gbps`, or the bus bandwidth `cpudist hosts bench` measured at
  its largest size.
- Overlap: DDP (with or without a compression hook) all-reduces buckets while backward still runs
  and hides a share f of t_m. f = 1 - exposed_comm_s / comm_time_s of measured multi-node DDP runs
  (their median) when the sources hold any, else 0 (conservative). Explicit strategies (allreduce,
  gather-scatter, local SGD's averaging) run after backward and hide nothing.
- Step time at N nodes: t_c + (1 - f) t_m. Speedup = throughput at N / throughput at 1 node
  = N t_c / step time; efficiency = speedup / N. Time to finish = steps x step time, the steps
  being those that cover the same samples as the measured run (or what --steps/--epochs ask for);
  cost = N x price per node-hour x that time.
- Sync CPU: gloo's copies and reductions, the kernel's TCP work and PowerSGD's products take CPU time
  from the node's compute, which a 1-node run cannot show (on the miniature cluster's half-core
  nodes, 10% of a 2-node DDP step with the link unshaped). Where the sources hold measured multi-node
  runs, the model adds c x wire bytes per step, c (seconds per byte on the busiest link) being the
  median over those runs of (measured step - the step above) / their wire bytes, runs on the same
  CPU model with the same threads per rank (those of the strategy's own kind where there are any: a
  gather-scatter moves bytes without summing them, PowerSGD adds matrix products); without them c = 0
  and the plan says so. `validate` fits c without the run it checks, as it does f.
- Step time at N nodes, all told: t_c + (1 - f) t_m + c x wire bytes.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cpudist.errors import BadInput
from cpudist.results.schema import RunResult
from cpudist.strategies import GATHER_SCATTER, SyncSpec, from_record
from cpudist.traffic import buckets, expected_traffic, ring_factor

DEFAULT_OVERLAP = 0.0  # without measured multi-node DDP runs: assume DDP hides nothing (conservative)
DEFAULT_LATENCY_S = 1e-4
GOAL = 0.15  # the plan should be within 15% of every measured speedup
NEAR = 0.02  # choices within 2% of the fastest count as as fast: then prefer exact gradients and fewer nodes

@dataclass(frozen=True)
class Link:
    """The network between nodes: rate of each node's link and latency per collective."""

    gbps: float
    latency_s: float = DEFAULT_LATENCY_S

    @property
    def bytes_per_s(self) -> float:
        return self.gbps * 1e9 / 8


@dataclass(frozen=True)
class Baseline:
    """What the model takes from a measured 1-node run."""

    run_id: str
    compute_s: float  # t_c: seconds per optimizer step
    ppn: int
    samples_per_step: int  # the 1-node run's global batch
    samples: int
    steps: int
    shapes: tuple[tuple[int, ...], ...]
    shapes_known: bool  # False: only the gradient's size is known (one flat tensor; PowerSGD cannot be priced)
    usd_per_node_hour: float | None
    dataset_samples: float | None  # samples per epoch, when the run trained by epochs


def baseline_of(r: RunResult) -> Baseline:
    """The model's inputs from a 1-node run; a run that lacks them is an error that says why."""
    if len(r.nodes) > 1:
        raise BadInput(f"run {r.run_id or '?'} ran on {len(r.nodes)} nodes", "Plan from a 1-node run")
    if r.steps < 1 or r.train_time_s <= 0:
        raise BadInput(f"run {r.run_id or '?'} recorded no training steps", "Plan from a run that trained")
    # Older results only have the ring bytes of their ranks, 2(W-1)/W of the fp32 gradient.
    grad = r.grad_bytes or (round(r.comm_bytes_per_step / ring_factor(r.world_size)) if r.world_size > 1 else 0)
    flat: tuple[tuple[int, ...], ...] = ((grad // 4,),) if grad else ()
    shapes = r.param_shapes or flat
    if not shapes:
        raise BadInput(f"run {r.run_id or '?'} has no parameter shapes or gradient size in its result.json "
                       "(written by an older cpudist)", "Re-run it with this cpudist, then plan from that run")
    epochs = r.epochs if r.epochs else None
    return Baseline(r.run_id, r.train_time_s / r.steps, r.ppn, r.global_batch_size, r.train_samples, r.steps,
                    tuple(tuple(s) for s in shapes), bool(r.param_shapes),
                    r.usd_per_hour / max(1, len(r.nodes)) if r.usd_per_hour is not None else None,
                    r.train_samples / epochs if epochs else None)


def pick_baseline(runs: Sequence[RunResult], run_id: str | None = None) -> tuple[RunResult, str]:
    """(the 1-node run to plan from, why that one): the one named, else the newest 1-node run."""
    if run_id is not None:
        named = [r for r in runs if r.run_id == run_id]
        if not named:
            raise BadInput(f"no run {run_id} in the sources", "Give its run folder, or a ledger that holds it")
        return named[-1], "the run named"
    ones = [r for r in runs if len(r.nodes) == 1 and r.steps > 0]
    if not ones:
        raise BadInput("the sources hold no 1-node run to plan from",
                       "Run one first (cpudist run TASK --np P on one node), then pass its run folder or the ledger")
    newest = max(enumerate(ones), key=lambda ir: (ir[1].started_at, ir[0]))[1]
    return newest, (f"the newest of {len(ones)} 1-node runs in the sources" if len(ones) > 1
                    else "the only 1-node run in the sources")


def sync_of(r: RunResult) -> SyncSpec:
    """The sync a run used: its recorded knobs (under any cpudist's names), else its label."""
    return from_record(r.sync_options, r.sync)


def strategies(powersgd_rank: int = 2, local_sgd_k: int = 8) -> tuple[SyncSpec, ...]:
    """The strategies a plan compares."""
    return (SyncSpec(), SyncSpec(grad_compression="bf16"),
            SyncSpec(grad_compression="powersgd", powersgd_rank=powersgd_rank), SyncSpec("allreduce"),
            SyncSpec("gather-scatter"), SyncSpec("local-sgd", sync_every=local_sgd_k))


def risk_of(sync: SyncSpec) -> str:
    """What the strategy changes in the optimization ('' when the gradients are averaged exactly)."""
    return sync.row.risk(sync)


def collectives(sync: SyncSpec, shapes: Sequence[Sequence[int]], steps: int) -> float:
    """Collective calls per step, averaged over `steps` (each pays the link's latency once)."""
    b = buckets(shapes, sync.bucket_cap_mb)
    steps = max(1, steps)
    return sum(p.count * p.calls * (b if p.per_bucket else 1) for p in sync.row.plan(sync, steps)) / steps


def wire_bytes(sync: SyncSpec, shapes: Sequence[Sequence[int]], nodes: int, ppn: int, steps: int) -> float:
    """Bytes per step on the busiest node's link, one phase after the other (0 on one node)."""
    if nodes < 2:
        return 0.0
    traffic = expected_traffic(sync, shapes, nodes * ppn, ppn, steps)
    # gather-scatter: the head receives every gradient before it can send the mean back
    phases = 2 if sync.row.collective == GATHER_SCATTER else 1
    return float(phases * max(traffic.node_tx))


def comm_time(sync: SyncSpec, shapes: Sequence[Sequence[int]], nodes: int, ppn: int, steps: int,
              link: Link) -> float:
    """t_m: seconds per step the sync needs on the busiest node's link (0 on one node)."""
    if nodes < 2:
        return 0.0
    return (wire_bytes(sync, shapes, nodes, ppn, steps) / link.bytes_per_s
            + link.latency_s * collectives(sync, shapes, steps))


def hides(sync: SyncSpec) -> bool:
    """DDP overlaps its all-reduces with backward; the explicit strategies run after it."""
    return sync.row.hides


@dataclass(frozen=True)
class Prediction:
    """One strategy at one node count."""

    nodes: int
    sync: str  # label; "measured" for the 1-node run itself
    compute_s: float
    comm_s: float  # t_m
    step_s: float  # t_c + exposed part of t_m
    speedup: float
    efficiency: float
    steps: int
    time_s: float
    cost_usd: float | None
    risk: str
    sync_cpu_s: float = 0.0  # c x wire bytes: the node's CPU time the sync takes from compute


def predict(base: Baseline, sync: SyncSpec, nodes: int, link: Link, overlap: float, steps: int,
            cpu_s_per_byte: float = 0.0) -> Prediction:
    """Step time, speedup, and time and cost of `steps` steps at `nodes` nodes with `sync`."""
    t_m = comm_time(sync, base.shapes, nodes, base.ppn, steps, link)
    cpu = cpu_s_per_byte * wire_bytes(sync, base.shapes, nodes, base.ppn, steps)
    step = base.compute_s + (1 - (overlap if hides(sync) else 0.0)) * t_m + cpu
    speedup = nodes * base.compute_s / step
    time_s = steps * step
    cost = None if base.usd_per_node_hour is None else nodes * base.usd_per_node_hour * time_s / 3600
    return Prediction(nodes, sync.label, base.compute_s, t_m, step, speedup, speedup / nodes, steps, time_s, cost,
                      risk_of(sync), cpu)


def steps_for(base: Baseline, nodes: int, samples: float) -> int:
    """Optimizer steps that cover `samples` samples at `nodes` nodes (the per-rank batch stays)."""
    return max(1, math.ceil(samples / (base.samples_per_step * nodes)))


def plan(base: Baseline, node_counts: Sequence[int], syncs: Sequence[SyncSpec], link: Link, overlap: float,
         samples: float, cpu_s_per_byte: Mapping[str, float] | None = None) -> list[Prediction]:
    """The 1-node reference row, then every strategy at every node count (PowerSGD only with real shapes)."""
    steps = steps_for(base, 1, samples)
    time_s = steps * base.compute_s
    cost = None if base.usd_per_node_hour is None else base.usd_per_node_hour * time_s / 3600
    rows = [Prediction(1, "measured", base.compute_s, 0.0, base.compute_s, 1.0, 1.0, steps, time_s, cost, "")]
    usable = [s for s in syncs if base.shapes_known or s.grad_compression != "powersgd"]
    cpu = cpu_s_per_byte or {}  # c per strategy label
    rows += [predict(base, s, n, link, overlap, steps_for(base, n, samples), cpu.get(s.label, 0.0))
             for n in node_counts if n > 1 for s in usable]
    return rows


def risk_level(p: Prediction) -> int:
    """0: exact gradient averaging; 1: rounded gradients; 2: a changed optimization."""
    return 0 if not p.risk else 1 if p.risk == risk_of(SyncSpec(grad_compression="bf16")) else 2


@dataclass(frozen=True)
class Recommendation:
    """The choice and the line that states it, with its accuracy risk."""

    choice: Prediction
    line: str
    fastest_exact: Prediction


def recommend(rows: Sequence[Prediction]) -> Recommendation:
    """The fastest choice; within NEAR of it, exact gradients first, then fewer nodes."""
    best = min(p.time_s for p in rows)
    pick = min((p for p in rows if p.time_s <= best * (1 + NEAR)), key=lambda p: (risk_level(p), p.nodes, p.time_s))
    exact = min((p for p in rows if not p.risk), key=lambda p: (p.time_s, p.nodes))
    if pick.nodes == 1:
        other = min((p for p in rows if p.nodes > 1), key=lambda p: p.time_s, default=None)
        why = (f"the best of more nodes, {other.sync} at {other.nodes} nodes, reaches only {other.speedup:.2f}x"
               if other else "no other node count was asked for")
        return Recommendation(pick, f"recommend: stay on 1 node ({why})", exact)
    cost = "" if pick.cost_usd is None else f", ${pick.cost_usd:.2f}"
    head = (f"recommend: {pick.nodes} nodes with {pick.sync}: {pick.speedup:.2f}x the 1-node throughput "
            f"({pick.efficiency:.0%} efficiency), {duration(pick.time_s)}{cost}")
    batch = f"the global batch grows {pick.nodes}x (same per-rank batch): the learning rate may need retuning"
    if risk_level(pick) == 0:
        return Recommendation(pick, f"{head}; exact gradient averaging, but {batch}", exact)
    alt = (f"the fastest exact choice is {exact.nodes} node{'s' if exact.nodes > 1 else ''} "
           f"{'' if exact.nodes == 1 else 'with ' + exact.sync + ' '}({duration(exact.time_s)})")
    return Recommendation(pick, f"{head}; accuracy risk: {pick.risk}; {alt}; and {batch}", exact)


def duration(seconds: float) -> str:
    """1h02m, 12m05s or 42.0s."""
    if seconds >= 3600:
        return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
    if seconds >= 60:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{seconds:.1f}s"


def measured_overlap(runs: Sequence[RunResult]) -> tuple[float, tuple[str, ...]]:
    """(f, the runs it came from): median of 1 - exposed/comm over measured multi-node DDP runs, else 0."""
    ddp = [r for r in runs if len(r.nodes) > 1 and r.comm_time_s > 0 and hides(sync_of(r))]
    if not ddp:
        return DEFAULT_OVERLAP, ()
    shares = [min(1.0, max(0.0, 1 - r.exposed_comm_s / r.comm_time_s)) for r in ddp]
    return statistics.median(shares), tuple(r.run_id for r in ddp)


def comparable(a: RunResult, b: RunResult) -> bool:
    """Two runs whose step times compare: same work per rank and node, on the same CPU."""
    def key(r: RunResult) -> tuple[object, ...]:
        return (r.task, r.model, r.precision, r.backend, r.per_rank_batch_size, r.grad_accum, r.max_seq_len, r.ppn,
                r.cpu.get("model"))
    return key(a) == key(b)


@dataclass(frozen=True)
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
    bases = [b for b in runs if len(b.nodes) == 1 and b.steps > 0 and b.train_time_s > 0 and comparable(b, r)]
    return max(bases, key=lambda x: x.started_at) if bases else None


def same_nodes(a: RunResult, b: RunResult) -> bool:
    return (a.cpu.get("model"), a.threads_per_rank) == (b.cpu.get("model"), b.threads_per_rank)


def measured_sync_cpu(runs: Sequence[RunResult], link: Link, like: RunResult | None = None,
                      overlap: float | None = None, sync: SyncSpec | None = None) -> tuple[float, tuple[str, ...]]:
    """(c, the runs it came from): seconds of a node's step per byte on its busiest link beyond the wire time.

    The median over measured multi-node runs (on `like`'s CPU model and threads per rank, when given) of
    (measured step - t_c - (1 - f) t_m) / wire bytes, never below 0; 0 without such runs. With `sync`, only
    the runs of its kind when there are any (a gather moves bytes without summing them, a ring sums each).
    """
    per_byte, ids, kinds = [], [], []
    for r in runs:
        b = base_of(r, runs)
        if len(r.nodes) < 2 or r.steps < 1 or b is None or (like is not None and not same_nodes(r, like)):
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
    """What sets a sync's CPU work per byte: the collective (ring all-reduce, gather and scatter) and the
    compression around it (PowerSGD's matrix products, bf16's casts)."""
    return sync.sync, sync.grad_compression if sync.row.cpu_by_compression else "none"


def validate(runs: Sequence[RunResult], link_gbps: float, latency_s: float = DEFAULT_LATENCY_S,
             overlap: float | None = None, cpu_s_per_byte: float | None = None) -> list[Row]:
    """Every multi-node run that has a comparable 1-node run, predicted from that run alone.

    Without `overlap`, DDP's f comes from the other measured DDP runs, and without `cpu_s_per_byte`, c
    from the other measured multi-node runs (never the run checked itself).
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
        rows.append(Row(r.run_id, b.run_id, p.sync, len(r.nodes), r.world_size, measured, p.speedup, error,
                        abs(error) > GOAL, r.train_time_s / r.steps, p.step_s, f if hides(sync_of(r)) else 0.0,
                        r.traffic_error, c))
    return rows
