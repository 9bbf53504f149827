"""How ranks agree on the model: one object per `--sync` strategy, called by the loop at three points.

    ddp             DistributedDataParallel: buckets all-reduced during backward, through a comm hook
                    (fp32, bf16, fp16 or PowerSGD) that also times them
    allreduce       after backward, one all-reduce of all gradients flattened (the teaching baseline)
    gather-scatter  rank 0 gathers every gradient, averages, scatters the mean back
    local-sgd       each rank steps alone; parameters are averaged every K steps (bucketed), after
                    synchronous warm-up steps; with an outer Nesterov optimizer it is DiLoCo: the
                    averaged change since the last sync is applied by SGD with Nesterov momentum

The loop calls `skip()` around non-final micro-batches of an accumulation, `gradients()` once the
step's backward passes are done, and `parameters()` after the optimizer step. Every exchange is
timed: `clock` holds the time collectives were in flight and the time the step waited for them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from cpudist.errors import BadInput
from cpudist.traffic import STRATEGIES, SyncSpec, parse_compression
from cpudist.train.config import TrainConfig

POWERSGD_START_SHARE = 0.1  # PowerSGD's plain fp32 steps before it compresses: 10% of the run


def spec_of(cfg: TrainConfig, total_steps: int) -> SyncSpec:
    """The run's SyncSpec, with warm-ups worked out from its length."""
    if cfg.sync not in STRATEGIES:
        raise BadInput(f"--sync {cfg.sync}: unknown", f"Use one of: {', '.join(STRATEGIES)}")
    compression, rank = parse_compression(cfg.grad_compression)
    start = max(2, round(POWERSGD_START_SHARE * total_steps))
    return SyncSpec(cfg.sync, compression, rank, start, cfg.bucket_cap_mb, cfg.sync_every,
                    cfg.local_sgd_warmup if cfg.sync == "local-sgd" else 0, cfg.outer_optimizer, cfg.outer_lr,
                    cfg.outer_momentum)


@dataclass
class CommClock:
    """Time the sync's collectives were in flight (union of intervals) and the time steps waited for them."""

    busy_s: float = 0.0
    exposed_s: float = 0.0
    _intervals: list[tuple[float, float]] = field(default_factory=list)
    _last_ready: float = 0.0  # when the step's last gradient bucket was handed to the network

    def started(self) -> float:
        t = time.perf_counter()
        self._last_ready = max(self._last_ready, t)
        return t

    def finished(self, start: float) -> None:
        self._intervals.append((start, time.perf_counter()))  # from gloo's thread: list.append is atomic

    def blocking(self, start: float) -> None:
        """A collective the step waited for from start to now."""
        self.finished(start)
        self.exposed_s += time.perf_counter() - start

    def end_step(self, overlapped: bool) -> None:
        """Close the step: add its in-flight time; for overlapped (DDP) buckets, the wait after the last one."""
        if overlapped and self._intervals:
            self.exposed_s += max(0.0, time.perf_counter() - self._last_ready)
        busy, end = 0.0, float("-inf")
        for a, b in sorted(self._intervals):
            busy += max(0.0, b - max(a, end))
            end = max(end, b)
        self.busy_s += busy
        self._intervals, self._last_ready = [], 0.0


def _mean_(tensors: list[torch.Tensor], world: int, clock: CommClock, cap_bytes: float | None = None) -> None:
    """Average tensors across ranks in place, in buckets of about `cap_bytes` (one bucket when None)."""
    bucket: list[torch.Tensor] = []
    size = 0
    for t in [*tensors, None]:
        if t is not None:
            bucket.append(t)
            size += t.numel() * t.element_size()
        if bucket and (t is None or (cap_bytes is not None and size >= cap_bytes)):
            flat = _flatten_dense_tensors(bucket)
            start = clock.started()
            dist.all_reduce(flat)
            clock.blocking(start)
            flat.div_(world)
            for dst, src in zip(bucket, _unflatten_dense_tensors(flat, bucket), strict=True):
                dst.copy_(src)
            bucket, size = [], 0


class Strategy:
    """The default for one rank: nothing to exchange."""

    label = "none"

    def __init__(self, model: torch.nn.Module, spec: SyncSpec, world: int) -> None:
        self.model, self.spec, self.world = model, spec, world
        self.clock = CommClock()
        self.trained = [p for p in model.parameters() if p.requires_grad]

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
        """After the optimizer step (and `final` after the last one): reconcile parameters if needed."""

    def state(self) -> dict[str, Any]:
        """What a checkpoint must keep for this strategy to go on."""
        return {}

    def load(self, state: dict[str, Any]) -> None:
        """Take back what `state()` gave."""


class DDP(Strategy):
    """DistributedDataParallel with a timed comm hook; --grad-compression picks the hook."""

    def __init__(self, model: torch.nn.Module, spec: SyncSpec, world: int) -> None:
        super().__init__(model, spec, world)
        # No buffer sync per forward: BERT's buffers never change, and a sync on a forward that some
        # ranks skip (evaluation with fewer rows than ranks) would mismatch the collectives.
        ddp = torch.nn.parallel.DistributedDataParallel(model, forward_sync_buffers=False,
                                                        bucket_cap_mb=spec.bucket_cap_mb)
        state, hook = _hook(spec)
        if spec.compression == "powersgd":
            hook = _in_order(hook)
        ddp.register_comm_hook(state, _timed(hook, self.clock))
        self.model = ddp

    def skip(self) -> contextlib.AbstractContextManager[Any]:
        return self.model.no_sync()  # type: ignore[operator]

    def gradients(self, step: int) -> None:
        self.clock.end_step(overlapped=True)  # the buckets went out during backward; it returned when done


def _hook(spec: SyncSpec) -> tuple[Any, Callable[..., Any]]:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if spec.compression == "powersgd":
        # Error feedback needs a few plain steps first (PyTorch refuses start_powerSGD_iter <= 1 with it).
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=spec.powersgd_rank,
                                            start_powerSGD_iter=max(2, spec.powersgd_start),
                                            use_error_feedback=True, warm_start=True)
        return state, powerSGD_hook.powerSGD_hook
    hooks = {"none": default_hooks.allreduce_hook, "bf16": default_hooks.bf16_compress_hook,
             "fp16": default_hooks.fp16_compress_hook}
    return None, hooks[spec.compression]


def _in_order(hook: Callable[..., Any]) -> Callable[..., Any]:
    """Start a bucket's hook only when the previous bucket's has finished.

    PowerSGD's hook issues its later all-reduces (P, then Q) from callbacks, which gloo runs on its own
    threads, while the autograd thread hands over the next bucket: each rank then issues the buckets'
    collectives in its own interleaving, and gloo pairs mismatched ones ("Received data size doesn't
    match expected size", distilbert's 11 buckets on 2 and 4 hosts). Waiting costs the overlap of one
    bucket's compression with backward; its traffic is small.
    """
    last: list[torch.futures.Future[Any]] = []

    def ordered(state: Any, bucket: Any) -> torch.futures.Future[Any]:
        if last:
            last.pop().wait()
        fut = hook(state, bucket)
        last.append(fut)
        return fut

    ordered.__annotations__ = {}
    return ordered


def _timed(hook: Callable[..., Any], clock: CommClock) -> Callable[..., Any]:
    """The hook, recording when each bucket went out and when its mean came back."""

    def timed(state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
        start = clock.started()
        fut = hook(state, bucket)

        def done(f: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            clock.finished(start)
            return f.value()

        return fut.then(done)

    # DDP checks a hook's annotations against the real classes; this module's are strings (PEP 563).
    timed.__annotations__ = {}
    return timed


class AllReduce(Strategy):
    """One all-reduce of every gradient, flattened, after backward."""

    def gradients(self, step: int) -> None:
        _mean_([p.grad for p in self.trained if p.grad is not None], self.world, self.clock)
        self.clock.end_step(overlapped=False)


class GatherScatter(Strategy):
    """Rank 0 gathers every rank's gradients, averages them and scatters the mean back."""

    def gradients(self, step: int) -> None:
        grads = [p.grad for p in self.trained if p.grad is not None]
        flat = _flatten_dense_tensors(grads)
        start = self.clock.started()
        rank = dist.get_rank()
        gathered = [torch.empty_like(flat) for _ in range(self.world)] if rank == 0 else None
        dist.gather(flat, gathered, dst=0)
        mean = torch.stack(gathered).sum(0).div_(self.world) if gathered is not None else None
        dist.scatter(flat, [mean] * self.world if mean is not None else None, src=0)
        self.clock.blocking(start)
        for dst, src in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
            dst.copy_(src)
        self.clock.end_step(overlapped=False)


class LocalSGD(Strategy):
    """Local steps; parameters averaged every K steps after `warmup_steps` synchronous ones (DiLoCo: via an
    outer Nesterov SGD on the averaged change)."""

    def __init__(self, model: torch.nn.Module, spec: SyncSpec, world: int) -> None:
        super().__init__(model, spec, world)
        self.cap = spec.bucket_cap_mb * 1024 * 1024
        self.anchor: list[torch.Tensor] = []
        self.outer: torch.optim.Optimizer | None = None
        self.synced_at = 0
        if spec.outer == "nesterov":
            self.anchor = [p.detach().clone() for p in self.trained]  # the model at the last sync
            self.outer = torch.optim.SGD(self.anchor, lr=spec.outer_lr, momentum=spec.outer_momentum,
                                         nesterov=spec.outer_momentum > 0)  # torch's Nesterov needs a momentum

    def local_step(self, step: int) -> bool:
        return step > self.spec.warmup_steps

    def gradients(self, step: int) -> None:
        if not self.local_step(step):  # warm-up: synchronous SGD
            _mean_([p.grad for p in self.trained if p.grad is not None], self.world, self.clock, self.cap)
        self.clock.end_step(overlapped=False)

    def parameters(self, step: int, final: bool = False) -> None:
        local = step - self.spec.warmup_steps
        due = local % self.spec.sync_every == 0 or final  # final: the steps since the last average
        if local <= 0 or not due or step == self.synced_at:
            return
        self.synced_at = step
        params = [p.data for p in self.trained]
        _mean_(params, self.world, self.clock, self.cap)
        if self.outer is not None:
            with torch.no_grad():
                for a, p in zip(self.anchor, params, strict=True):
                    a.grad = a - p  # the outer gradient: minus the averaged change since the last sync
                self.outer.step()
                for a, p in zip(self.anchor, params, strict=True):
                    p.copy_(a)
        self.clock.end_step(overlapped=False)

    def state(self) -> dict[str, Any]:
        if self.outer is None:
            return {}
        return {"anchor": [a.clone() for a in self.anchor], "outer": self.outer.state_dict()}

    def load(self, state: dict[str, Any]) -> None:
        if self.outer is not None and state:
            for a, saved in zip(self.anchor, state["anchor"], strict=True):
                a.copy_(saved)
            self.outer.load_state_dict(state["outer"])


CLASSES: dict[str, type[Strategy]] = {"ddp": DDP, "allreduce": AllReduce, "gather-scatter": GatherScatter,
                                      "local-sgd": LocalSGD}


def make(model: torch.nn.Module, spec: SyncSpec, world: int) -> Strategy:
    """The strategy object for this run (nothing to exchange on one rank)."""
    if world == 1:
        return Strategy(model, spec, world)
    return CLASSES[spec.strategy](model, spec, world)


def named_shapes(model: torch.nn.Module) -> Iterator[tuple[int, ...]]:
    """Shapes of the trained parameters, in the order DDP and the flattened exchanges see them."""
    return (tuple(p.shape) for p in model.parameters() if p.requires_grad)
