"""How ranks agree on the model: one object per `--sync` strategy, called by the loop at three
points.

Each Strategy subclass (cpudist/train/exchange.py: the interface, its clock and the bucketed mean)
is the code of the row of cpudist/strategies.py with its `name` (the row says what the planner, the
traffic model and the option checks need to know of it); defining it registers it. Local SGD lives
in local_sgd.py.

    ddp             DistributedDataParallel: buckets all-reduced during backward, through a comm
                    hook (fp32, bf16, fp16 or PowerSGD) that also times them; the word embedding
                    left to EmbeddingRows (only the rows the step touched),
                    unless --embedding-sync dense
    allreduce       after backward, one all-reduce of all gradients flattened
                    (the teaching baseline)
    gather-scatter  rank 0 gathers every gradient, averages, scatters the mean back
    local-sgd       each rank steps alone; parameters are averaged every K steps (bucketed), after
                    synchronous warm-up steps; with an outer Nesterov optimizer it is DiLoCo: the
                    averaged change since the last sync is applied by SGD with Nesterov momentum
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from cpudist.strategies import SyncSpec
from cpudist.train import powersgd
from cpudist.train.embedding_rows import EmbeddingRows
from cpudist.train.exchange import CommClock, Strategy, mean_
from cpudist.train.local_sgd import LocalSGD

__all__ = ["DDP", "AllReduce", "CommClock", "GatherScatter", "LocalSGD", "Strategy", "make",
           "named_shapes"]


class DDP(Strategy):
    """DistributedDataParallel with a timed comm hook; --grad-compression picks the hook."""

    name = "ddp"

    def __init__(self, model: torch.nn.Module, spec: SyncSpec, world: int) -> None:
        super().__init__(model, spec, world)
        self.rows = EmbeddingRows.of(model, spec, world)
        # DDP leaves it alone (its own broadcast at construction too: see EmbeddingRows)
        if self.rows is not None:
            torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
                model, [self.rows.name])
            # DDP's last bucket may now go out before backward reaches the embedding: the wait for
            # the buckets counts from whichever came later
            self.rows.weight.register_post_accumulate_grad_hook(self._embedding_ready)
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

    def _embedding_ready(self, weight: torch.Tensor) -> None:
        self.clock.ready()

    def skip(self) -> contextlib.AbstractContextManager[Any]:
        return self.model.no_sync()  # type: ignore[operator]

    def gradients(self, step: int) -> None:
        # the buckets went out during backward, which returned when they were done; then the
        # embedding's rows
        self.clock.overlap_done()
        if self.rows is not None:
            self.rows.mean(self.clock)
        self.clock.end_step(overlapped=False)

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
        # Error feedback needs a few plain steps first (PyTorch refuses start_powerSGD_iter <= 1
        # with it).
        state = powerSGD_hook.PowerSGDState(process_group=None,
                                            matrix_approximation_rank=spec.powersgd_rank,
                                            start_powerSGD_iter=max(2, spec.powersgd_start),
                                            use_error_feedback=True, warm_start=True)
        return state, powerSGD_hook.powerSGD_hook
    hooks = {"none": default_hooks.allreduce_hook, "bf16": default_hooks.bf16_compress_hook,
             "fp16": default_hooks.fp16_compress_hook}
    return None, hooks[spec.grad_compression]


def _in_order(hook: Callable[..., Any]) -> Callable[..., Any]:
    """Start a bucket's hook only when the previous bucket's has finished.

    PowerSGD's hook issues its later all-reduces (P, then Q) from callbacks, which gloo runs on its
    own threads, while the autograd thread hands over the next bucket: each rank then issues the
    buckets' collectives in its own interleaving, and gloo pairs mismatched ones ("Received data
    size doesn't match expected size", distilbert's 11 buckets on 2 and 4 hosts). Waiting costs the
    overlap of one bucket's compression with backward; its traffic is small.
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
    """The hook, noting when each bucket went out, when its mean came back, and its CPU work."""

    def timed(state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
        start = clock.started()
        with clock.work():  # the hook's casts and copies: on the training thread, in backward
            fut = hook(state, bucket)
        clock.ready()  # handed to the network as the hook returns: a wait for the wire starts

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
        mean_([p.grad for p in self.trained if p.grad is not None], self.world, self.clock)
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


def make(model: torch.nn.Module, spec: SyncSpec, world: int) -> Strategy:
    """The strategy object for this run (nothing to exchange on one rank)."""
    if world == 1:
        return Strategy(model, spec, world)
    return Strategy.registry[spec.strategy](model, spec, world)


def named_shapes(model: torch.nn.Module) -> Iterator[tuple[int, ...]]:
    """Shapes of the trained parameters, in the order DDP and the flattened exchanges see them."""
    return (tuple(p.shape) for p in model.parameters() if p.requires_grad)
