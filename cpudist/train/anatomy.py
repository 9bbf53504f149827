"""Where a training step goes on rank 0, in seconds per step: result.json's `step_anatomy`.

    compute    collation, forward, backward and the optimizer
    sync_cpu   the sync's own code on the training thread (casts, flattening, copies, DDP's hooks),
               less its waits
    wire       waiting for collectives that compute did not hide, as the slowest rank waited
    wait       waiting for the slowest rank to reach the step's collectives
    eval       the evaluations during training, spread over the steps

Every rank notes per step the sync's CPU work (CommClock.cpu_s) and its waits: for the sync's
collectives (CommClock.exposed_s) and for the per-step agreement on stopping, an all-reduce every
rank makes after each step (where local SGD's unsynced steps meet). Waiting for the slowest rank is
told from the wire by comparing ranks: a step's last collective ends at about the same moment on
every rank, so the rank that reached it last waited only for the wire, and every other rank for the
wire plus that rank. Per step, wire = the least wait over the ranks and rank 0's wait = its own less
that. Chosen over a barrier before the exchange (a collective of its own, and under DDP no "before":
its buckets leave during backward) and over bytes / bandwidth (a bandwidth measured by the same
all-reduces, blind to latency and to gloo's CPU time).

Compute is the remainder of rank 0's step (the loop's bracket from the batch to the optimizer's
update) after the sync's timed CPU work and waits: the bracket holds only the batches, the model,
the optimizer and the sync's code, and every path of the sync on the training thread is timed; what
no timer sees (DDP copying gradients into its buckets, gloo's threads taking cores from compute)
counts as compute. `step_s` is measured apart, by the loop's wall clock from its first step to its
last (evaluations, logging and checkpoints included) over the steps, so `sum_s` against `step_s`
shows what the parts leave out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

PARTS = ("compute_s", "sync_cpu_s", "wire_s", "wait_s", "eval_s")


@dataclass(kw_only=True)
class StepLog:
    """What one rank noted per step of this part of the run, and the loop's wall clock."""

    exposed: list[float] = field(default_factory=list)  # waits for the sync's collectives (in it)
    cpu: list[float] = field(default_factory=list)  # the sync's CPU work, inside the step
    agreed: list[float] = field(default_factory=list)  # the all-reduce agreeing on stops, after it
    loop_s: float = 0.0  # the loop's wall clock over this part's steps
    eval_s: float = 0.0  # the evaluations during those steps
    # what the wire's part is made of, per step, where the loop tells (--elastic: the quorum, the
    # average's exchanges, the commit's agreement)
    wire_parts: dict[str, list[float]] = field(default_factory=dict)

    def step(self, exposed: float, cpu: float) -> None:
        self.exposed.append(exposed)
        self.cpu.append(cpu)
        self.agreed.append(0.0)

    def parts(self, **seconds: float) -> None:
        """The step's wire time by part (after `step`)."""
        for name, s in seconds.items():
            self.wire_parts.setdefault(name, []).append(s)

    def agree(self, seconds: float) -> None:
        """The time the step's agreement on stopping took (after `step`)."""
        if self.agreed:
            self.agreed[-1] += seconds

    def waits(self) -> list[float]:
        """Per step, every wait for other ranks: what rank 0 compares with the others'."""
        return [e + a for e, a in zip(self.exposed, self.agreed, strict=True)]


def step_anatomy(step_times: Sequence[float], log: StepLog,
                 rank_waits: Sequence[Sequence[float]]) -> dict[str, Any]:
    """Rank 0's seconds per step in each part, their sum, and the step time by the loop's clock.

    `step_times` and `log` are rank 0's; `rank_waits`: every rank's `log.waits()` in rank order
    ({}: no step).
    """
    n = min([len(step_times), len(log.exposed), *(len(w) for w in rank_waits)])
    if n == 0:
        return {}
    mine = log.waits()[:n]
    least = [min(w[k] for w in rank_waits) for k in range(n)] if rank_waits else mine
    compute = sum(step_times[k] - log.exposed[k] - log.cpu[k] for k in range(n))
    parts = {"compute_s": compute / n,
             "sync_cpu_s": sum(log.cpu[:n]) / n,
             "wire_s": sum(least) / n,
             "wait_s": sum(m - w for m, w in zip(mine, least, strict=True)) / n,
             "eval_s": log.eval_s / n}
    total = sum(parts.values())
    step = log.loop_s / n
    wire_parts = {name: sum(each[:n]) / n for name, each in log.wire_parts.items()}
    return {**parts, "sum_s": total, "step_s": step, "steps": n,
            **({"wire_parts": wire_parts} if wire_parts else {})}


def mismatch(anatomy: dict[str, Any]) -> float | None:
    """sum_s / step_s - 1 (None: no anatomy)."""
    if not anatomy or not anatomy.get("step_s"):
        return None
    return float(anatomy["sum_s"]) / float(anatomy["step_s"]) - 1
