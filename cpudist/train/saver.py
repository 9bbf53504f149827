"""When and where checkpoints are written during training, and how a loaded one is put back.

The loop calls `save` at the steps every rank agreed on (rank 0 writes, with every rank's RNG and
own sync state, then copies it to the durable mirror) and `restore` once, before the first step of a
resumed part. The best evaluation so far goes with each checkpoint (its step and metrics in the
meta; for --save-model best, its weights in state.pt when they are not the model's own), so a
resumed run keeps the best over all its parts.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from cpudist.config import TrainConfig
from cpudist.errors import BadInput
from cpudist.train import checkpoint, trainer_choices
from cpudist.train.checkpoint import Restored, gather_rngs, seed_all, set_rng_state
from cpudist.train.checkpoint_meta import CheckpointMeta, Done, Position
from cpudist.train.durable import Mirror, copy_or_warn
from cpudist.wire import events

if TYPE_CHECKING:
    from cpudist.train.keep import Evaluations
    from cpudist.train.loop import TrainStats

# state.pt's key for the best evaluation's weights (--save-model best, when not the model's)
BEST = "best_model"
PATIENCE = "early_stopping"  # state.pt's key for early stopping's count (Evaluations.stale)
ELASTIC = "elastic"  # state.pt's key for an elastic node's Training.elastic


@dataclass(kw_only=True, frozen=True)
class Saver:
    """Where and when checkpoints go."""

    folder: Path
    every: int | None
    every_s: float | None
    keep: int
    mirror: Mirror | None = None  # the durable copy (--checkpoint-s3)
    wall_before_s: float = 0.0  # wall time of the earlier parts of a resumed run
    parts: int = 1
    started: float = field(default_factory=time.perf_counter)  # this part's start (perf_counter)
    strategy: str = "steps"  # --save-strategy

    def due(self, step: int, evaluated: bool, epoch_end: bool, before_end: bool) -> bool:
        """A checkpoint after `step`, the same on every rank and node: --checkpoint-every, or
        --save-strategy's evaluation or epoch end. The timed rule (every_s) is rank 0's clock,
        which the loop agrees on."""
        return ((self.every is not None and step % self.every == 0)
                or trainer_choices.save_due(self.strategy, evaluated, epoch_end, before_end))


@dataclass(kw_only=True, frozen=True)
class Training:
    """What a checkpoint is taken of, and put back into, on one rank."""

    cfg: TrainConfig
    model: torch.nn.Module  # the strategy's (DDP's wrapper, or the model itself)
    opt: torch.optim.Optimizer
    sched: Any
    rank: int
    world: int
    # the run's evaluations: the best one goes with each checkpoint
    evals: Evaluations | None = None
    # --elastic: the quorum's step and the membership so far (state.pt's ELASTIC)
    elastic: dict[str, Any] | None = None


def restore(restored: Restored, t: Training, stats: TrainStats) -> None:
    """Put a checkpoint's state into the model, optimizer, scheduler, RNGs and counters."""
    model = getattr(t.model, "module", t.model)
    check_same_weights(restored.state["model"], model.state_dict(), restored.path)
    model.load_state_dict(restored.state["model"])
    t.opt.load_state_dict(restored.state["optimizer"])
    t.sched.load_state_dict(restored.state["scheduler"])
    if restored.rng is not None:
        set_rng_state(restored.rng)
    else:  # another world size: no saved state belongs to this rank; fresh noise, still per rank
        seed_all(t.cfg.seed + t.rank + 1_000_003 * restored.meta.step)
    done = restored.meta.stats
    stats.steps, stats.samples, stats.tokens = done.steps, done.samples, done.tokens
    stats.flops, stats.train_time_s = done.flops, done.train_time_s
    if t.evals is not None:
        restore_best(restored, t.evals)
        t.evals.stale = int(restored.state.get(PATIENCE, 0))


def check_same_weights(saved: dict[str, Any], mine: dict[str, Any], path: str) -> None:
    """Refuse, in one line, a checkpoint whose model has other weights than this run's: another
    model, or LoRA adapters on other modules (the config check cannot see what a default
    --lora-targets meant when it was written)."""
    missing, extra = sorted(set(mine) - set(saved)), sorted(set(saved) - set(mine))
    shaped = sorted(k for k in set(mine) & set(saved)
                    if tuple(mine[k].shape) != tuple(saved[k].shape))
    if missing or extra or shaped:
        kinds = ((missing, "weights of this model are not in it"),
                 (extra, "of its weights are not in this model"),
                 (shaped, "of its weights have other shapes"))
        said = "; ".join(f"{len(names)} {what} (e.g. {names[0]})" for names, what in kinds if names)
        raise BadInput(f"checkpoint {path} holds another model: {said}",
                       "Resume with the --model, --peft and --lora-* options of the run that "
                       "wrote it (a LoRA run from before 2026-11-27 without --lora-targets "
                       "adapted query,value: add --lora-targets query,value)")


def restore_best(restored: Restored, evals: Evaluations) -> None:
    """The earlier parts' best evaluation (and, for --save-model best, its weights) as this part's
    best so far; nothing when the checkpoint has no best, or lacks the weights this part would need
    (written with another --save-model): the best is then this part's own."""
    best = restored.meta.best
    if best is None:
        return
    state = restored.state.get(BEST)
    if state is None and best["step"] == restored.meta.step:
        state = restored.state["model"]  # evaluated at the checkpoint's step: the model is the best
    if evals.keep_best and state is None:
        return
    evals.best = best
    evals.best_state = {k: v.clone() for k,
                        v in state.items()} if evals.keep_best and state is not None else None


def save(saver: Saver, t: Training, stats: TrainStats, pos: Position, total: int) -> None:
    """Write a checkpoint (rank 0), with every rank's RNG and own sync state; every rank calls
    it."""
    cfg, rank, world = t.cfg, t.rank, t.world
    rngs = gather_rngs(world)
    ranks = checkpoint.gather_ranks(stats.strategy.rank_state() if stats.strategy else {}, rank,
                                    world)
    if rank == 0:
        state = {"model": getattr(t.model, "module", t.model).state_dict(),
                 "optimizer": t.opt.state_dict(),
                 "scheduler": t.sched.state_dict(), "sync": stats.strategy.state()
                 if stats.strategy else {}}
        best = t.evals.best if t.evals is not None else None
        if (t.evals is not None and t.evals.best_state is not None and best is not None
                and best["step"] != stats.steps):
            state[BEST] = t.evals.best_state
        if t.evals is not None:
            state[PATIENCE] = t.evals.stale
        if t.elastic is not None:
            state[ELASTIC] = t.elastic
        meta = CheckpointMeta(config=dataclasses.asdict(cfg), total=total, position=pos,
                              world_size=world, global_batch=cfg.batch_size
                              * cfg.grad_accum * world,
                              sync=stats.strategy.spec.label if stats.strategy else "ddp",
                              parts=saver.parts,
                              wall_s=saver.wall_before_s + time.perf_counter() - saver.started,
                              stats=Done(stats.steps, stats.samples, stats.tokens, stats.flops,
                                   stats.train_time_s),
                              step=stats.steps, run_id=cfg.run_id, best=best)
        events.emit(events.SAVING, step=stats.steps)  # a stop waits for this checkpoint to be whole
        path = checkpoint.write(saver.folder, state, rngs, meta, saver.keep, ranks)
        if saver.mirror is not None and (warning := copy_or_warn(saver.mirror, path, saver.keep)):
            # one write: launchers interleave partial writes
            sys.stderr.write(f"[cpudist] {warning}\n")
            sys.stderr.flush()
        stats.checkpoints.append(str(path))
        events.emit(events.CHECKPOINT, step=stats.steps, path=str(path))
    if world > 1:
        dist.barrier()  # nobody runs ahead (or leaves) before the checkpoint is complete
