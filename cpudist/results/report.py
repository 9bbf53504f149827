"""Speedup and efficiency against the smallest run of each group of comparable runs."""

from __future__ import annotations

import csv
import io
import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from cpudist.results.schema import RunResult

COLUMNS = ("nodes", "ranks", "ppn", "batch/rank", "global batch", "metric", "train time (s)",
           "samples/s", "samples/s/rank", "speedup", "efficiency", "$/run")


@dataclass(frozen=True)
class ScalingRow:
    """One run, placed against the baseline of its group."""

    group: str
    nodes: int
    ranks: int
    ppn: int
    per_rank_batch: int
    global_batch: int
    metrics: dict[str, float]
    train_time_s: float
    samples_per_s: float
    samples_per_s_per_rank: float
    speedup: float
    efficiency: float
    run_id: str
    cost_usd: float | None = None

    def cells(self) -> list[str]:
        metric = " ".join(f"{k}={v:.4f}" for k, v in self.metrics.items()) or "-"
        return [str(self.nodes), str(self.ranks), str(self.ppn), str(self.per_rank_batch),
                str(self.global_batch), metric, f"{self.train_time_s:.1f}", f"{self.samples_per_s:.1f}",
                f"{self.samples_per_s_per_rank:.1f}", f"{self.speedup:.2f}x", f"{self.efficiency:.0%}",
                "-" if self.cost_usd is None else f"{self.cost_usd:.4f}"]


def group_key(r: RunResult) -> str:
    """Runs compare when only the number of ranks differs."""
    length = f"{r.max_steps} steps" if r.max_steps is not None else f"{r.epochs:g} epochs"
    return (f"{r.task} {r.model} {r.precision} {r.backend}/{r.sync} batch/rank={r.per_rank_batch_size}"
            f"x{r.grad_accum} seq={r.max_seq_len} {length}")


def scaling_rows(results: Sequence[RunResult]) -> list[ScalingRow]:
    """Rows grouped by comparability, ordered by ranks; speedup is the training-throughput ratio
    to the group's smallest run (the median when it ran more than once)."""
    groups: dict[str, list[RunResult]] = {}
    for r in results:
        groups.setdefault(group_key(r), []).append(r)
    rows = []
    for key, runs in groups.items():
        runs.sort(key=lambda r: (r.world_size, r.started_at))
        base_ranks = runs[0].world_size
        base = statistics.median(r.train_samples_per_s for r in runs if r.world_size == base_ranks)
        for r in runs:
            speedup = r.train_samples_per_s / base if base else 0.0
            rows.append(ScalingRow(key, len(r.nodes), r.world_size, r.ppn, r.per_rank_batch_size,
                                   r.global_batch_size, r.metrics, r.train_time_s,
                                   r.train_samples_per_s, r.train_samples_per_s / r.world_size,
                                   speedup, speedup / (r.world_size / base_ranks), r.run_id, r.cost_usd))
    return rows


def render_markdown(rows: Sequence[ScalingRow]) -> str:
    out = []
    for group in dict.fromkeys(r.group for r in rows):
        out += [f"### {group}", "", "| " + " | ".join(COLUMNS) + " |",
                "|" + "---|" * len(COLUMNS)]
        out += ["| " + " | ".join(r.cells()) + " |" for r in rows if r.group == group]
        out.append("")
    return "\n".join(out)


def render_csv(rows: Sequence[ScalingRow]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["group", *COLUMNS, "run_id"])
    for r in rows:
        writer.writerow([r.group, *r.cells(), r.run_id])
    return buf.getvalue()


def render_json(rows: Sequence[ScalingRow]) -> str:
    return json.dumps([asdict(r) for r in rows], indent=2)
