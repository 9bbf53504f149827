"""Speedup and efficiency of each configuration against its group's baseline, and what each
configuration's gradient sync put on the wire.

A group is every run that differs only in where and how many ranks ran (`group_parts`); a
configuration is one (nodes, ranks, ranks per node) of a group, its repeats aggregated into one row
(medians, their number, the range of their speedups). The baseline is the run named by --baseline,
else the configuration with the fewest nodes, then the fewest ranks (the median of its repeats);
every row says which and why.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from rich.filesize import decimal

from cpudist.results.checks import CHECK, likely_cause
from cpudist.results.schema import RunResult
from cpudist.results.select import by_start, peft_label, run_name

COLUMNS = ("nodes", "ranks", "ppn", "batch/rank", "global batch", "metric", "train time (s)",
           "samples/s", "samples/s/rank", "speedup", "efficiency", "$/run", "n", "speedup range",
           "run", "started (UTC)")
TRAFFIC_COLUMNS = ("nodes", "ranks", "sync", "expected between nodes/step", "measured",
                   "comm share", "bus Gbit/s")
# measured/expected beyond this is flagged: the model of the wire missed something
TRAFFIC_TOLERANCE = 0.10
FLAG = "!"
FLAG_NOTE = (f"{FLAG} measured bytes between nodes differ from the expected by over "
             f"{TRAFFIC_TOLERANCE:.0%}: other traffic on the counted interface (another job, "
             "staging, S3 checkpoints), the wrong interface counted (traffic_iface in "
             "result.json; set --iface), or bytes the sync's model misses. Check the nodes were "
             "otherwise idle and compare tx_bytes_by_node in result.json.")


@dataclass(kw_only=True, frozen=True)
class ScalingRow:
    """One configuration (its repeats aggregated: medians, how many, their range), against its
    group's baseline."""

    group: str
    nodes: int
    ranks: int
    ppn: int
    per_rank_batch: int
    global_batch: int
    metrics: dict[str, float]  # medians over the repeats
    train_time_s: float  # median
    samples_per_s: float  # median
    samples_per_s_per_rank: float
    speedup: float  # median samples/s over the baseline's
    efficiency: float  # speedup / (ranks / the baseline's ranks)
    run_id: str  # the newest run of the configuration
    cost_usd: float | None = None  # median
    group_parts: tuple[str, ...] = ()  # what the group key is made of, for legends and titles
    base_nodes: int = 1  # nodes of the group's baseline
    sync: str = "ddp"
    expected_tx_bytes_per_step: float = 0.0  # all nodes' interfaces together; 0 on one node
    measured_tx_bytes_per_step: float | None = None  # median
    traffic_error: float | None = None  # measured / expected - 1
    comm_share: float | None = None  # None: the runs did not time their communication
    bus_bandwidth_gbps: float | None = None
    n: int = 1  # runs of this configuration
    samples_per_s_min: float = 0.0
    samples_per_s_max: float = 0.0
    speedup_min: float = 0.0  # the slowest repeat over the baseline
    speedup_max: float = 0.0
    run_ids: tuple[str, ...] = ()  # every run of the configuration, oldest first
    started_at: tuple[str, ...] = ()  # their start times (UTC, ISO), in the same order
    base_ranks: int = 1
    baseline: tuple[str, ...] = ()  # the run(s) the speedup is against
    baseline_why: str = ""
    # why this speedup cannot be what it says, and the likely cause ('' when nothing is off)
    check: str = ""

    @property
    def traffic_flagged(self) -> bool:
        """Measured bytes between nodes miss the expected by more than the tolerance."""
        return self.traffic_error is not None and abs(self.traffic_error) > TRAFFIC_TOLERANCE

    @property
    def has_traffic(self) -> bool:
        """The runs recorded anything about their sync's traffic or time (runs before that did
        not)."""
        return bool(self.expected_tx_bytes_per_step or self.measured_tx_bytes_per_step is not None
                    or self.comm_share is not None or self.bus_bandwidth_gbps is not None)

    @property
    def flagged(self) -> bool:
        """A speedup beyond what the added ranks allow."""
        return bool(self.check)

    @property
    def is_baseline(self) -> bool:
        return bool(self.baseline) and set(self.baseline) <= set(self.run_ids)

    @property
    def date(self) -> str:
        """The newest run's start, to the minute ('' when not recorded)."""
        return self.started_at[-1][:16].replace("T", " ") if self.started_at else ""

    def cells(self) -> list[str]:
        """The speedup table's cells (medians; the range of the repeats' speedups when there are
        several)."""
        metric = " ".join(f"{k}={v:.4f}" for k, v in self.metrics.items()) or "-"
        spread = f"{self.speedup_min:.2f}-{self.speedup_max:.2f}x" if self.n > 1 else "-"
        run = self.run_id + (f" +{self.n - 1}" if self.n > 1 else "")
        return [str(self.nodes), str(self.ranks), str(self.ppn), str(self.per_rank_batch),
                str(self.global_batch), metric, f"{self.train_time_s:.1f}",
                f"{self.samples_per_s:.1f}",
                f"{self.samples_per_s_per_rank:.1f}", f"{self.speedup:.2f}x",
                f"{self.efficiency:.0%}" + (f" {CHECK}" if self.flagged else ""),
                "-" if self.cost_usd is None else f"{self.cost_usd:.4f}", str(self.n), spread, run
                or "-",
                self.date or "-"]

    def traffic_cells(self) -> list[str]:
        measured = "-"
        if self.measured_tx_bytes_per_step is not None:
            measured = human_bytes(self.measured_tx_bytes_per_step)
            if self.traffic_error is not None:
                measured += (f" ({self.traffic_error:+.0%})"
                             + (f" {FLAG}" if self.traffic_flagged else ""))
        return [str(self.nodes), str(self.ranks), self.sync,
                human_bytes(self.expected_tx_bytes_per_step) if self.expected_tx_bytes_per_step
                else "-",
                measured, "-" if self.comm_share is None else f"{self.comm_share:.0%}",
                "-" if self.bus_bandwidth_gbps is None else f"{self.bus_bandwidth_gbps:.2f}"]


def human_bytes(n: float) -> str:
    """Decimal units as network rates use them: 12.3 MB, 980 kB, 512 bytes."""
    return decimal(round(n))


def group_parts(r: RunResult) -> tuple[str, ...]:
    """What must match for runs to compare: everything but the number of ranks."""
    length = f"{r.max_steps} steps" if r.max_steps is not None else f"{r.epochs:g} epochs"
    # cpudist launch: the command, and what the script's metric file handed back, but its
    if r.task == "script":
        # length: HF Trainer's epoch of a fixed --max_steps grows with the ranks (the global batch
        # does)
        told = (r.precision, r.backend, f"batch/rank={r.per_rank_batch_size}x{r.grad_accum}" * bool(
            r.per_rank_batch_size), f"seq={r.max_seq_len}" * bool(r.max_seq_len))
        return (r.task, r.model, *(part for part in told if part))
    scaled = (f"lr-scaling={r.lr_scaling}",) if r.lr_scaling != "none" else ()
    # another model's bytes and steps
    frozen = ("frozen-embeddings",) if r.freeze_embeddings else ()
    # LoRA trains and sends other bytes than a full fine-tune
    adapters = (peft_label(r),) if r.peft else ()
    # a third more compute per step
    recomputed = ("gradient-checkpointing",) if r.checkpointed_layers else ()
    return (r.task, r.model, r.precision, r.backend, f"sync={r.sync}", *frozen, *adapters,
            *recomputed, *scaled,
            f"batch/rank={r.per_rank_batch_size}x{r.grad_accum}", f"seq={r.max_seq_len}", length)


def group_key(r: RunResult) -> str:
    """Runs compare when only the number of ranks differs."""
    return " ".join(group_parts(r))


def placement(nodes: int, ranks: int) -> str:
    """'1 node, 2 ranks'."""
    return f"{nodes} node{'s' if nodes > 1 else ''}, {ranks} rank{'s' if ranks > 1 else ''}"


Config = tuple[int, int, int]  # nodes, ranks, ranks per node


def config_of(r: RunResult) -> Config:
    return len(r.nodes), r.world_size, r.ppn


@dataclass(frozen=True)
class Base:
    """What a group's speedups are against."""

    runs: tuple[RunResult, ...]
    why: str

    @property
    def samples_per_s(self) -> float:
        return statistics.median(r.train_samples_per_s for r in self.runs)


def choose_base(configs: dict[Config, list[RunResult]], named: RunResult | None = None) -> Base:
    """The run named (when it is in this group), else the fewest nodes, then ranks: all of its
    repeats."""
    if named is not None and any(named == r for runs in configs.values() for r in runs):
        return Base((named,), f"{run_name(named)}, named by --baseline")
    (nodes, ranks, _), runs = min(configs.items(), key=lambda kv: kv[0][:2])
    where = placement(nodes, ranks)
    ids = ", ".join(run_name(r) for r in runs)
    what = f"{ids}" if len(runs) == 1 else f"the median of {len(runs)} runs {ids}"
    return Base(tuple(runs), f"{what} ({where}): the fewest nodes, then ranks, of the group")


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _metrics(runs: Sequence[RunResult]) -> dict[str, float]:
    keys = dict.fromkeys(k for r in runs for k in r.metrics)
    return {k: statistics.median(r.metrics[k] for r in runs if k in r.metrics) for k in keys}


def _row(runs: list[RunResult], base: Base) -> ScalingRow:
    r, b = runs[-1], base.runs[0]
    rates = [x.train_samples_per_s for x in runs]
    sps, to = statistics.median(rates), base.samples_per_s
    speedup = sps / to if to else 0.0
    ratio = r.world_size / b.world_size
    timed = [x.comm_share for x in runs if x.comm_time_s > 0 or x.exposed_comm_s > 0]
    expected = statistics.median(x.expected_tx_bytes_per_step for x in runs)
    measured = _median([x.measured_tx_bytes_per_step for x in runs])
    error = measured / expected - 1 if measured is not None and expected else None
    return ScalingRow(
        group=group_key(r), nodes=len(r.nodes), ranks=r.world_size, ppn=r.ppn,
        per_rank_batch=r.per_rank_batch_size, global_batch=r.global_batch_size,
        metrics=_metrics(runs),
        train_time_s=statistics.median(x.train_time_s for x in runs), samples_per_s=sps,
        samples_per_s_per_rank=sps / r.world_size, speedup=speedup,
        efficiency=speedup / ratio,
        run_id=run_name(r), cost_usd=_median([x.cost_usd for x in runs]),
        group_parts=group_parts(r), base_nodes=len(b.nodes), sync=r.sync,
        expected_tx_bytes_per_step=expected, measured_tx_bytes_per_step=measured,
        traffic_error=error, comm_share=_median(timed),
        bus_bandwidth_gbps=_median([x.bus_bandwidth_gbps for x in runs]), n=len(runs),
        samples_per_s_min=min(rates),
        samples_per_s_max=max(rates),
        speedup_min=min(rates) / to if to else 0.0, speedup_max=max(rates) / to if to else 0.0,
        run_ids=tuple(run_name(x) for x in runs),
        started_at=tuple(x.started_at for x in runs), base_ranks=b.world_size,
        baseline=tuple(run_name(x) for x in base.runs),
        baseline_why=base.why,
        # fewer ranks: faster per rank
        check=likely_cause(runs, base.runs, speedup / ratio, ratio) if ratio > 1 else "")


def scaling_rows(results: Sequence[RunResult],
                 baseline: RunResult | None = None) -> list[ScalingRow]:
    """One row per configuration of each group, ordered by ranks then nodes; speedup is the ratio of
    median training throughput to the group's baseline (`baseline` where it is in the group)."""
    groups: dict[str, dict[Config, list[RunResult]]] = {}
    for r in by_start(results):  # oldest first: a configuration's last run is its newest
        groups.setdefault(group_key(r), {}).setdefault(config_of(r), []).append(r)
    rows = []
    for configs in groups.values():
        base = choose_base(configs, baseline)
        for config in sorted(configs, key=lambda c: (c[1], c[0], c[2])):
            rows.append(_row(configs[config], base))
    return rows


def groups_of(rows: Sequence[ScalingRow]) -> list[str]:
    """The groups in the order their first row appears."""
    return list(dict.fromkeys(r.group for r in rows))

