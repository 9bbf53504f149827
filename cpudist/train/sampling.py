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


def fed_batches(batches: list[list[int]], world: int) -> list[list[int]]:
    """The global batches every rank gets a share of: a last batch too small to feed every rank is dropped."""
    return [b for b in batches if len(b) >= world]


def rank_batches(batches: list[list[int]], rank: int, world: int) -> list[list[int]]:
    """This rank's share of each global batch that feeds every rank."""
    return [b[rank::world] for b in fed_batches(batches, world)]
