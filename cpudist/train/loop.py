"""The training loop, top to bottom: batches, autocast, DDP, AdamW with warmup, logging."""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from cpudist.errors import BadInput
from cpudist.flops import ModelShape, training_flops
from cpudist.train import events
from cpudist.train.config import TrainConfig
from cpudist.train.features import Encoded, collate
from cpudist.train.sampling import global_batches, rank_batches

WARMUP_STEPS_EXCLUDED = 3  # steady-state throughput leaves out the first steps (allocator warm-up)


@dataclass
class TrainStats:
    """What the loop measured; turned into the run's result by the caller."""

    steps: int = 0
    samples: int = 0  # global, over all ranks
    tokens: int = 0  # global real (unpadded) tokens
    flops: float = 0.0  # global model FLOPs of training (padding excluded)
    train_time_s: float = 0.0
    step_times: list[float] = field(default_factory=list)
    step_samples: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)

    def steady_samples_per_s(self) -> float:
        k = WARMUP_STEPS_EXCLUDED if self.steps > 2 * WARMUP_STEPS_EXCLUDED else 0
        t = sum(self.step_times[k:])
        return sum(self.step_samples[k:]) / t if t > 0 else 0.0


def plan_steps(cfg: TrainConfig, batches_per_epoch: int) -> int:
    """Optimizer steps of the run: --max-steps, else epochs x (micro-batches / accumulation)."""
    if cfg.max_steps is not None:
        return cfg.max_steps
    return max(1, math.ceil(cfg.epochs * batches_per_epoch / cfg.grad_accum))


def batch_plan(cfg: TrainConfig, data: Encoded, rank: int, world: int) -> tuple[int, Iterator[list[int]]]:
    """(micro-batches per epoch, endless iterator of this rank's row indices per micro-batch)."""
    if cfg.sampler == "grouped":
        lengths = [len(ids) for ids in data.input_ids]
        per_epoch = len(rank_batches(global_batches(lengths, cfg.batch_size * world, cfg.seed, 0), rank, world))
        if per_epoch == 0:
            raise BadInput(f"{len(lengths)} training row(s) cannot feed {world} ranks",
                           "Use more data (--max-train-samples), or fewer ranks")

        def grouped() -> Iterator[list[int]]:
            epoch = 0
            while True:
                yield from rank_batches(global_batches(lengths, cfg.batch_size * world, cfg.seed, epoch), rank, world)
                epoch += 1

        return per_epoch, grouped()
    rows: Any = range(len(data))  # a sized, indexable dataset of row numbers
    sampler: DistributedSampler[int] = DistributedSampler(rows, num_replicas=world, rank=rank,
                                                          shuffle=True, seed=cfg.seed)
    loader: DataLoader[int] = DataLoader(rows, batch_size=cfg.batch_size, sampler=sampler, collate_fn=list)

    def shuffled() -> Iterator[list[int]]:
        epoch = 0
        while True:
            sampler.set_epoch(epoch)  # a new seeded shuffle each epoch, identical on every rank
            yield from loader
            epoch += 1

    return len(loader), shuffled()


def train(cfg: TrainConfig, model: torch.nn.Module, data: Encoded, regression: bool,
          bf16: bool, run_dir: Path, rank: int, world: int, shape: ModelShape) -> TrainStats:
    """Train `model` (already wrapped in DDP) and return what was measured."""
    per_epoch, batches = batch_plan(cfg, data, rank, world)
    total = plan_steps(cfg, per_epoch)
    opt = _optimizer(cfg, model)
    from transformers import get_linear_schedule_with_warmup

    sched = get_linear_schedule_with_warmup(opt, int(cfg.warmup_ratio * total), total)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)
    stats, pending = TrainStats(), []
    log = (run_dir / "steps.jsonl").open("w") if rank == 0 else None
    model.train()
    if rank == 0:
        events.emit("start", total=total, batches_per_epoch=per_epoch)
    try:
        while stats.steps < total:
            t0 = time.perf_counter()
            loss_sum, n_local, tokens, flops = torch.zeros(()), 0, 0, 0.0
            for micro in range(cfg.grad_accum):
                idx = next(batches)
                batch = collate(data, idx, regression)
                # Gradients are all-reduced only on the last micro-batch of an accumulation.
                sync = micro == cfg.grad_accum - 1 or not hasattr(model, "no_sync")
                with (contextlib.nullcontext() if sync else model.no_sync()), autocast:  # type: ignore[operator]
                    loss = model(**batch).loss
                (loss / cfg.grad_accum).backward()
                loss_sum += loss.detach().float() / cfg.grad_accum
                n_local += len(idx)
                tokens += data.real_tokens(idx)
                flops += training_flops(shape, (len(data.input_ids[i]) for i in idx))
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            dt = time.perf_counter() - t0
            stats.steps += 1
            stats.train_time_s += dt
            stats.step_times.append(dt)
            pending.append((stats.steps, loss_sum, n_local, tokens, flops, dt, sched.get_last_lr()[0]))
            if stats.steps % cfg.log_every == 0 or stats.steps == total:
                _flush(pending, stats, log, world, total)
                pending = []
    finally:  # closed on every way out, errors included
        if log is not None:
            log.close()
    return stats


def _optimizer(cfg: TrainConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 or "LayerNorm" in name or "bias" in name else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    # Fused AdamW: one kernel over all parameters, 80 -> 19 ms a step for MiniLM (benchmarks/README.md).
    return torch.optim.AdamW(groups, lr=cfg.lr, fused=True)


def _flush(pending: list[tuple[int, torch.Tensor, int, int, float, float, float]], stats: TrainStats,
           log: TextIO | None, world: int, total: int) -> None:
    """One all-reduce per logging interval gives the global loss, samples and tokens per step."""
    vec = torch.tensor([[float(p[1]), p[2], p[3], p[4]] for p in pending], dtype=torch.float64)
    if world > 1:
        dist.all_reduce(vec)
    for (step, _, _, _, _, dt, lr), (loss, samples, tokens, flops) in zip(pending, vec.tolist(), strict=True):
        loss /= world
        stats.samples += int(samples)
        stats.tokens += int(tokens)
        stats.flops += flops
        stats.step_samples.append(int(samples))
        stats.losses.append(loss)
        if log is not None:
            log.write(json.dumps({"step": step, "loss": loss, "lr": lr, "samples": int(samples),
                                  "tokens": int(tokens), "step_time_s": dt}) + "\n")
    if log is not None:
        log.flush()
        last = pending[-1]
        events.emit("progress", step=last[0], total=total, loss=stats.losses[-1],
                    samples_per_s=stats.step_samples[-1] / last[5] if last[5] else 0.0)
