"""Where a run starts: from scratch, or from the newest usable checkpoint (local, else the S3 copy).

With another world size the global batch is kept and the per-rank batch adapts (the length-grouped
sampler then feeds the same rows step by step); a global batch that the new ranks cannot split
evenly, or the `random` sampler (whose shuffle depends on the world size), is refused. So is a
checkpoint that holds every rank's own state (local SGD's models and moments between averages,
PowerSGD's error feedback) on another world size or another --sync: no rank could take it up
exactly.

No torch here: `cpudist run` calls `preflight` before any rank starts (the ranks load the tensors
with cpudist/train/checkpoint.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from cpudist.config import TrainConfig, spec_of
from cpudist.errors import BadInput
from cpudist.train import checkpoint_meta as ckpt
from cpudist.train import lora
from cpudist.train.checkpoint_match import check_same_run, check_same_schedule
from cpudist.train.checkpoint_meta import CheckpointMeta
from cpudist.train.durable import Mirror
from cpudist.wire import names


def checkpoint_folder(cfg: TrainConfig, run_dir: Path) -> Path:
    return Path(
        cfg.checkpoint_dir).expanduser() if cfg.checkpoint_dir else run_dir / names.CHECKPOINTS


def _from_s3(cfg: TrainConfig, folder: Path, say: Callable[[str], None],
             mirror: Mirror | None) -> Path | None:
    """Download the newest undamaged checkpoint of the S3 copy into `folder`."""
    if mirror is None:
        return None
    for name in reversed(mirror.complete()):
        path = mirror.download(name, folder)
        problem = ckpt.damage(path)
        if problem is None:
            say(f"fetched {name} from {cfg.checkpoint_s3}")
            return path
        say(f"{cfg.checkpoint_s3}/{name} is damaged ({problem}): trying an older one")
    return None


def set_aside(cfg: TrainConfig, run_dir: Path, step: int, mirror: Mirror | None,
              say: Callable[[str], None]) -> None:
    """Resuming from `step`: the run's newer checkpoints (locally and in the S3 copy) are another
    timeline now; move them aside (never delete them), so that rotation, prune and a later --resume
    auto do not mistake them for this one's."""
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    aside = ckpt.set_aside(checkpoint_folder(cfg, run_dir), step, cfg.run_id, stamp)
    if aside is not None:
        say(f"checkpoints newer than step {step} moved to {aside} "
            "(the timeline this resume leaves)")
    moved = mirror.set_aside(step, stamp) if mirror is not None else []
    if moved:
        say(f"{', '.join(moved)} moved to {mirror.url if mirror else ''}/abandoned-{stamp}")


def nothing_to_resume(cfg: TrainConfig, where: str) -> BadInput:
    """A recovery's resume found no checkpoint of its run (the node that held them is gone)."""
    hint = ("Nor does the --checkpoint-s3 copy hold one: start the run again" if cfg.checkpoint_s3
            else "Pass --checkpoint-s3 s3://BUCKET/PREFIX (a copy outliving the head) and start "
            "the run again")
    return BadInput(f"cannot resume: no checkpoint of run {cfg.run_id or '(no id)'} in {where} "
                    "(the node that held them is gone); not starting over from step 0", hint)


def pick(cfg: TrainConfig, run_dir: Path, say: Callable[[str], None],
         mirror: Mirror | None = None) -> Path | None:
    """Rank 0's choice of checkpoint for `--resume` (None: start from step 0); `mirror`: the S3
    copy, if any."""
    if cfg.resume is None:
        return None
    if cfg.resume == "auto":
        folder = checkpoint_folder(cfg, run_dir)
        found = ckpt.choose(folder, say, cfg.run_id or None) or _from_s3(cfg, folder, say, mirror)
        if found is None:
            where = f"{folder}{' or ' + cfg.checkpoint_s3 if cfg.checkpoint_s3 else ''}"
            if cfg.resume_required:
                raise nothing_to_resume(cfg, where)
            say(f"--resume auto: no checkpoint in {where}, starting from step 0")
        return found
    given = Path(cfg.resume).expanduser()
    if not given.exists():
        raise BadInput(f"--resume {given} does not exist",
                       "Pass an existing run folder, its checkpoints folder or a step-N folder, or "
                       "--resume auto")
    if ckpt.step_of(given.name) is not None:
        problem = ckpt.damage(given) if (given / ckpt.COMPLETE).is_file() else "it is incomplete"
        if problem:
            raise BadInput(f"checkpoint {given} cannot be used: {problem}",
                           "Pass an older one, or --resume auto")
        return given
    for folder in (given / names.CHECKPOINTS, given):
        found = ckpt.choose(folder, say)
        if found is not None:
            return found
    raise BadInput(f"no usable checkpoint in {given}",
                   "Pass a run folder, its checkpoints folder or a step-N folder")


def adapt(cfg: TrainConfig, meta: CheckpointMeta, world: int, path: str) -> TrainConfig:
    """The config that continues the checkpointed run on `world` ranks (the global batch is
    kept)."""
    check_same_run(meta, dataclasses.asdict(cfg), Path(path))
    check_same_schedule(meta, dataclasses.asdict(cfg), Path(path))
    lora.check_resume(meta.config, cfg, Path(path))
    _check_rank_state(cfg, meta, world, path)
    # the global batch is kept, so --lr-scaling goes on scaling by the rank count of the run's first
    # part
    cfg = dataclasses.replace(cfg, lr_world=int(meta.config.get("lr_world") or meta.world_size))
    if meta.world_size == world:
        return dataclasses.replace(cfg, batch_size=meta.global_batch // (world * cfg.grad_accum))
    if cfg.sampler != "grouped":
        raise BadInput(f"checkpoint {path} was written by {meta.world_size} ranks; the random "
                       "sampler cannot "
                       f"continue it on {world}", f"Resume with --np {meta.world_size}")
    split = world * cfg.grad_accum
    if meta.global_batch % split:
        raise BadInput(f"the run's global batch of {meta.global_batch} cannot be split over "
                       f"{world} rank(s) x --grad-accum {cfg.grad_accum}",
                       f"Resume with --np {meta.world_size}, or a rank count that divides "
                       f"{meta.global_batch}")
    return dataclasses.replace(cfg, batch_size=meta.global_batch // split)


def _check_rank_state(cfg: TrainConfig, meta: CheckpointMeta, world: int, path: str) -> None:
    """Refuse a checkpoint whose per-rank sync state these ranks, or this strategy, cannot take
    up."""
    if not meta.rank_state:
        return
    label = spec_of(cfg, meta.total).label
    if meta.world_size != world:
        raise BadInput(f"checkpoint {path} holds each of {meta.world_size} ranks' own {meta.sync} "
                       f"state; {world} rank(s) cannot go on from it exactly",
                       f"Resume with --np {meta.world_size}")
    if meta.sync != label:
        raise BadInput(f"checkpoint {path} holds the ranks' own {meta.sync} state; this run asks "
                       f"for {label}",
                       "Resume with the --sync options of the run that wrote it")


def check_fresh(cfg: TrainConfig) -> None:
    """Refuse a fresh run (no --resume) whose checkpoint folder holds another run's checkpoints: its
    rotation and a later --resume auto would mix the two."""
    if cfg.resume is not None:
        return
    folder = checkpoint_folder(cfg, Path(cfg.output_dir))
    theirs = [p for p in ckpt.complete_checkpoints(folder) if ckpt.owner(p) != cfg.run_id
              or not cfg.run_id]
    if theirs:
        who = ckpt.owner(theirs[0]) or "a run without an id"
        where = "--checkpoint-dir" if cfg.checkpoint_dir else "--output-dir"
        raise BadInput(
            f"{folder} holds checkpoints of another run ({who}, newest {theirs[0].name})",
            f"Continue that run with --resume auto, or give this run another {where}")


def preflight(cfg: TrainConfig, world: int) -> None:
    """Refuse, before any rank starts, a local checkpoint that these ranks cannot continue (or a
    fresh run into another run's checkpoints)."""
    check_fresh(cfg)
    if cfg.resume is None:
        return
    # any complete checkpoint of the run has its layout: no hashing twice (ranks verify)
    if cfg.resume == "auto":
        found = [p for p in ckpt.complete_checkpoints(checkpoint_folder(cfg, Path(cfg.output_dir)))
                 if not cfg.run_id or ckpt.same_run(ckpt.owner(p), cfg.run_id)]
        path = found[0] if found else None
        if path is None and cfg.resume_required and not cfg.checkpoint_s3:  # nowhere else to look
            raise nothing_to_resume(cfg, str(checkpoint_folder(cfg, Path(cfg.output_dir))))
    else:
        path = pick(cfg, Path(cfg.output_dir), lambda line: None)
    if path is not None:
        try:
            meta = ckpt.read_meta(path)
        except (OSError, ValueError):
            return  # damaged: rank 0 says so and falls back to an older one
        adapt(cfg, meta, world, str(path))
