"""Checkpoints: everything a run needs to go on exactly where it stopped, written so that none is half.

    <checkpoint dir>/step-000040/state.pt    model, optimizer, scheduler (rank 0's), the sync's shared state
                                rng.pt      every rank's torch/python/numpy RNG state
                                ranks.pt    every rank's own sync state: local SGD's model and AdamW moments
                                            between averages, PowerSGD's error feedback (format 2 on)
                                meta.json   step, sampler position, batch layout, time so far, file sizes and sha256
                                COMPLETE    written last

A checkpoint is written as `step-N.tmp/` and renamed when complete, so a crash mid-write leaves
nothing that resume would pick; a file damaged afterwards (truncated, edited) fails its sha256 and
resume falls back to the previous checkpoint, saying so. Only rank 0 writes and only rank 0 reads:
the ranks on other nodes send and get the bytes over the process group (each rank only its own part
of ranks.pt).
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from cpudist.errors import BadInput

COMPLETE = "COMPLETE"
NAME = re.compile(r"^step-(\d+)$")
FORMAT = 2  # 2: ranks.pt added (a format 1 checkpoint still resumes, as inexactly as it did)
# What must match for a checkpoint to continue a run: another model or data order is another run.
SAME_RUN = ("task", "model", "seed", "sampler", "max_seq_len", "max_train_samples")


@dataclass(frozen=True)
class Position:
    """Where the data stream stands: the next micro-batch is batch `index` of `epoch`."""

    epoch: int
    index: int


START = Position(0, 0)


@dataclass(frozen=True)
class Restored:
    """A checkpoint as loaded on one rank."""

    path: str
    meta: dict[str, Any]
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


def step_of(path: Path) -> int:
    m = NAME.match(path.name)
    return int(m.group(1)) if m else -1


def complete_checkpoints(folder: Path) -> list[Path]:
    """Complete checkpoints in `folder`, newest first."""
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if NAME.match(p.name) and (p / COMPLETE).is_file()]
    return sorted(found, key=step_of, reverse=True)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def damage(path: Path) -> str | None:
    """What is wrong with a checkpoint folder, or None when every file is as written."""
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, ValueError) as e:
        return f"meta.json is unreadable ({e})"
    for name, want in meta.get("files", {}).items():
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != want["bytes"]:
            return f"{name} has {f.stat().st_size} bytes, {want['bytes']} were written"
        if _sha256(f) != want["sha256"]:
            return f"{name} does not match its sha256"
    return None


def choose(folder: Path, say: Callable[[str], None]) -> Path | None:
    """The newest undamaged checkpoint in `folder`; each damaged newer one is named and skipped."""
    skipped: list[str] = []
    for path in complete_checkpoints(folder):
        problem = damage(path)
        if problem is None:
            if skipped:
                say(f"resuming from {path.name} instead: {'; '.join(skipped)}")
            return path
        skipped.append(f"{path.name} is damaged ({problem})")
    if skipped:
        say(f"no usable checkpoint in {folder}: {'; '.join(skipped)}")
    return None


def write(folder: Path, step: int, state: dict[str, Any], rngs: list[dict[str, Any]], meta: dict[str, Any],
          keep: int, ranks: list[dict[str, Any]] | None = None) -> Path:
    """Write one checkpoint atomically, then remove all but the newest `keep` (rank 0 only).

    `ranks`: every rank's own sync state, in rank order; meta's `rank_state` says whether any rank has one.
    """
    final = folder / f"step-{step:06d}"
    tmp = folder / f"{final.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)  # a leftover of a write that crashed
    tmp.mkdir(parents=True)
    ranks = ranks if ranks is not None else [{} for _ in rngs]
    torch.save(state, tmp / "state.pt")
    torch.save(rngs, tmp / "rng.pt")
    torch.save(ranks, tmp / "ranks.pt")
    names = ("state.pt", "rng.pt", "ranks.pt")
    files = {n: {"bytes": (tmp / n).stat().st_size, "sha256": _sha256(tmp / n)} for n in names}
    meta = {**meta, "format": FORMAT, "step": step, "rank_state": any(ranks), "files": files}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    (tmp / COMPLETE).write_text("")
    shutil.rmtree(final, ignore_errors=True)  # the same step written again after a resume
    tmp.rename(final)
    for old in complete_checkpoints(folder)[keep:]:
        shutil.rmtree(old, ignore_errors=True)
    return final


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


def check_format(meta: dict[str, Any], path: Path) -> None:
    """Refuse a checkpoint written by a newer cpudist, whose files this one would misread."""
    if int(meta.get("format", 1)) > FORMAT:
        raise BadInput(f"checkpoint {path} has format {meta['format']}, newer than this cpudist's ({FORMAT})",
                       "Resume with the cpudist version that wrote it, or start over without --resume")


def check_same_run(meta: dict[str, Any], cfg: dict[str, Any], path: Path) -> None:
    """Refuse a checkpoint of another run (another model, data or seed), naming what differs."""
    differ = [f"{k}: {meta['config'].get(k)!r} there, {cfg.get(k)!r} here" for k in SAME_RUN
              if meta["config"].get(k) != cfg.get(k)]
    if differ:
        raise BadInput(f"checkpoint {path} belongs to another run ({'; '.join(differ)})",
                       "Resume with the options of the run that wrote it, or start over without --resume")


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
    meta = json.loads((Path(found) / "meta.json").read_text()) if rank == 0 else None
    raw, rngs_raw, meta = broadcast((raw, rngs_raw, meta), rank, world)
    state = torch.load(io.BytesIO(raw), weights_only=False)
    rngs = torch.load(io.BytesIO(rngs_raw), weights_only=False)
    same = len(rngs) == world
    return Restored(found, meta, state, rngs[rank] if same else None,
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
