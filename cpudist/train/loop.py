"""The training loop, top to bottom: batches, autocast, DDP, AdamW with warmup, logging."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from cpudist.config import effective_lr, spec_of
from cpudist.flops import shape_of, training_flops
from cpudist.train import last_layer, netcount, preempt, speed, sync, trainer_choices
from cpudist.train.anatomy import StepLog
from cpudist.train.checkpoint import Restored
from cpudist.train.checkpoint_meta import START, Position
from cpudist.train.features import collate
from cpudist.train.keep import Evaluations
from cpudist.train.optim import clip_and_step, optimizer
from cpudist.train.preempt import StopRequests
from cpudist.train.report_to import Reporters
from cpudist.train.sampling import batch_plan, plan_steps
from cpudist.train.saver import Saver, Training, restore, save
from cpudist.train.setup import Job
from cpudist.train.steps_log import StepsLog
from cpudist.wire import events, names

WARMUP_STEPS_EXCLUDED = 3  # steady-state throughput leaves out the first steps (allocator warm-up)


@dataclass(kw_only=True)
class TrainStats:
    """What the loop measured; turned into the run's result by the caller.

    steps, samples, tokens, flops and train_time_s count every part of a resumed run; the per-step
    lists hold this part only (steady throughput is this part's).
    """

    steps: int = 0
    samples: int = 0  # global, over all ranks
    tokens: int = 0  # global real (unpadded) tokens
    flops: float = 0.0  # global model FLOPs of training (padding excluded)
    train_time_s: float = 0.0
    step_times: list[float] = field(default_factory=list)
    step_samples: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    checkpoints: list[str] = field(default_factory=list)  # written by this part
    stopped: str | None = None  # why the ranks stopped early (after a checkpoint), if they did
    # indexes of this part's steps that met a new shape (--compile)
    compiling: set[int] = field(default_factory=set)
    # how the ranks agreed (its clock holds this part's communication times)
    strategy: sync.Strategy | None = None
    # what this node's interface sent during this part's steps (one rank per node)
    tx_bytes: int | None = None
    anatomy: StepLog = field(default_factory=StepLog)  # where this part's steps went (anatomy.py)
    warmup_steps: int = 0  # of the lr schedule (--warmup-steps, or --warmup-ratio's share)
    membership: list[dict[str, Any]] = field(default_factory=list)  # --elastic (elastic.Change)

    def steady_samples_per_s(self) -> float:
        """Samples/s of the steps past the warm-up that compiled nothing (the wall time counts them
        all)."""
        k = WARMUP_STEPS_EXCLUDED if len(self.step_times) > 2 * WARMUP_STEPS_EXCLUDED else 0
        every = range(len(self.step_times))
        kept = [i for i in every if i >= k and i not in self.compiling] or list(every)
        t = sum(self.step_times[i] for i in kept)
        return sum(self.step_samples[i] for i in kept) / t if t > 0 else 0.0


def train(job: Job, saver: Saver, stop: StopRequests, restored: Restored | None = None,
          evals: Evaluations | None = None, report: Reporters | None = None) -> TrainStats:
    """Train the job's model (synced by its --sync strategy when world > 1) and return what was
    measured; `evals` evaluates every --eval-every steps (outside the steps' times); `report` gets
    steps and evaluations."""
    cfg, model, data, regression, bf16 = (job.cfg, job.model, job.train_data, job.regression,
                                          job.bf16)
    # iface: where this rank counts bytes sent
    rank, world, iface = job.info.rank, job.info.world_size, job.iface
    inner = getattr(model, "module", model)  # under DDP, the model it wraps
    shape = dataclasses.replace(shape_of(inner),
                                first_token_only_params=last_layer.first_token_only_params(inner))
    start = restored.meta.position if restored else START
    per_epoch, batches = batch_plan(cfg, data, rank, world, start, restored.meta.world_size
                                    if restored else None)
    total = restored.meta.total if restored else plan_steps(cfg, per_epoch)
    opt = optimizer(cfg, model, effective_lr(cfg, world))
    if cfg.ipex:
        model, opt = speed.use_ipex(model, opt, bf16)
    strategy = sync.make(model, spec_of(cfg, total), world)
    strategy.use(opt)
    model = strategy.model
    forward = speed.compiled(model) if cfg.compile else model
    multiple = speed.COMPILE_BUCKET if cfg.compile else 1
    sched = trainer_choices.scheduler(cfg, opt, total)
    stats = TrainStats(warmup_steps=trainer_choices.warmup_steps(cfg, total))
    stats.strategy = strategy
    live = Training(cfg=cfg, model=model, opt=opt, sched=sched, rank=rank, world=world, evals=evals)
    if restored:
        restore(restored, live, stats)
        strategy.load(restored.state.get("sync", {}), restored.rank_state)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)
    pending: list[Pending] = []
    shapes: set[tuple[int, ...]] = set()
    # a resumed run keeps the lines of the steps up to its checkpoint
    log = StepsLog(job.run_dir / names.STEPS, keep_through=stats.steps) if rank == 0 else None
    model.train()
    if rank == 0:
        events.emit(events.START, total=total, batches_per_epoch=per_epoch, step=stats.steps)
    last_save, next_pos = time.monotonic(), start
    tx_start = _counted(iface, world)  # after DDP's initial broadcast: only the training's traffic
    looped = time.perf_counter()  # the loop's wall clock: step_anatomy's step time
    try:
        while stats.steps < total:
            t0, waited, worked = time.perf_counter(), strategy.clock.exposed_s, strategy.clock.cpu_s
            micro_batches = [next(batches) for _ in range(cfg.grad_accum)]
            step_rows = sum(n for _, _, n in micro_batches)
            last = micro_batches[-1][0]
            # past an epoch's end: the iterator rolls over
            next_pos = Position(last.epoch, last.index + 1)
            loss_sum, n_local, tokens, flops = torch.zeros((), dtype=torch.float64), 0, 0, 0.0
            mine = sum(len(idx) for _, idx, _ in micro_batches)
            local = strategy.local_step(stats.steps + 1)
            for micro, (_, idx, _) in enumerate(micro_batches):
                batch = collate(data, idx, regression, multiple)
                if cfg.compile and tuple(batch["input_ids"].shape) not in shapes:
                    shapes.add(tuple(batch["input_ids"].shape))
                    # this step compiles (or loads) a graph
                    stats.compiling.add(len(stats.step_times))
                # Gradients are exchanged only after the last micro-batch of an accumulation.
                last_micro = micro == cfg.grad_accum - 1
                with (contextlib.nullcontext() if last_micro else strategy.skip()), autocast:
                    loss = forward(**batch).loss
                # Each row weighs 1/(rows of the global step) whatever its rank's share: the
                # exchange averages over ranks, so scale by world x local rows / global rows
                # (unequal last batches). A local step (local SGD) takes the mean over this rank's
                # rows.
                (loss * (len(idx) / mine if local else len(idx) * world / step_rows)).backward()
                loss_sum += loss.detach().double() * len(idx)
                n_local += len(idx)
                tokens += data.real_tokens(idx)
                flops += training_flops(shape, (len(data.input_ids[i]) for i in idx))
            with strategy.clock.work():
                strategy.gradients(stats.steps + 1)
            grad_norm = clip_and_step(model, opt, sched, cfg.max_grad_norm)
            with strategy.clock.work():
                strategy.parameters(stats.steps + 1)
            dt = time.perf_counter() - t0
            stats.anatomy.step(strategy.clock.exposed_s - waited, strategy.clock.cpu_s - worked)
            stats.steps += 1
            stats.train_time_s += dt
            stats.step_times.append(dt)
            pending.append(Pending(step=stats.steps, loss_sum=loss_sum, samples=n_local,
                                   tokens=tokens, flops=flops, dt=dt, lr=sched.get_last_lr()[0],
                                   grad_norm=grad_norm, waited=strategy.clock.exposed_s - waited))
            if stats.steps % cfg.log_every == 0 or stats.steps == total:
                flush(pending, stats, log, world, total, report)
                pending = []
            agreeing = time.perf_counter()
            stop_now, save_now = _agree(stop, saver, time.monotonic() - last_save, world)
            # where ranks meet on a step without an exchange (local SGD)
            stats.anatomy.agree(time.perf_counter() - agreeing)
            # Before the checkpoint, as HF's Trainer: it then holds this evaluation (a stop skips
            # it: time counts) --eval-strategy and --save-strategy: the same on every rank (the
            # batch plan is shared)
            epoch_end = any(pos.index == per_epoch - 1 for pos, _, _ in micro_batches)
            evaluated = not stop_now and evals is not None and evals.due(stats.steps, total,
                                                                         epoch_end)
            if evaluated and evals is not None:
                metrics, _ = evals.run(job, stats.steps, during=True)
                if report is not None:
                    report.log_eval(stats.steps, metrics)
            save_now = save_now or saver.due(stats.steps, evaluated, epoch_end,
                                             stats.steps < total)
            if save_now or stop_now:
                flush(pending, stats, log, world, total, report)
                pending = []
                save(saver, live, stats, next_pos, total)
                last_save = time.monotonic()
            if stop_now:
                stats.stopped = stop.pending() or preempt.PEER
                break
            if evals is not None and evals.stopped is not None:  # early stopping: every rank alike
                flush(pending, stats, log, world, total, report)
                break
        stats.anatomy.loop_s = time.perf_counter() - looped
        stats.anatomy.eval_s = sum(e["seconds"] for e in evals.history) if evals else 0.0
        # local SGD: evaluate (and keep) the ranks' mean
        strategy.parameters(stats.steps, final=True)
        tx_end = _counted(iface, world)
        if tx_start is not None and tx_end is not None:
            stats.tx_bytes = tx_end - tx_start
    finally:  # closed on every way out, errors included
        if log is not None:
            log.close()
    return stats


def _counted(iface: str | None, world: int) -> int | None:
    """The interface's sent bytes once every rank got here (so no peer's traffic straddles the
    reading)."""
    if world > 1:
        dist.barrier()
    return netcount.tx_bytes(iface)


@dataclass(kw_only=True, frozen=True)
class Pending:
    """One optimizer step as this rank saw it, held until the next log line sums it over the
    ranks."""

    step: int
    loss_sum: torch.Tensor  # this rank's, summed over its rows
    samples: int
    tokens: int
    flops: float
    dt: float  # the step's wall time
    lr: float
    grad_norm: float
    waited: float  # this rank's wait for the exchange in this step
    replicas: int | None = None  # --elastic: the nodes that trained the step
    at: float | None = None  # --elastic: when it was committed (Unix time)


def _agree(stop: StopRequests, saver: Saver, since_save_s: float,
           world: int) -> tuple[bool, bool]:
    """(stop, timed save) as every rank sees it: any rank's stop request, rank 0's clock for
    timed saves (the step rules: Saver.due)."""
    timed = saver.every_s is not None and since_save_s >= saver.every_s
    flags = torch.tensor([stop.pending() is not None, timed], dtype=torch.float32)
    if world > 1:
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return bool(flags[0]), bool(flags[1])


def flush(pending: list[Pending], stats: TrainStats,
           log: StepsLog | None, world: int, total: int, report: Reporters | None = None) -> None:
    """One all-reduce per logging interval gives the global loss, samples and tokens per step."""
    if not pending:
        return
    vec = torch.tensor([[float(p.loss_sum), p.samples, p.tokens, p.flops] for p in pending],
                       dtype=torch.float64)
    if world > 1:
        dist.all_reduce(vec)
    for p, (loss, samples, tokens, flops) in zip(pending, vec.tolist(), strict=True):
        loss /= samples  # the mean over every row of the global step, however ranks shared them
        stats.samples += int(samples)
        stats.tokens += int(tokens)
        stats.flops += flops
        stats.step_samples.append(int(samples))
        stats.losses.append(loss)
        if log is not None:
            line = {"step": p.step, "loss": loss, "lr": p.lr, "samples": int(samples),
                    "tokens": int(tokens), "step_time_s": p.dt, "grad_norm": p.grad_norm}
            elastic = {} if p.replicas is None else {"replicas": p.replicas, "time": p.at}
            log.add({**line, **elastic})
            # as HF's report_to names them; comm_share: rank 0's wait for the exchange
            if report is not None:
                report.log_step(p.step,
                                {"loss": loss, "learning_rate": p.lr, "grad_norm": p.grad_norm,
                                 "samples_per_s": samples / p.dt if p.dt else 0.0,
                                 "comm_share": p.waited / p.dt if p.dt else 0.0})
    if log is not None:
        log.flush()
        last = pending[-1]
        nodes = {} if last.replicas is None else {"nodes": last.replicas}
        events.emit(events.PROGRESS, step=last.step, total=total, loss=stats.losses[-1],
                    samples_per_s=stats.step_samples[-1] / last.dt if last.dt else 0.0, **nodes)
