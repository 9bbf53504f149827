"""Speedup and efficiency against the smallest run of each group of comparable runs, and what each
run's gradient sync put on the wire."""

from __future__ import annotations

import csv
import io
import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from rich.filesize import decimal

from cpudist.results.schema import RunResult

COLUMNS = ("nodes", "ranks", "ppn", "batch/rank", "global batch", "metric", "train time (s)",
           "samples/s", "samples/s/rank", "speedup", "efficiency", "$/run")
TRAFFIC_COLUMNS = ("nodes", "ranks", "sync", "expected between nodes/step", "measured", "comm share",
                   "bus Gbit/s")
TRAFFIC_TOLERANCE = 0.10  # measured/expected beyond this is flagged: the model of the wire missed something
FLAG = "!"
FLAG_NOTE = (f"{FLAG} measured bytes between nodes differ from the expected by over {TRAFFIC_TOLERANCE:.0%}: other "
             "traffic on the counted interface (another job, staging, S3 checkpoints), the wrong interface counted "
             "(traffic_iface in result.json; set --iface), or bytes the sync's model misses. Check the nodes were "
             "otherwise idle and compare tx_bytes_by_node in result.json.")


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
    group_parts: tuple[str, ...] = ()  # what the group key is made of, for legends and titles
    base_nodes: int = 1  # nodes of the group's baseline run
    sync: str = "ddp"
    expected_tx_bytes_per_step: float = 0.0  # all nodes' interfaces together; 0 on one node
    measured_tx_bytes_per_step: float | None = None
    traffic_error: float | None = None  # measured / expected - 1
    comm_share: float | None = None  # None: the run did not time its communication
    bus_bandwidth_gbps: float | None = None

    @property
    def traffic_flagged(self) -> bool:
        """Measured bytes between nodes miss the expected by more than the tolerance."""
        return self.traffic_error is not None and abs(self.traffic_error) > TRAFFIC_TOLERANCE

    @property
    def has_traffic(self) -> bool:
        """The run recorded anything about its sync's traffic or time (runs before that did not)."""
        return bool(self.expected_tx_bytes_per_step or self.measured_tx_bytes_per_step is not None
                    or self.comm_share is not None or self.bus_bandwidth_gbps is not None)

    def cells(self) -> list[str]:
        metric = " ".join(f"{k}={v:.4f}" for k, v in self.metrics.items()) or "-"
        return [str(self.nodes), str(self.ranks), str(self.ppn), str(self.per_rank_batch),
                str(self.global_batch), metric, f"{self.train_time_s:.1f}", f"{self.samples_per_s:.1f}",
                f"{self.samples_per_s_per_rank:.1f}", f"{self.speedup:.2f}x", f"{self.efficiency:.0%}",
                "-" if self.cost_usd is None else f"{self.cost_usd:.4f}"]

    def traffic_cells(self) -> list[str]:
        measured = "-"
        if self.measured_tx_bytes_per_step is not None:
            measured = human_bytes(self.measured_tx_bytes_per_step)
            if self.traffic_error is not None:
                measured += f" ({self.traffic_error:+.0%})" + (f" {FLAG}" if self.traffic_flagged else "")
        return [str(self.nodes), str(self.ranks), self.sync,
                human_bytes(self.expected_tx_bytes_per_step) if self.expected_tx_bytes_per_step else "-",
                measured, "-" if self.comm_share is None else f"{self.comm_share:.0%}",
                "-" if self.bus_bandwidth_gbps is None else f"{self.bus_bandwidth_gbps:.2f}"]


def human_bytes(n: float) -> str:
    """Decimal units as network rates use them: 12.3 MB, 980 kB, 512 bytes."""
    return decimal(round(n))


def group_parts(r: RunResult) -> tuple[str, ...]:
    """What must match for runs to compare: everything but the number of ranks."""
    length = f"{r.max_steps} steps" if r.max_steps is not None else f"{r.epochs:g} epochs"
    scaled = (f"lr-scaling={r.lr_scaling}",) if r.lr_scaling != "none" else ()
    frozen = ("frozen-embeddings",) if r.freeze_embeddings else ()  # another model's bytes and steps
    return (r.task, r.model, r.precision, r.backend, f"sync={r.sync}", *frozen, *scaled,
            f"batch/rank={r.per_rank_batch_size}x{r.grad_accum}", f"seq={r.max_seq_len}", length)


def group_key(r: RunResult) -> str:
    """Runs compare when only the number of ranks differs."""
    return " ".join(group_parts(r))


def _row(r: RunResult, speedup: float, base: RunResult) -> ScalingRow:
    timed = r.comm_time_s > 0 or r.exposed_comm_s > 0
    return ScalingRow(group_key(r), len(r.nodes), r.world_size, r.ppn, r.per_rank_batch_size, r.global_batch_size,
                      r.metrics, r.train_time_s, r.train_samples_per_s, r.train_samples_per_s / r.world_size,
                      speedup, speedup / (r.world_size / base.world_size), r.run_id, r.cost_usd,
                      group_parts(r), len(base.nodes), r.sync, r.expected_tx_bytes_per_step,
                      r.measured_tx_bytes_per_step, r.traffic_error, r.comm_share if timed else None,
                      r.bus_bandwidth_gbps)


def scaling_rows(results: Sequence[RunResult]) -> list[ScalingRow]:
    """Rows grouped by comparability, ordered by ranks; speedup is the training-throughput ratio
    to the group's smallest run (the median when it ran more than once)."""
    groups: dict[str, list[RunResult]] = {}
    for r in results:
        groups.setdefault(group_key(r), []).append(r)
    rows = []
    for runs in groups.values():
        runs.sort(key=lambda r: (r.world_size, r.started_at))
        base = statistics.median(r.train_samples_per_s for r in runs if r.world_size == runs[0].world_size)
        rows += [_row(r, r.train_samples_per_s / base if base else 0.0, runs[0]) for r in runs]
    return rows


def groups_of(rows: Sequence[ScalingRow]) -> list[str]:
    """The groups in the order their first row appears."""
    return list(dict.fromkeys(r.group for r in rows))


def render_markdown(rows: Sequence[ScalingRow]) -> str:
    out = []
    for group in groups_of(rows):
        mine = [r for r in rows if r.group == group]
        out += [f"### {group}", "", *_md_table(COLUMNS, [r.cells() for r in mine]), ""]
        if any(r.has_traffic for r in mine):
            out += ["Gradient sync and traffic:", "", *_md_table(TRAFFIC_COLUMNS, [r.traffic_cells() for r in mine]),
                    ""]
            if any(r.traffic_flagged for r in mine):
                out += [FLAG_NOTE, ""]
    return "\n".join(out)


def _md_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(cells) + " |" for cells in body)]


def render_csv(rows: Sequence[ScalingRow]) -> str:
    """One line per run: the speedup table's cells, then the traffic table's (nodes and ranks once)."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["group", *COLUMNS, *TRAFFIC_COLUMNS[2:], "traffic flag", "run_id"])
    for r in rows:
        writer.writerow([r.group, *r.cells(), *r.traffic_cells()[2:], FLAG if r.traffic_flagged else "", r.run_id])
    return buf.getvalue()


def render_json(rows: Sequence[ScalingRow]) -> str:
    return json.dumps([{**asdict(r), "traffic_flagged": r.traffic_flagged} for r in rows], indent=2)
