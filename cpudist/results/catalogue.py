"""What `cpudist plan` compares and recommends: the strategies, their accuracy risk, the choice
among them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cpudist.results.planner import Prediction, risk_of
from cpudist.strategies import SyncSpec

# choices within 2% of the fastest count as as fast: then prefer exact gradients and fewer nodes
NEAR = 0.02


def strategies(powersgd_rank: int = 2, local_sgd_k: int = 8) -> tuple[SyncSpec, ...]:
    """The strategies a plan compares."""
    return (SyncSpec(), SyncSpec(grad_compression="bf16"),
            SyncSpec(grad_compression="powersgd", powersgd_rank=powersgd_rank),
            SyncSpec(strategy="allreduce"), SyncSpec(strategy="gather-scatter"),
            SyncSpec(strategy="local-sgd", sync_every=local_sgd_k))


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
    pick = min((p for p in rows if p.time_s <= best * (1 + NEAR)),
               key=lambda p: (risk_level(p), p.nodes, p.time_s))
    exact = min((p for p in rows if not p.risk), key=lambda p: (p.time_s, p.nodes))
    if pick.nodes == 1:
        other = min((p for p in rows if p.nodes > 1), key=lambda p: p.time_s, default=None)
        why = (f"the best of more nodes, {other.sync} at {other.nodes} nodes, reaches only "
               f"{other.speedup:.2f}x"
               if other else "no other node count was asked for")
        return Recommendation(pick, f"recommend: stay on 1 node ({why})", exact)
    cost = "" if pick.cost_usd is None else f", ${pick.cost_usd:.2f}"
    head = (f"recommend: {pick.nodes} nodes with {pick.sync}: {pick.speedup:.2f}x the 1-node "
            f"throughput ({pick.efficiency:.0%} efficiency), {duration(pick.time_s)}{cost}")
    batch = (f"the global batch grows {pick.nodes}x (same per-rank batch): "
             "the learning rate may need retuning")
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
