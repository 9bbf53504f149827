"""Length-grouped global batches: less padding, and the same batches whatever the world size.

Each epoch shuffles all rows (seeded), sorts them by length inside megabatches of 50 global
batches, cuts those into global batches and shuffles the batch order; rank r takes rows r, r+W,
... of every global batch. Because a global batch does not depend on how it is split, 1 rank x 32
and 2 ranks x 16 train on exactly the same data, step by step.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

MEGABATCH = 50  # global batches sorted together: enough to group lengths, small enough to stay random


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

    The cuts fall at multiples of `world`, so rank r's rows over the micro-batches of a step are its rows
    of the whole step batch: accumulating 2 micro-batches of B is the step of one batch of 2B. A (last)
    step batch too small to give every rank a row in every micro-batch is dropped.
    """
    out = []
    for b in batches:
        if len(b) < world * accum:
            continue
        units, _ = divmod(len(b), world)  # whole rows-for-every-rank, shared out as evenly as can be
        ends = [world * (units * (i + 1) // accum) for i in range(accum - 1)] + [len(b)]
        out += [b[start:end] for start, end in zip([0, *ends[:-1]], ends, strict=True)]
    return out


def rank_batches(batches: list[list[int]], rank: int, world: int) -> list[list[int]]:
    """This rank's share of each global batch that feeds every rank."""
    return [b[rank::world] for b in fed_batches(batches, world)]
