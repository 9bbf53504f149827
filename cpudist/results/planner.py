"""Predict step time, speedup and cost at N nodes from a measured 1-node run; check it against
measured runs.

The model (pure arithmetic; `cpudist plan` prints its inputs beside its answers):

- Compute per step: t_c = train_time_s / steps of the 1-node run. It moved nothing between nodes,
  so all of its time counts as compute (with several ranks on the node it includes their
  intra-node sync, which the model keeps at N nodes).
- N nodes run the same ranks per node and the same per-rank batch: N times the samples per step.
- Communication per step: t_m = wire bytes / link rate + latency x collectives, where the wire bytes
  are those of the busiest node's interface (cpudist/traffic.py, from the run's `param_shapes`): a
  ring all-reduce (DDP, `allreduce`, local SGD's averages) sends 2(W-1)/W of the payload on every
  node's link; gather-scatter moves (W - ppn) copies into the head and as many out again, one after
  the other (the mean needs every gradient first), so twice that over the head's link; local SGD
  averages every K steps (1/K per step, after its synchronous warm-up); bf16 halves the payload;
  PowerSGD sends its low-rank factors after its fp32 start steps. Collectives per step: DDP's
  buckets (`traffic.buckets`); PowerSGD three per bucket (uncompressed tensors, P, Q); `allreduce`
  one (every gradient flattened); gather-scatter two (a gather, a scatter); local SGD one bucket set
  per average. The link rate is `--link-gbps`, or the bus bandwidth `cpudist hosts bench` measured
  at its largest size.
- Overlap: DDP (with or without a compression hook) all-reduces buckets while backward still runs
  and hides a share f of t_m. f = 1 - exposed_comm_s / comm_time_s of measured multi-node DDP runs
  (their median) when the sources hold any, else 0 (conservative). Explicit strategies (allreduce,
  gather-scatter, local SGD's averaging) run after backward and hide nothing.
- Step time at N nodes: t_c + (1 - f) t_m. Speedup = throughput at N / throughput at 1 node
  = N t_c / step time; efficiency = speedup / N. Time to finish = steps x step time, the steps
  being those that cover the same samples as the measured run (or what --steps/--epochs ask for);
  cost = N x price per node-hour x that time.
- Sync CPU: gloo's copies and reductions, the kernel's TCP work and PowerSGD's products take CPU
  time from the node's compute, which a 1-node run cannot show (on the miniature cluster's half-core
  nodes, 10% of a 2-node DDP step with the link unshaped). Where the sources hold measured
  multi-node runs, the model adds c x wire bytes per step, c (seconds per byte on the busiest link)
  being the median over those runs of (measured step - the step above) / their wire bytes, runs on
  the same CPU model with the same threads per rank (those of the strategy's own kind where there
  are any: a gather-scatter moves bytes without summing them, PowerSGD adds matrix products);
  without them c = 0 and the plan says so. `validate` fits c without the run it checks, as it does
  f.
- Step time at N nodes, all told: t_c + (1 - f) t_m + c x wire bytes.

This module is the model; cpudist/results/catalogue.py holds the strategies a plan compares and the
recommendation among them, cpudist/results/validation.py the fits of f and c from measured runs and
the check of the model against them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cpudist.errors import BadInput
from cpudist.results.schema import RunResult
from cpudist.results.select import by_start, find_run, peft_label
from cpudist.strategies import GATHER_SCATTER, SyncSpec, from_record
from cpudist.traffic import buckets, expected_traffic, ring_factor

DEFAULT_LATENCY_S = 1e-4

@dataclass(frozen=True)
class Link:
    """The network between nodes: rate of each node's link and latency per collective."""

    gbps: float
    latency_s: float = DEFAULT_LATENCY_S

    @property
    def bytes_per_s(self) -> float:
        return self.gbps * 1e9 / 8


@dataclass(kw_only=True, frozen=True)
class Baseline:
    """What the model takes from a measured 1-node run."""

    run_id: str
    compute_s: float  # t_c: seconds per optimizer step
    ppn: int
    samples_per_step: int  # the 1-node run's global batch
    samples: int
    steps: int
    shapes: tuple[tuple[int, ...], ...]
    # False: only the gradient's size is known (one flat tensor; PowerSGD cannot be priced)
    shapes_known: bool
    usd_per_node_hour: float | None
    dataset_samples: float | None  # samples per epoch, when the run trained by epochs


def baseline_of(r: RunResult) -> Baseline:
    """The model's inputs from a 1-node run; a run that lacks them is an error that says why."""
    if len(r.nodes) > 1:
        raise BadInput(f"run {r.run_id or '?'} ran on {len(r.nodes)} nodes",
                       "Plan from a 1-node run")
    if r.steps < 1 or r.train_time_s <= 0:
        raise BadInput(f"run {r.run_id or '?'} recorded no training steps",
                       "Plan from a run that trained")
    # Older results only have the ring bytes of their ranks, 2(W-1)/W of the fp32 gradient.
    grad = r.grad_bytes or (round(r.comm_bytes_per_step / ring_factor(r.world_size))
                            if r.world_size > 1 else 0)
    flat: tuple[tuple[int, ...], ...] = ((grad // 4,),) if grad else ()
    shapes = r.param_shapes or flat
    if not shapes:
        raise BadInput(f"run {r.run_id or '?'} has no parameter shapes or gradient size in its "
                       "result.json (written by an older cpudist)",
                       "Re-run it with this cpudist, then plan from that run")
    epochs = r.epochs if r.epochs else None
    return Baseline(run_id=r.run_id, compute_s=r.train_time_s / r.steps, ppn=r.ppn,
                    samples_per_step=r.global_batch_size, samples=r.train_samples,
                    steps=r.steps, shapes=tuple(tuple(s) for s in shapes),
                    shapes_known=bool(r.param_shapes),
                    usd_per_node_hour=r.usd_per_hour / max(1, len(r.nodes))
                    if r.usd_per_hour is not None else None,
                    dataset_samples=r.train_samples / epochs if epochs else None)


def same_job(a: RunResult, b: RunResult) -> bool:
    """Runs of one job: the same task, model, precision and work per rank (the ranks and the sync
    may differ)."""
    def key(r: RunResult) -> tuple[object, ...]:
        return (r.task, r.model, r.precision, r.per_rank_batch_size, r.grad_accum, r.max_seq_len,
                r.freeze_embeddings, peft_label(r), bool(r.checkpointed_layers))
    return key(a) == key(b)


def pick_baseline(runs: Sequence[RunResult], run_id: str | None = None) -> tuple[RunResult, str]:
    """(the 1-node run to plan from, why that one): the one named, else, of the 1-node runs of the
    newest one's job, those with the fewest ranks (no exchange at all with one), plain DDP first (an
    explicit sync on one node would count as compute), the newest of them."""
    if run_id is not None:
        return find_run(runs, run_id), "named by --baseline"
    ones = [r for r in runs if len(r.nodes) == 1 and r.steps > 0]
    if not ones:
        raise BadInput("the sources hold no 1-node run to plan from",
                       "Run one first (cpudist run TASK --np P on one node), then pass its run "
                       "folder or the ledger")
    if len(ones) == 1:
        return ones[0], "the only 1-node run in the sources"
    newest = by_start(ones)[-1]
    job = [r for r in ones if same_job(r, newest)]
    fewest = min(r.world_size for r in job)
    least = [r for r in job if r.world_size == fewest]
    plain = [r for r in least if sync_of(r).label == SyncSpec().label]
    chosen = by_start(plain or least)[-1]
    what = f"{newest.task} {newest.model} {newest.precision}"
    ranks = f"{fewest} rank{'s' if fewest > 1 else ''}" + (f", sync={chosen.sync}" if fewest > 1
                                                           else "")
    of = "the one" if len(plain or least) == 1 else f"the newest of {len(plain or least)}"
    first = ", plain DDP first" if plain and len(plain) < len(least) else ""
    return chosen, (f"of {len(job)} 1-node runs of {what} in the sources, {of} with the fewest "
                    f"ranks ({ranks}){first}")


def sync_of(r: RunResult) -> SyncSpec:
    """The sync a run used: its recorded knobs (under any cpudist's names), else its label."""
    return from_record(r.sync_options, r.sync)


def risk_of(sync: SyncSpec) -> str:
    """What the strategy changes in the optimization ('' when the gradients are averaged
    exactly)."""
    return sync.row.risk(sync)


def collectives(sync: SyncSpec, shapes: Sequence[Sequence[int]], steps: int) -> float:
    """Collective calls per step, averaged over `steps` (each pays the link's latency once)."""
    b = buckets(shapes, sync.bucket_cap_mb)
    steps = max(1, steps)
    return sum(p.count * p.calls * (b if p.per_bucket else 1)
               for p in sync.row.plan(sync, steps)) / steps


def wire_bytes(sync: SyncSpec, shapes: Sequence[Sequence[int]], nodes: int, ppn: int,
               steps: int) -> float:
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


@dataclass(kw_only=True, frozen=True)
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
    cost = (None if base.usd_per_node_hour is None
            else nodes * base.usd_per_node_hour * time_s / 3600)
    return Prediction(nodes=nodes, sync=sync.label, compute_s=base.compute_s, comm_s=t_m,
                      step_s=step, speedup=speedup, efficiency=speedup / nodes, steps=steps,
                      time_s=time_s, cost_usd=cost, risk=risk_of(sync), sync_cpu_s=cpu)


def steps_for(base: Baseline, nodes: int, samples: float) -> int:
    """Optimizer steps that cover `samples` samples at `nodes` nodes (the per-rank batch stays)."""
    return max(1, math.ceil(samples / (base.samples_per_step * nodes)))


def plan(base: Baseline, node_counts: Sequence[int], syncs: Sequence[SyncSpec], link: Link,
         overlap: float,
         samples: float, cpu_s_per_byte: Mapping[str, float] | None = None) -> list[Prediction]:
    """The 1-node reference row, then every strategy at every node count (PowerSGD only with real
    shapes)."""
    steps = steps_for(base, 1, samples)
    time_s = steps * base.compute_s
    cost = None if base.usd_per_node_hour is None else base.usd_per_node_hour * time_s / 3600
    rows = [Prediction(nodes=1, sync="measured", compute_s=base.compute_s, comm_s=0.0,
                       step_s=base.compute_s, speedup=1.0, efficiency=1.0, steps=steps,
                       time_s=time_s, cost_usd=cost, risk="")]
    usable = [s for s in syncs if base.shapes_known or s.grad_compression != "powersgd"]
    cpu = cpu_s_per_byte or {}  # c per strategy label
    rows += [predict(base, s, n, link, overlap, steps_for(base, n, samples), cpu.get(s.label, 0.0))
             for n in node_counts if n > 1 for s in usable]
    return rows
