"""Checkpoints: everything a run needs to go on exactly where it stopped, written so that none is half.

    <checkpoint dir>/step-000040/state.pt    model, optimizer, scheduler (rank 0's), the sync's shared state
                                rng.pt      every rank's torch/python/numpy RNG state
                                ranks.pt    every rank's own sync state: local SGD's model and AdamW moments
                                            between averages, PowerSGD's error feedback (format 2 on)
                                meta.json   a CheckpointMeta (cpudist/train/checkpoint_meta.py, with the names):
                                            step, sampler position, batch layout, time so far, file sizes and sha256
                                COMPLETE    written last

A checkpoint is written as `step-N.tmp/` and renamed when complete, so a crash mid-write leaves
nothing that resume would pick; a file damaged afterwards (truncated, edited) fails its sha256 and
resume falls back to the previous checkpoint, saying so. Only rank 0 writes and only rank 0 reads:
the ranks on other nodes send and get the bytes over the process group (each rank only its own part
of ranks.pt).
"""

from __future__ import annotations

import io
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from cpudist.train.checkpoint_meta import (
    COMPLETE,
    TMP,
    CheckpointMeta,
    complete_checkpoints,
    file_sum,
    folder_name,
    owner,
    raw_meta,
    same_run,
    step_of,
    write_meta,
)

FILES = ("state.pt", "rng.pt", "ranks.pt")


@dataclass(frozen=True)
class Restored:
    """A checkpoint as loaded on one rank."""

    path: str
    meta: CheckpointMeta
    state: dict[str, Any]  # model, optimizer, scheduler
    rng: dict[str, Any] | None  # this rank's RNG state; None when the world size changed
    rank_state: dict[str, Any] | None = None  # this rank's own sync state; None: format 1 or another world size


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def seed_all(seed: int) -> None:
    """Seed torch, python and numpy (numpy takes 32 bits)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def write(folder: Path, state: dict[str, Any], rngs: list[dict[str, Any]], meta: CheckpointMeta,
          keep: int, ranks: list[dict[str, Any]] | None = None) -> Path:
    """Write the checkpoint of step `meta.step` atomically, then remove all but the run's newest `keep`
    (rank 0 only; cpudist/train/checkpoint.rotate).

    `ranks`: every rank's own sync state, in rank order; meta's `rank_state` says whether any rank has one.
    """
    final = folder / folder_name(meta.step)
    tmp = folder / f"{final.name}{TMP}"
    shutil.rmtree(tmp, ignore_errors=True)  # a leftover of a write that crashed
    tmp.mkdir(parents=True)
    ranks = ranks if ranks is not None else [{} for _ in rngs]
    torch.save(state, tmp / "state.pt")
    torch.save(rngs, tmp / "rng.pt")
    torch.save(ranks, tmp / "ranks.pt")
    write_meta(tmp, meta.written({n: file_sum(tmp / n) for n in FILES}, any(ranks)))
    (tmp / COMPLETE).write_text("")
    shutil.rmtree(final, ignore_errors=True)  # the same step written again after a resume
    tmp.rename(final)
    rotate(folder, meta, keep)
    return final


def rotate(folder: Path, meta: CheckpointMeta, keep: int) -> None:
    """Keep the checkpoint just written and the run's newest `keep - 1` older ones; another run's checkpoints, and any
    of a newer step (a timeline a resume abandoned), are not this rotation's to delete."""
    older = [p for p in complete_checkpoints(folder)
             if (step_of(p.name) or 0) < meta.step and same_run(owner(p), meta.run_id)]
    for old in older[max(keep - 1, 0):]:
        shutil.rmtree(old, ignore_errors=True)


def gather_rngs(world: int) -> list[dict[str, Any]]:
    """Every rank's RNG state, in rank order (a collective: every rank calls it)."""
    mine = rng_state()
    if world == 1:
        return [mine]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, mine)
    return out


def gather_ranks(mine: dict[str, Any], rank: int, world: int) -> list[dict[str, Any]] | None:
    """Every rank's own state, in rank order, on rank 0 (None elsewhere; a collective)."""
    if world == 1:
        return [mine]
    out: list[Any] | None = [None] * world if rank == 0 else None
    dist.gather_object(mine, out, dst=0)
    return out


def broadcast(value: Any, rank: int, world: int) -> Any:
    """Rank 0's `value` on every rank."""
    if world == 1:
        return value
    box = [value if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def load(path: Path | None, rank: int, world: int) -> Restored | None:
    """Rank 0 reads the checkpoint at `path` (None on other ranks), every rank gets its part."""
    found = broadcast(str(path) if path is not None else None, rank, world)
    if found is None:
        return None
    raw = (Path(found) / "state.pt").read_bytes() if rank == 0 else None
    rngs_raw = (Path(found) / "rng.pt").read_bytes() if rank == 0 else None
    meta = raw_meta(Path(found)) if rank == 0 else None
    raw, rngs_raw, meta = broadcast((raw, rngs_raw, meta), rank, world)
    restored = CheckpointMeta.from_dict(meta, found)  # on every rank: a meta it cannot take fails them all alike
    state = torch.load(io.BytesIO(raw), weights_only=False)
    rngs = torch.load(io.BytesIO(rngs_raw), weights_only=False)
    same = len(rngs) == world
    return Restored(found, restored, state, rngs[rank] if same else None,
                    _scatter_ranks(Path(found), rank, world) if same else None)


def _scatter_ranks(path: Path, rank: int, world: int) -> dict[str, Any] | None:
    """This rank's part of ranks.pt (rank 0 reads it and sends each rank its own; None: format 1)."""
    parts: list[Any] | None = None
    if rank == 0:
        have = (path / "ranks.pt").is_file()
        parts = torch.load(path / "ranks.pt", weights_only=False) if have else [None] * world
    if world == 1:
        return parts[0] if parts else None
    box: list[Any] = [None]
    dist.scatter_object_list(box, parts, src=0)
    return box[0]
