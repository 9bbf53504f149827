"""Checkpoints: everything a run needs to go on exactly where it stopped, written so that none is
half.

    <checkpoint dir>/step-000040/state.pt    model, optimizer, scheduler (rank 0's), the sync's
                                             shared state
                                rng.pt      every rank's torch/python/numpy RNG state
                                            (numpy's as a dict and a tensor)
                                ranks.pt    every rank's own sync state: local SGD's model and AdamW
                                            moments between averages, PowerSGD's error feedback
                                            (format 2 on)
                                meta.json   a CheckpointMeta (cpudist/train/checkpoint_meta.py,
                                            with the names): step, sampler position, batch layout,
                                            time so far, file sizes and sha256
                                COMPLETE    written last

A checkpoint is written as `step-N.tmp/` and renamed when complete, so a crash mid-write leaves
nothing that resume would pick; a file damaged afterwards (truncated, edited) fails its sha256 and
resume falls back to the previous checkpoint, saying so. The .pt files come from --resume PATH or an
object store, so they are read with torch's safe unpickler (weights_only=True: tensors, dicts,
lists, tuples, numbers, strings, None; no code runs): everything written into them is of those
types, no other type is allowed (format 3 on; a checkpoint of an earlier format is refused in one
line before it is read). Only rank 0 writes and only rank 0 reads: the ranks on other nodes send and
get the bytes over the process group (each rank only its own part of ranks.pt).
"""

from __future__ import annotations

import errno
import io
import pickle
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist

from cpudist.errors import BadInput, JobFailed
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
    rank_state: dict[str, Any] | None = None  # this rank's own sync state; None: another world size


def rng_state() -> dict[str, Any]:
    """This process's RNG states, of types the safe unpickler takes (numpy's own tuple holds an
    ndarray)."""
    kind, keys, pos, has_gauss, gauss = cast(tuple[str, np.ndarray, int, int, float],
                                             np.random.get_state())
    numpy = {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
             "has_gauss": int(has_gauss), "gauss": float(gauss)}
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": numpy}


def seed_all(seed: int) -> None:
    """Seed torch, python and numpy (numpy takes 32 bits)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["gauss"]))


def write(folder: Path, state: dict[str, Any], rngs: list[dict[str, Any]], meta: CheckpointMeta,
          keep: int, ranks: list[dict[str, Any]] | None = None) -> Path:
    """Write the checkpoint of step `meta.step` atomically, then remove all but the run's newest
    `keep` (rank 0 only; cpudist/train/checkpoint.rotate).

    `ranks`: every rank's own sync state, in rank order; meta's `rank_state` says whether any rank
    has one.
    """
    final = folder / folder_name(meta.step)
    tmp = folder / f"{final.name}{TMP}"
    shutil.rmtree(tmp, ignore_errors=True)  # a leftover of a write that crashed
    ranks = ranks if ranks is not None else [{} for _ in rngs]
    try:
        tmp.mkdir(parents=True)
        torch.save(state, tmp / "state.pt")
        torch.save(rngs, tmp / "rng.pt")
        torch.save(ranks, tmp / "ranks.pt")
        write_meta(tmp, meta.written({n: file_sum(tmp / n) for n in FILES}, any(ranks)))
        (tmp / COMPLETE).write_text("")
    # torch.save reports a full disk as "basic_ios::clear: iostream error"
    except (OSError, RuntimeError) as e:
        why = _write_failure(e, folder)
        # half a checkpoint is none; the complete older ones stay
        shutil.rmtree(tmp, ignore_errors=True)
        raise JobFailed(f"could not write checkpoint {final.name} in {folder}: {why}",
                        "Free space there (or give --checkpoint-dir elsewhere), then go on from "
                        "the last complete checkpoint with --resume auto") from None
    shutil.rmtree(final, ignore_errors=True)  # the same step written again after a resume
    tmp.rename(final)
    rotate(folder, meta, keep)
    return final


def _write_failure(error: OSError | RuntimeError, folder: Path) -> str:
    """Why a checkpoint could not be written, in words: a full disk named as such whatever layer
    reported it."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        free = None
    if getattr(error, "errno", None) == errno.ENOSPC or (free is not None and free < 1 << 20):
        return ("no space left on the device "
                f"({free // (1 << 20) if free is not None else '?'} MiB free)")
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def rotate(folder: Path, meta: CheckpointMeta, keep: int) -> None:
    """Keep the checkpoint just written and the run's newest `keep - 1` older ones; another run's
    checkpoints, and any of a newer step (a timeline a resume abandoned), are not this rotation's to
    delete."""
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
    """Rank 0 reads the checkpoint at `path` (None on other ranks), every rank gets its part;
    BadInput on every rank alike for a file that holds anything but tensors and plain data."""
    found = broadcast(str(path) if path is not None else None, rank, world)
    if found is None:
        return None
    raw = (Path(found) / "state.pt").read_bytes() if rank == 0 else None
    rngs_raw = (Path(found) / "rng.pt").read_bytes() if rank == 0 else None
    meta = raw_meta(Path(found)) if rank == 0 else None
    parts, refused = _read_ranks(Path(found)) if rank == 0 else (None, None)
    raw, rngs_raw, meta, refused = broadcast((raw, rngs_raw, meta, refused), rank, world)
    # on every rank: a meta it cannot take fails them all alike
    restored = CheckpointMeta.from_dict(meta, found)
    if refused is not None:
        raise BadInput(refused, UNSAFE)
    state = _safe_load(raw, found, "state.pt")
    rngs = _safe_load(rngs_raw, found, "rng.pt")
    same = len(rngs) == world
    return Restored(found, restored, state, rngs[rank] if same else None,
                    _scatter_ranks(parts, rank, world) if same else None)


UNSAFE = ("cpudist writes only tensors and plain data there: resume from a checkpoint you trust, "
          "or start over")


def _safe_load(raw: bytes, where: str, name: str) -> Any:
    """A .pt file's content through torch's safe unpickler: BadInput for anything it refuses
    (nothing is run)."""
    try:
        return torch.load(io.BytesIO(raw), weights_only=True)
    except pickle.UnpicklingError as e:
        raise BadInput(f"checkpoint {where}: {name} holds more than tensors and plain data, "
                       f"refused unread ({_refusal(str(e))})", UNSAFE) from None


def _refusal(text: str) -> str:
    """torch's reason in its long weights_only message (what it would not load), without its
    advice."""
    after = text.split("WeightsUnpickler error:",
                       1)[-1] if "WeightsUnpickler error:" in text else ""
    lines = [line.strip() for line in after.splitlines()] + [
        line.strip() for line in text.splitlines() if "unsupported" in line.lower()]
    reason = next((line for line in lines if line), "the safe unpickler refused it")
    return reason.split(". ")[0].rstrip(".")[:200]


def _read_ranks(path: Path) -> tuple[list[Any] | None, str | None]:
    """(every rank's part of ranks.pt, None) or (None, why it is refused); rank 0 only."""
    try:
        return _safe_load((path / "ranks.pt").read_bytes(), str(path), "ranks.pt"), None
    except BadInput as e:
        return None, e.what


def _scatter_ranks(parts: list[Any] | None, rank: int, world: int) -> dict[str, Any] | None:
    """This rank's part of ranks.pt (rank 0 sends each rank its own)."""
    if world == 1:
        return parts[0] if parts else None
    box: list[Any] = [None]
    dist.scatter_object_list(box, parts, src=0)
    return box[0]
