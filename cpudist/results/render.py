"""The report's rows as Markdown for people, and as CSV and JSON of plain numbers for programs."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from cpudist.results.checks import CHECK
from cpudist.results.report import (
    COLUMNS,
    FLAG_NOTE,
    TRAFFIC_COLUMNS,
    ScalingRow,
    groups_of,
    placement,
)

# Machine columns: numbers stay numbers (efficiency and shares as fractions, bytes as bytes, blank
# when unknown).
NUMBERS = ("nodes", "ranks", "ppn", "per_rank_batch", "global_batch", "train_time_s",
           "samples_per_s", "samples_per_s_min", "samples_per_s_max", "samples_per_s_per_rank",
           "speedup", "speedup_min", "speedup_max", "efficiency", "n", "cost_usd",
           "expected_tx_bytes_per_step", "measured_tx_bytes_per_step", "traffic_error",
           "comm_share", "bus_bandwidth_gbps")
METRIC_PREFIX = "eval_"  # as Hugging Face's Trainer names evaluation metrics


def notes(rows: Sequence[ScalingRow]) -> list[str]:
    """A group's baseline and why, then each flagged speedup with its likely cause."""
    if not rows:
        return []
    lines = [f"baseline: {rows[0].baseline_why}"]
    lines += [f"{CHECK} {placement(r.nodes, r.ranks)}: {r.check}" for r in rows if r.flagged]
    return lines


def render_markdown(rows: Sequence[ScalingRow]) -> str:
    out = []
    for group in groups_of(rows):
        mine = [r for r in rows if r.group == group]
        out += [f"### {group}", "", *_md_table(COLUMNS, [r.cells() for r in mine]), "",
                *notes(mine), ""]
        if any(r.has_traffic for r in mine):
            out += ["Gradient sync and traffic:", "",
                    *_md_table(TRAFFIC_COLUMNS, [r.traffic_cells() for r in mine]), ""]
            if any(r.traffic_flagged for r in mine):
                out += [FLAG_NOTE, ""]
    return "\n".join(out)


def _md_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(cells) + " |" for cells in body)]


def record(r: ScalingRow) -> dict[str, Any]:
    """One row as plain values: what the CSV and JSON carry."""
    return {"group": r.group, "task": r.group_parts[0] if r.group_parts else "",
            "model": r.group_parts[1] if len(r.group_parts) > 1 else "", "sync": r.sync,
            **{name: getattr(r, name) for name in NUMBERS},
            "traffic_flagged": r.traffic_flagged, "flagged": r.flagged, "check": r.check,
            "run_id": r.run_id, "started_at": r.started_at[-1] if r.started_at else "",
            "baseline_why": r.baseline_why}


Extra = Callable[[ScalingRow], dict[str, Any]]  # more columns of a row (report --anatomy's)


def _none(r: ScalingRow) -> dict[str, Any]:
    return {}


def render_csv(rows: Sequence[ScalingRow], extra: Extra = _none) -> str:
    """One line per configuration; metrics in eval_<name> columns; run ids space-separated."""
    metrics = list(dict.fromkeys(k for r in rows for k in r.metrics))
    first = [*record(rows[0]).keys(), *extra(rows[0]).keys()] if rows else []
    header = [*first, *(METRIC_PREFIX + m for m in metrics), "run_ids", "baseline"] if rows else []
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    for r in rows:
        values = [*record(r).values(), *extra(r).values(), *(r.metrics.get(m) for m in metrics),
                  " ".join(r.run_ids), " ".join(r.baseline)]
        writer.writerow(["" if v is None else v for v in values])
    return buf.getvalue()


def render_json(rows: Sequence[ScalingRow], extra: Extra = _none) -> str:
    """A list of rows: every field of the row (run_ids and started_at in full) and the CSV's derived
    values."""
    return json.dumps([{**record(r), **extra(r), **asdict(r)} for r in rows], indent=2)
