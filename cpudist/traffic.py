"""What a gradient sync puts on the wire: bytes per rank and per node, for each strategy.

Pure arithmetic over the shapes of the trained parameters; the trainer records it beside what the
network interfaces counted, and `cpudist plan` predicts step times from it.

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

from cpudist.errors import BadInput

STRATEGIES = ("ddp", "allreduce", "gather-scatter", "local-sgd")
COMPRESSIONS = ("none", "bf16", "fp16", "powersgd")
FP32 = 4
POWERSGD_MIN_COMPRESSION_RATE = 2  # torch's PowerSGDState default


@dataclass(frozen=True)
class SyncSpec:
    """How the ranks agree on the model: strategy and its knobs (recorded in result.json)."""

    strategy: str = "ddp"
    compression: str = "none"  # ddp: none | bf16 | fp16 | powersgd; local-sgd: none | bf16
    powersgd_rank: int = 1
    powersgd_start: int = 2  # steps of plain fp32 all-reduce before PowerSGD compresses
    bucket_cap_mb: float = 25.0
    sync_every: int = 1  # local-sgd: K, steps between parameter averages
    warmup_steps: int = 0  # local-sgd: synchronous (gradient-averaging) steps first
    outer: str = "none"  # local-sgd: none | nesterov (DiLoCo's outer optimizer)
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    moments: str = "none"  # local-sgd: AdamW's moments averaged with the parameters: none | first | second | both
    second_moment_every: int = 1  # local-sgd: the second moment joins every J-th average only (it moves slowly)

    @property
    def label(self) -> str:
        """Short name for tables: ddp, ddp+bf16, ddp+powersgd:2, local-sgd:8, diloco:8, ..."""
        if self.strategy == "ddp" and self.compression != "none":
            return f"ddp+{self.compression}" + (f":{self.powersgd_rank}" if self.compression == "powersgd" else "")
        if self.strategy == "local-sgd":
            moments = {"none": "", "first": "+m", "second": "+v", "both": "+mv"}[self.moments]
            if self.second_moment_every > 1 and self.moments in ("second", "both"):  # +m+v/2: v every other average
                moments = ("+m" if self.moments == "both" else "") + f"+v/{self.second_moment_every}"
            wire = "" if self.compression == "none" else f"+{self.compression}"
            return f"{'diloco' if self.outer == 'nesterov' else 'local-sgd'}:{self.sync_every}{moments}{wire}"
        return self.strategy


def parse_compression(text: str) -> tuple[str, int]:
    """`powersgd:2` -> ("powersgd", 2); `bf16` -> ("bf16", 1); a bad value is one-line BadInput."""
    name, _, rank = text.partition(":")
    if name not in COMPRESSIONS or (rank and (name != "powersgd" or not rank.isdigit() or int(rank) < 1)):
        raise BadInput(f"--grad-compression {text}: not one of none, bf16, fp16, powersgd[:RANK]",
                       "e.g. --grad-compression bf16, or powersgd:2 for a rank-2 PowerSGD")
    return name, int(rank or 1)


def powersgd_values(shape: Sequence[int], rank: int) -> int:
    """Values PowerSGD sends for one gradient of this shape (its P and Q, or the tensor uncompressed)."""
    numel = math.prod(shape)
    if len(shape) < 2:
        return numel
    n = shape[0]
    m = numel // n
    compressed = (n + m) * min(n, m, rank)
    return compressed if compressed * POWERSGD_MIN_COMPRESSION_RATE < numel else numel


def payload_bytes(shapes: Sequence[Sequence[int]], compression: str = "none", rank: int = 1) -> int:
    """Bytes of one gradient exchange (what a single rank contributes), before the algorithm's factor."""
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
    node_tx: tuple[float, ...]  # what each node's interface sends to other nodes (zeros on one node)
    exchanges: float  # collective exchanges of the full payload per step (0.125 for local SGD K=8)

    @property
    def total_node_tx(self) -> float:
        return sum(self.node_tx)


def _exchange(strategy: str, payload: float, world: int, ppn: int) -> tuple[float, list[float]]:
    """(busiest rank's send, per-node interface send) of one exchange of `payload` bytes."""
    nodes = world // ppn
    if world == 1:
        return 0.0, [0.0] * nodes
    if strategy == "gather-scatter":
        per_node = [float((world - ppn) * payload)] + [float(ppn * payload)] * (nodes - 1)
        return (world - 1) * payload, per_node if nodes > 1 else [0.0]
    ring = ring_factor(world) * payload
    return ring, [ring if nodes > 1 else 0.0] * nodes


def expected_traffic(sync: SyncSpec, shapes: Sequence[Sequence[int]], world: int, ppn: int, steps: int) -> Traffic:
    """Bytes per optimizer step of a run of `steps` steps with this sync, averaged over its steps."""
    steps = max(1, steps)
    grads = payload_bytes(shapes)
    if sync.strategy == "local-sgd":
        warm = min(sync.warmup_steps, steps)
        averages = math.ceil((steps - warm) / max(1, sync.sync_every))  # the last one at the end of training
        # the parameters (or, on a 16-bit wire, their changes) and the moments averaged with them; the second
        # moment only with every J-th average (the i-th average takes it when J divides i)
        first, second = sync.moments in ("first", "both"), sync.moments in ("second", "both")
        wire = payload_bytes(shapes, sync.compression)
        plan = [(warm, grads), (averages, (1 + first) * wire),
                (averages // sync.second_moment_every, second * wire)]
    elif sync.strategy == "ddp" and sync.compression == "powersgd":
        start = min(sync.powersgd_start, steps)
        plan = [(start, grads), (steps - start, payload_bytes(shapes, "powersgd", sync.powersgd_rank))]
    elif sync.strategy == "ddp":
        plan = [(steps, payload_bytes(shapes, sync.compression))]
    else:
        plan = [(steps, grads)]
    rank_send, node_tx, exchanges = 0.0, [0.0] * (world // ppn), 0.0
    for count, payload in plan:
        send, per_node = _exchange(sync.strategy, payload, world, ppn)
        rank_send += count * send
        node_tx = [a + count * b for a, b in zip(node_tx, per_node, strict=True)]
        exchanges += count * payload / grads if grads else 0.0
    return Traffic(rank_send / steps, tuple(t / steps for t in node_tx), exchanges / steps)


DDP_FIRST_BUCKET_MB = 1.0  # DDP fills a small first bucket, so the first all-reduce starts early


def buckets(shapes: Sequence[Sequence[int]], cap_mb: float) -> int:
    """About how many buckets DDP makes of these fp32 gradients (for the per-bucket latency of the plan)."""
    rest = payload_bytes(shapes) - DDP_FIRST_BUCKET_MB * 1024 * 1024
    return 1 + max(0, math.ceil(rest / (cap_mb * 1024 * 1024)))
