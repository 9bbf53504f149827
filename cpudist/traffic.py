"""What a gradient sync puts on the wire: bytes per rank and per node, for each strategy.

Pure arithmetic over the shapes of the trained parameters and each strategy's traffic plan (its row
in cpudist/strategies.py); the trainer records it beside what the network interfaces counted, and
`cpudist plan` predicts step times from it.

- A ring all-reduce (gloo's, and what DDP, `allreduce` and local SGD's averaging use) has every rank
  send 2(N-1)/N of the payload to its successor; ranks are placed node by node, so exactly one ring
  edge leaves each node and a node's interface sends 2(N-1)/N of the payload whatever its ranks.
- gather-scatter: every rank sends its gradient to rank 0, which sends the mean back to each: the
  head node's interface carries (N - ppn) copies out, every other node's ppn copies.
- local SGD averages parameters every K steps (after its synchronous warm-up steps).
- Compression: bf16/fp16 halve the payload; PowerSGD of rank r sends (n + m) r fp32 values for an
  n x m matrix it compresses (PyTorch's rule: when that is under half of n m), vectors uncompressed,
  and plain fp32 gradients during its first steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from cpudist.strategies import GATHER_SCATTER, SyncSpec

FP32 = 4
POWERSGD_MIN_COMPRESSION_RATE = 2  # torch's PowerSGDState default


def powersgd_values(shape: Sequence[int], rank: int) -> int:
    """Values PowerSGD sends for one gradient of this shape (its P and Q, or the tensor
    uncompressed)."""
    numel = math.prod(shape)
    if len(shape) < 2:
        return numel
    n = shape[0]
    m = numel // n
    compressed = (n + m) * min(n, m, rank)
    return compressed if compressed * POWERSGD_MIN_COMPRESSION_RATE < numel else numel


def payload_bytes(shapes: Sequence[Sequence[int]], compression: str = "none", rank: int = 1) -> int:
    """Bytes of one gradient exchange (what a single rank contributes), before the algorithm's
    factor."""
    if compression == "powersgd":
        return FP32 * sum(powersgd_values(s, rank) for s in shapes)
    numel = sum(math.prod(s) for s in shapes)
    return numel * (2 if compression in ("bf16", "fp16") else FP32)


def ring_factor(world: int) -> float:
    """Share of the payload each rank sends in a ring all-reduce: 2(N-1)/N."""
    return 2 * (world - 1) / world


@dataclass(frozen=True)
class Traffic:
    """Expected bytes per optimizer step, averaged over the run's steps."""

    rank_send: float  # what the busiest rank sends
    # what each node's interface sends to other nodes (zeros on one node)
    node_tx: tuple[float, ...]
    exchanges: float  # collective exchanges of the full payload per step (0.125 for local SGD K=8)

    @property
    def total_node_tx(self) -> float:
        return sum(self.node_tx)


def _exchange(collective: str, payload: float, world: int, ppn: int) -> tuple[float, list[float]]:
    """(busiest rank's send, per-node interface send) of one exchange of `payload` bytes."""
    nodes = world // ppn
    if world == 1:
        return 0.0, [0.0] * nodes
    if collective == GATHER_SCATTER:
        per_node = [float((world - ppn) * payload)] + [float(ppn * payload)] * (nodes - 1)
        return (world - 1) * payload, per_node if nodes > 1 else [0.0]
    ring = ring_factor(world) * payload
    return ring, [ring if nodes > 1 else 0.0] * nodes


def expected_traffic(sync: SyncSpec, shapes: Sequence[Sequence[int]], world: int, ppn: int,
                     steps: int, step_bytes: int = 0) -> Traffic:
    """Bytes per optimizer step of a run of `steps` steps with this sync, averaged over its steps.

    `step_bytes`: a payload all-reduced as it is every step besides the gradients (ddp's touched-row
    mask of the word embedding, one byte a row: the embedding itself is then in `shapes` as the rows
    it sent).
    """
    steps = max(1, steps)
    grads = payload_bytes(shapes)
    send, per_node = _exchange(sync.row.collective, step_bytes, world, ppn)
    rank_send, node_tx, exchanges = steps * send, [steps * b for b in per_node], 0.0
    for phase in sync.row.plan(sync, steps):
        payload = phase.copies * payload_bytes(shapes, phase.compression, phase.powersgd_rank)
        send, per_node = _exchange(sync.row.collective, payload, world, ppn)
        rank_send += phase.count * send
        node_tx = [a + phase.count * b for a, b in zip(node_tx, per_node, strict=True)]
        exchanges += phase.count * payload / grads if grads else 0.0
    return Traffic(rank_send / steps, tuple(t / steps for t in node_tx), exchanges / steps)


DDP_FIRST_BUCKET_MB = 1.0  # DDP fills a small first bucket, so the first all-reduce starts early


def buckets(shapes: Sequence[Sequence[int]], cap_mb: float) -> int:
    """About how many buckets DDP makes of these fp32 gradients (for the per-bucket latency of the
    plan)."""
    rest = payload_bytes(shapes) - DDP_FIRST_BUCKET_MB * 1024 * 1024
    return 1 + max(0, math.ceil(rest / (cap_mb * 1024 * 1024)))
