"""How ranks agree on the model: one object per `--sync` strategy, called by the loop at three points.

Each Strategy subclass is the code of the row of cpudist/strategies.py with its `name` (the row says what
the planner, the traffic model and the option checks need to know of it); defining it registers it.

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
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from cpudist.strategies import SyncSpec
from cpudist.train import powersgd


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


def _mean_(tensors: list[torch.Tensor], world: int, clock: CommClock, cap_bytes: float | None = None,
           wire: torch.dtype | None = None) -> None:
    """Average tensors across ranks in place, in buckets of about `cap_bytes` on the wire (one bucket when None);
    `wire`: the dtype they cross it in (bf16 halves fp32's bytes), summed in fp32 again once back."""
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
    """The default for one rank: nothing to exchange. A subclass with a `name` is that strategy's code."""

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
        """After the optimizer step (and `final` after the last one): reconcile parameters if needed."""

    def state(self) -> dict[str, Any]:
        """What a checkpoint must keep for this strategy to go on, alike on every rank (rank 0's is written)."""
        return {}

    def rank_state(self) -> dict[str, Any]:
        """What a checkpoint must keep of this rank's own (gathered from every rank; {}: nothing)."""
        return {}

    def load(self, state: dict[str, Any], mine: dict[str, Any] | None) -> None:
        """Take back what `state()` and this rank's `rank_state()` gave (mine None: a checkpoint without it)."""


class DDP(Strategy):
    """DistributedDataParallel with a timed comm hook; --grad-compression picks the hook."""

    name = "ddp"

    def __init__(self, model: torch.nn.Module, spec: SyncSpec, world: int) -> None:
        super().__init__(model, spec, world)
        # No buffer sync per forward: BERT's buffers never change, and a sync on a forward that some
        # ranks skip (evaluation with fewer rows than ranks) would mismatch the collectives.
        ddp = torch.nn.parallel.DistributedDataParallel(model, forward_sync_buffers=False,
                                                        bucket_cap_mb=spec.bucket_cap_mb)
        state, hook = _hook(spec)
        self.memory: powersgd.Memory | None = None
        if spec.grad_compression == "powersgd":
            self.memory = powersgd.Memory(state, self.trained)
            hook = _in_order(self.memory.wrap(hook))
        ddp.register_comm_hook(state, _timed(hook, self.clock))
        self.model = ddp

    def skip(self) -> contextlib.AbstractContextManager[Any]:
        return self.model.no_sync()  # type: ignore[operator]

    def gradients(self, step: int) -> None:
        self.clock.end_step(overlapped=True)  # the buckets went out during backward; it returned when done

    def state(self) -> dict[str, Any]:
        return {"powersgd": self.memory.shared()} if self.memory is not None else {}

    def rank_state(self) -> dict[str, Any]:
        return {"powersgd": self.memory.mine()} if self.memory is not None else {}

    def load(self, state: dict[str, Any], mine: dict[str, Any] | None) -> None:
        if self.memory is not None and "powersgd" in state:
            self.memory.load(state["powersgd"], (mine or {}).get("powersgd"))


def _hook(spec: SyncSpec) -> tuple[Any, Callable[..., Any]]:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if spec.grad_compression == "powersgd":
        # Error feedback needs a few plain steps first (PyTorch refuses start_powerSGD_iter <= 1 with it).
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=spec.powersgd_rank,
                                            start_powerSGD_iter=max(2, spec.powersgd_start),
                                            use_error_feedback=True, warm_start=True)
        return state, powerSGD_hook.powerSGD_hook
    hooks = {"none": default_hooks.allreduce_hook, "bf16": default_hooks.bf16_compress_hook,
             "fp16": default_hooks.fp16_compress_hook}
    return None, hooks[spec.grad_compression]


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

    name = "allreduce"

    def gradients(self, step: int) -> None:
        _mean_([p.grad for p in self.trained if p.grad is not None], self.world, self.clock)
        self.clock.end_step(overlapped=False)


class GatherScatter(Strategy):
    """Rank 0 gathers every rank's gradients, averages them and scatters the mean back."""

    name = "gather-scatter"

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
    outer Nesterov SGD on the averaged change). With --average-moments, AdamW's moments are averaged too; with
    --grad-compression bf16, what crosses the wire is bf16: each rank's change since the last average (small
    numbers, kept to bf16's 3 digits, added to the fp32 model) and the moments (fp16 would flush the second
    moment's 1e-10s to zero; bf16 has fp32's range)."""

    name = "local-sgd"

    def __init__(self, model: torch.nn.Module, spec: SyncSpec, world: int) -> None:
        super().__init__(model, spec, world)
        self.cap = spec.bucket_cap_mb * 1024 * 1024
        self.wire = torch.bfloat16 if spec.grad_compression == "bf16" else None
        self.anchor: list[torch.Tensor] = []
        self.outer: torch.optim.Optimizer | None = None
        self.synced_at = 0
        self.averages = 0  # made so far (alike on every rank): every --second-moment-every J-th takes the second moment
        if spec.outer_optimizer == "nesterov" or self.wire is not None:
            self.anchor = [p.detach().clone() for p in self.trained]  # the model at the last sync
        if spec.outer_optimizer == "nesterov":
            self.outer = torch.optim.SGD(self.anchor, lr=spec.outer_lr, momentum=spec.outer_momentum,
                                         nesterov=spec.outer_momentum > 0)  # torch's Nesterov needs a momentum

    def local_step(self, step: int) -> bool:
        return step > self.spec.local_sgd_warmup

    def gradients(self, step: int) -> None:
        if not self.local_step(step):  # warm-up: synchronous SGD
            _mean_([p.grad for p in self.trained if p.grad is not None], self.world, self.clock, self.cap)
        self.clock.end_step(overlapped=False)

    def parameters(self, step: int, final: bool = False) -> None:
        local = step - self.spec.local_sgd_warmup
        due = local % self.spec.sync_every == 0 or final  # final: the steps since the last average
        if local <= 0 or not due or step == self.synced_at:
            return
        self.synced_at = step
        self.averages += 1
        with torch.no_grad():
            mean = self._averaged()
            if self.outer is not None:
                for a, m in zip(self.anchor, mean, strict=True):
                    a.grad = a - m  # the outer gradient: minus the averaged change since the last sync
                self.outer.step()
                mean = self.anchor
            for p, m in zip(self.trained, mean, strict=True):
                if m.data_ptr() != p.data_ptr():  # averaged elsewhere than in place
                    p.data.copy_(m)
            if self.outer is None and self.anchor:  # the 16-bit wire's next changes start here
                for a, p in zip(self.anchor, self.trained, strict=True):
                    a.copy_(p)
        self.clock.end_step(overlapped=False)

    def _averaged(self) -> list[torch.Tensor]:
        """The ranks' mean model (their moments averaged in place on the way): in the parameters themselves, or,
        with a 16-bit wire, the last average plus the mean of the ranks' changes since."""
        if self.wire is None:
            params = [p.data for p in self.trained]
            _mean_(params + self._moments(), self.world, self.clock, self.cap)
            return params
        changes = [p.data - a for p, a in zip(self.trained, self.anchor, strict=True)]
        _mean_(changes + self._moments(), self.world, self.clock, self.cap, self.wire)
        return [c.add_(a) for c, a in zip(changes, self.anchor, strict=True)]

    def _moments(self) -> list[torch.Tensor]:
        """AdamW's moments to average with the parameters (--average-moments), in the parameters' order; the
        second one (an average of squared gradients over ~1000 steps, which K steps barely move) only at every
        --second-moment-every J-th average. Measured: J=2 cost MRPC 11 points where J=1 cost 1 (an averaged
        first moment over a rank's own second moment steps badly)."""
        keys = {"none": (), "first": ("exp_avg",), "second": ("exp_avg_sq",),
                "both": ("exp_avg", "exp_avg_sq")}[self.spec.average_moments]
        if self.averages % self.spec.second_moment_every:
            keys = tuple(k for k in keys if k != "exp_avg_sq")
        if not keys or self.optimizer is None:
            return []
        state = self.optimizer.state
        return [state[p][k] for k in keys for p in self.trained if k in state.get(p, {})]

    def state(self) -> dict[str, Any]:
        """The last average (alike on every rank), DiLoCo's momentum, and which average comes next."""
        return {"anchor": [a.clone() for a in self.anchor], "averages": self.averages, "synced_at": self.synced_at,
                **({"outer": self.outer.state_dict()} if self.outer is not None else {})}

    def rank_state(self) -> dict[str, Any]:
        """Every rank's model and AdamW moments differ between averages (rank 0's are the checkpoint's own)."""
        if dist.get_rank() == 0 or self.optimizer is None:
            return {}
        return {"params": [p.detach().clone() for p in self.trained], "optimizer": self.optimizer.state_dict()}

    def load(self, state: dict[str, Any], mine: dict[str, Any] | None) -> None:
        if mine:
            with torch.no_grad():
                for p, saved in zip(self.trained, mine["params"], strict=True):
                    p.copy_(saved)
            if self.optimizer is not None:
                self.optimizer.load_state_dict(mine["optimizer"])
        self.averages, self.synced_at = int(state.get("averages", 0)), int(state.get("synced_at", 0))
        if state.get("anchor"):
            for a, saved in zip(self.anchor, state["anchor"], strict=True):
                a.copy_(saved)
        elif self.anchor:  # a checkpoint of format 1 holds the ranks' average: the model just restored is the last one
            for a, p in zip(self.anchor, self.trained, strict=True):
                a.copy_(p.data)
        if self.outer is not None and "outer" in state:
            self.outer.load_state_dict(state["outer"])


def make(model: torch.nn.Module, spec: SyncSpec, world: int) -> Strategy:
    """The strategy object for this run (nothing to exchange on one rank)."""
    if world == 1:
        return Strategy(model, spec, world)
    return Strategy.registry[spec.sync](model, spec, world)


def named_shapes(model: torch.nn.Module) -> Iterator[tuple[int, ...]]:
    """Shapes of the trained parameters, in the order DDP and the flattened exchanges see them."""
    return (tuple(p.shape) for p in model.parameters() if p.requires_grad)
