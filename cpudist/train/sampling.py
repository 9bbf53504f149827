"""Length-grouped global batches: less padding, and the same batches whatever the world size.

Each epoch shuffles all rows (seeded), sorts them by length inside megabatches of 50 global
batches, cuts those into global batches and shuffles the batch order; rank r takes rows r, r+W,
... of every global batch. Because a global batch does not depend on how it is split, 1 rank x 32
and 2 ranks x 16 train on exactly the same data, step by step.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from typing import Any

from torch.utils.data import DataLoader, DistributedSampler

from cpudist.config import TrainConfig
from cpudist.errors import BadInput
from cpudist.train.checkpoint_meta import START, Position
from cpudist.train.features import Encoded

# global batches sorted together: enough to group lengths, small enough to stay random
MEGABATCH = 50


def global_batches(lengths: Sequence[int], global_batch: int, seed: int, epoch: int,
                   grouped: bool = True) -> list[list[int]]:
    """Row indices of every global batch of one epoch."""
    rng = random.Random(seed * 1_000_003 + epoch)
    rows = list(range(len(lengths)))
    rng.shuffle(rows)
    if not grouped:
        return [rows[i:i + global_batch] for i in range(0, len(rows), global_batch)]
    mega = global_batch * MEGABATCH
    batches = []
    for start in range(0, len(rows), mega):
        chunk = sorted(rows[start:start + mega], key=lambda r: -lengths[r])
        batches += [chunk[i:i + global_batch] for i in range(0, len(chunk), global_batch)]
    rng.shuffle(batches)
    return batches


def fed_batches(batches: list[list[int]], world: int, accum: int = 1) -> list[list[int]]:
    """Each global step batch as `accum` micro-batches that every rank gets a share of.

    The cuts fall at multiples of `world`, so rank r's rows over the micro-batches of a step are its
    rows of the whole step batch: accumulating 2 micro-batches of B is the step of one batch of 2B.
    A (last) step batch too small to give every rank a row in every micro-batch is dropped.
    """
    out = []
    for b in batches:
        if len(b) < world * accum:
            continue
        # whole rows-for-every-rank, shared out as evenly as can be
        units, _ = divmod(len(b), world)
        ends = [world * (units * (i + 1) // accum) for i in range(accum - 1)] + [len(b)]
        out += [b[start:end] for start, end in zip([0, *ends[:-1]], ends, strict=True)]
    return out


def rank_batches(batches: list[list[int]], rank: int, world: int) -> list[list[int]]:
    """This rank's share of each global batch that feeds every rank."""
    return [b[rank::world] for b in fed_batches(batches, world)]


def plan_steps(cfg: TrainConfig, batches_per_epoch: int) -> int:
    """Optimizer steps of the run: --max-steps, else epochs x (micro-batches / accumulation)."""
    if cfg.max_steps is not None:
        return cfg.max_steps
    return max(1, math.ceil(cfg.epochs * batches_per_epoch / cfg.grad_accum))


# (where it sits, this rank's rows, rows of the global batch)
Batch = tuple[Position, list[int], int]


def position_on(start: Position, batches: list[list[int]], was: int, now: int,
                accum: int) -> Position:
    """`start`, a micro-batch index into an epoch's global `batches` as fed to `was` ranks, as the
    index of the same place fed to `now` ranks: a step batch too small for one world but not the
    other (fed_batches drops it) would otherwise shift every later index by a step, and a resume on
    another world size would skip or repeat one."""
    fed = kept = 0
    for b in batches:
        if fed >= start.index:
            break
        fed += accum if len(b) >= was * accum else 0
        kept += accum if len(b) >= now * accum else 0
    return Position(start.epoch, kept)


def batch_plan(cfg: TrainConfig, data: Encoded, rank: int, world: int,
               start: Position = START, was: int | None = None) -> tuple[int, Iterator[Batch]]:
    """(micro-batches per epoch, endless iterator of this rank's micro-batches from `start` on);
    `was`: the world size that `start` was counted on (a checkpoint's), when it differs from
    `world`."""
    if cfg.sampler == "grouped":
        lengths = [len(ids) for ids in data.input_ids]
        # grouped per step: --grad-accum changes no step
        step_rows = cfg.batch_size * world * cfg.grad_accum

        def epoch_batches(epoch: int) -> list[list[int]]:
            return fed_batches(global_batches(lengths, step_rows, cfg.seed, epoch), world,
                               cfg.grad_accum)

        per_epoch = len(epoch_batches(0))
        if per_epoch == 0:
            raise BadInput(f"{len(lengths)} training row(s) cannot feed {world} ranks",
                           "Use more data (--max-train-samples), or fewer ranks")
        if was is not None and was != world:
            start = position_on(start, global_batches(lengths, step_rows, cfg.seed, start.epoch),
                                was, world, cfg.grad_accum)

        def grouped() -> Iterator[Batch]:
            epoch, skip = start.epoch, start.index
            while True:
                for i, b in enumerate(epoch_batches(epoch)):
                    if i >= skip:
                        yield Position(epoch, i), b[rank::world], len(b)
                epoch, skip = epoch + 1, 0

        return per_epoch, grouped()
    rows: Any = range(len(data))  # a sized, indexable dataset of row numbers
    sampler: DistributedSampler[int] = DistributedSampler(rows, num_replicas=world, rank=rank,
                                                          shuffle=True, seed=cfg.seed)
    loader: DataLoader[int] = DataLoader(rows, batch_size=cfg.batch_size, sampler=sampler,
                                         collate_fn=list)

    def shuffled() -> Iterator[Batch]:
        epoch, skip = start.epoch, start.index
        while True:
            sampler.set_epoch(epoch)  # a new seeded shuffle each epoch, identical on every rank
            for i, idx in enumerate(loader):
                if i >= skip:  # the sampler pads to equal shares: every rank has len(idx) rows
                    yield Position(epoch, i), idx, len(idx) * world
            epoch, skip = epoch + 1, 0

    return len(loader), shuffled()
