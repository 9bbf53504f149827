"""What every sync strategy shares: the Strategy interface the loop calls, its clock, the bucketed
mean.

The loop calls `skip()` around non-final micro-batches of an accumulation, `gradients()` once the
step's backward passes are done, and `parameters()` after the optimizer step. Every exchange is
timed: `clock` holds the time collectives were in flight and the time the step waited for them.
A subclass with a `name` is the code of that row of cpudist/strategies.py; defining it registers it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from cpudist.strategies import SyncSpec


@dataclass(kw_only=True)
class CommClock:
    """Time the sync's collectives were in flight (union of intervals) and the time steps waited for
    them."""

    busy_s: float = 0.0
    exposed_s: float = 0.0
    cpu_s: float = 0.0  # the sync's code on the training thread (`work`), less its waits
    _blocked_s: float = 0.0  # the waits `blocking` recorded
    _intervals: list[tuple[float, float]] = field(default_factory=list)
    _last_ready: float = 0.0  # when the step's last gradient bucket was handed to the network

    def started(self) -> float:
        return self.ready()

    def ready(self) -> float:
        """A gradient the step waits for is computed (a bucket handed over, or one synced after
        backward)."""
        t = time.perf_counter()
        self._last_ready = max(self._last_ready, t)
        return t

    def finished(self, start: float) -> None:
        # from gloo's thread: list.append is atomic
        self._intervals.append((start, time.perf_counter()))

    def blocking(self, start: float) -> None:
        """A collective the step waited for from start to now."""
        self.finished(start)
        waited = time.perf_counter() - start
        self.exposed_s += waited
        self._blocked_s += waited

    @contextlib.contextmanager
    def work(self) -> Iterator[None]:
        """Around the sync's code on the training thread: its time, less its waits, is CPU work."""
        start, blocked = time.perf_counter(), self._blocked_s
        try:
            yield
        finally:
            self.cpu_s += max(0.0, time.perf_counter() - start - (self._blocked_s - blocked))

    def overlap_done(self) -> None:
        """The overlapped (DDP) buckets are back: add the wait since the last one was handed
        over."""
        if self._intervals:
            self.exposed_s += max(0.0, time.perf_counter() - self._last_ready)
            self._last_ready = 0.0

    def end_step(self, overlapped: bool) -> None:
        """Close the step: add its in-flight time; for overlapped (DDP) buckets, the wait after the
        last one."""
        if overlapped:
            self.overlap_done()
        busy, end = 0.0, float("-inf")
        for a, b in sorted(self._intervals):
            busy += max(0.0, b - max(a, end))
            end = max(end, b)
        self.busy_s += busy
        self._intervals, self._last_ready = [], 0.0


# --grad-compression values that are a wire dtype
WIRES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def wire_dtype(compression: str) -> torch.dtype | None:
    """The dtype a 16-bit --grad-compression sends in (None: the tensors' own, fp32)."""
    return WIRES.get(compression)


def mean_(tensors: list[torch.Tensor], world: int, clock: CommClock, cap_bytes: float | None = None,
           wire: torch.dtype | None = None) -> None:
    """Average tensors across ranks in place, in buckets of about `cap_bytes` on the wire (one
    bucket when None); `wire`: the dtype they cross it in (bf16 halves fp32's bytes), summed in fp32
    again once back."""
    bucket: list[torch.Tensor] = []
    size = 0
    for t in [*tensors, None]:
        if t is not None:
            bucket.append(t)
            size += t.numel() * (wire.itemsize if wire is not None else t.element_size())
        if bucket and (t is None or (cap_bytes is not None and size >= cap_bytes)):
            flat = _flatten_dense_tensors(bucket)
            sent = flat.to(wire) if wire is not None else flat
            start = clock.started()
            dist.all_reduce(sent)
            clock.blocking(start)
            flat = sent.to(flat.dtype).div_(world) if wire is not None else flat.div_(world)
            for dst, src in zip(bucket, _unflatten_dense_tensors(flat, bucket), strict=True):
                dst.copy_(src)
            bucket, size = [], 0


class Strategy:
    """The default for one rank: nothing to exchange. A subclass with a `name` is that strategy's
    code."""

    name = ""  # its row in cpudist/strategies.py
    registry: ClassVar[dict[str, type[Strategy]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.name:
            Strategy.registry[cls.name] = cls

    def __init__(self, model: torch.nn.Module, spec: SyncSpec, world: int) -> None:
        self.model, self.spec, self.world = model, spec, world
        self.clock = CommClock()
        self.trained = [p for p in model.parameters() if p.requires_grad]
        self.optimizer: torch.optim.Optimizer | None = None  # given by the loop once it is built

    def use(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimizer whose state a strategy may reconcile (local SGD's averaged moments)."""
        self.optimizer = optimizer

    def skip(self) -> contextlib.AbstractContextManager[Any]:
        """Around the backward passes of an accumulation's non-final micro-batches: no exchange."""
        return contextlib.nullcontext()

    def local_step(self, step: int) -> bool:
        """True when this step's gradients stay on the rank (local SGD between its syncs)."""
        return False

    def gradients(self, step: int) -> None:
        """After the step's backward passes: make the gradients the mean over ranks."""
        self.clock.end_step(overlapped=False)

    def parameters(self, step: int, final: bool = False) -> None:
        """After the optimizer step (and `final` after the last one): reconcile parameters if
        needed."""

    def state(self) -> dict[str, Any]:
        """What a checkpoint must keep for this strategy to go on, alike on every rank (rank 0's is
        written)."""
        return {}

    def rank_state(self) -> dict[str, Any]:
        """What a checkpoint must keep of this rank's own (gathered from every rank; {}:
        nothing)."""
        return {}

    def load(self, state: dict[str, Any], mine: dict[str, Any] | None) -> None:
        """Take back what `state()` and this rank's `rank_state()` gave (mine None: a checkpoint
        without it)."""
