"""`cpudist report --anatomy`: where a step of each configuration went on rank 0.

The parts are result.json's step_anatomy, measured as cpudist/train/anatomy.py says; a
configuration's repeats give their medians.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from cpudist.results.report import ScalingRow
from cpudist.results.schema import RunResult
from cpudist.results.select import run_name

PARTS = ("compute_s", "sync_cpu_s", "wire_s", "wait_s", "eval_s")
KEYS = (*PARTS, "sum_s", "step_s")
COLUMNS = ("nodes", "ranks", "sync", "step (s)", "compute", "sync CPU", "wire not hidden",
           "wait for slowest", "evaluation", "sum (vs step)")
TITLE = "where a step goes on rank 0 (seconds per step; median of repeats)"
NOTE = ("compute: the step less the sync's timed CPU work and waits; wire: the wait of the rank "
        "that came last; wait for slowest: rank 0's wait beyond it; evaluation: during training, "
        "over the steps; step: the loop's wall clock over its steps (checkpoints and logging "
        "included), measured apart from the parts.")


def anatomy_of(rows: Sequence[ScalingRow],
               results: Sequence[RunResult]) -> dict[str, dict[str, float]]:
    """Per configuration (its newest run's id, as the row names it): the median of each part over
    its repeats that recorded one (none: no entry)."""
    by_name = {run_name(r): r for r in results}
    out: dict[str, dict[str, float]] = {}
    for row in rows:
        recorded = [by_name[i].step_anatomy for i in row.run_ids
                    if i in by_name and by_name[i].step_anatomy]
        if recorded:
            out[row.run_id] = {k: statistics.median(float(a[k]) for a in recorded) for k in KEYS}
    return out


def cells(row: ScalingRow, anatomy: dict[str, float] | None) -> list[str]:
    """One row of the anatomy table ('-' where the runs recorded none)."""
    if not anatomy:
        return [str(row.nodes), str(row.ranks), row.sync, *["-"] * (len(COLUMNS) - 3)]
    step = anatomy["step_s"]

    def part(key: str) -> str:
        return f"{anatomy[key]:.3f} ({anatomy[key] / step:.0%})" if step else f"{anatomy[key]:.3f}"

    off = f" ({anatomy['sum_s'] / step - 1:+.1%})" if step else ""
    return [str(row.nodes), str(row.ranks), row.sync, f"{step:.3f}", *(part(k) for k in PARTS),
            f"{anatomy['sum_s']:.3f}{off}"]


def record(anatomy: dict[str, float] | None) -> dict[str, Any]:
    """The CSV's and JSON's anatomy columns (blank when none was recorded)."""
    return {f"step_anatomy_{k}": (anatomy or {}).get(k) for k in KEYS}
