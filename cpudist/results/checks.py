"""A speedup the added ranks cannot give: when the report flags one, and its likely cause, read from
the runs."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from cpudist.results.schema import RunResult

# efficiency above 100% + this is beyond what the added ranks allow (noise stays under it)
TOLERANCE = 0.10
# fewer optimizer steps than this: the first steps' warm-up weighs on the mean rate
SHORT_STEPS = 20
CHECK = "!"


def beyond_ideal(efficiency: float) -> bool:
    """More speedup than the added ranks allow (efficiency over 100% by more than the tolerance)."""
    return efficiency > 1 + TOLERANCE


def _threads_per_node(r: RunResult) -> int:
    """Threads the run's ranks used on one node (0: not recorded)."""
    if r.rank_threads:
        return round(sum(r.rank_threads) / max(1, len(r.nodes)))
    return r.threads_per_rank * r.ppn


def _steady_ratio(runs: Sequence[RunResult]) -> float:
    """Median of steady samples/s (past the first steps) over mean samples/s: > 1 when warm-up
    dragged the mean."""
    ratios = [r.steady_samples_per_s / r.train_samples_per_s for r in runs
              if r.train_samples_per_s > 0 and r.steady_samples_per_s > 0]
    return statistics.median(ratios) if ratios else 1.0


def _warm_up(runs: Sequence[RunResult], base: Sequence[RunResult], ranks: float) -> str | None:
    steps = min(r.steps for r in (*runs, *base))
    base_ratio, ratio = _steady_ratio(base), _steady_ratio(runs)
    steady = [statistics.median(r.steady_samples_per_s for r in rs) for rs in (runs, base)]
    on_steady = ""
    if steady[1] > 0 and abs(_steady_ratio(runs) / base_ratio - 1) > TOLERANCE:
        s = steady[0] / steady[1]
        on_steady = (f"; on steady samples/s (past the first steps) it is {s:.2f}x, "
                     f"{s / ranks:.0%} efficiency")
    if base_ratio > ratio * (1 + TOLERANCE):
        return (f"the baseline's warm-up: its steady rate is {base_ratio:.2f}x its mean over "
                f"{steps} steps{on_steady}")
    if steps < SHORT_STEPS:
        return (f"a short run dominated by warm-up: {steps} steps, where thread pools, the "
                "allocator and the first "
                f"kernels weigh on the mean{on_steady}; run --max-steps 50 or more")
    return None


def _other_causes(runs: Sequence[RunResult], base: Sequence[RunResult]) -> list[str]:
    causes = []
    mine, theirs = max(map(_threads_per_node, runs)), min(map(_threads_per_node, base))
    if theirs and mine > theirs:
        causes.append(f"the baseline used fewer threads per node ({theirs}) than this run "
                      f"({mine}): more cores, "
                      "not only more ranks (check OMP_NUM_THREADS in --env, or taskset)")
    cpus = {str(r.cpu.get("model", "")) for r in (*runs, *base)} - {""}
    if len(cpus) > 1:
        causes.append(f"the runs ran on different CPUs ({', '.join(sorted(cpus))})")
    rates = [r.train_samples_per_s for r in base]
    if len(rates) > 1 and min(rates) > 0 and max(rates) / min(rates) > 1 + TOLERANCE:
        causes.append(f"the baseline's repeats differ by {max(rates) / min(rates) - 1:.0%}: a "
                      "noisy machine")
    return causes


def likely_cause(runs: Sequence[RunResult], base: Sequence[RunResult], efficiency: float,
                 ranks: float) -> str:
    """Why a configuration shows more speedup than `ranks` times the baseline's ranks allow ('' when
    it does not)."""
    if not beyond_ideal(efficiency):
        return ""
    causes = [c for c in (_warm_up(runs, base, ranks), *_other_causes(runs, base)) if c]
    if not causes:
        causes = ["a slowed baseline (another load on the machine while it ran, a cold page "
                  "cache, a first import): rerun it, alternating with this configuration"]
    return (f"efficiency {efficiency:.0%} is beyond what {ranks:g}x the ranks allow; likely "
            + "; or ".join(causes))
