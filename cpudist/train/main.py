"""One rank's whole part of a run: set up, resume, train, evaluate, and (on rank 0) write the rank
report.

The entry point (cpudist/rank.py, `python -m cpudist.rank`) parses the TrainConfig, finds the rank
and hands in what the rank reaches of its cloud provider (a Provider: the checkpoint mirror's object
store, the spot-notice poller); this module and the rest of cpudist/train know only those
interfaces.
"""

from __future__ import annotations

import dataclasses
import socket
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from cpudist.config import TrainConfig, effective_lr, resolved_compression
from cpudist.errors import BadInput
from cpudist.objects import ObjectStore
from cpudist.results import launched
from cpudist.train import checkpoint, model_upload, preempt, report_to, resume
from cpudist.train.checkpoint import Restored
from cpudist.train.checkpoint_meta import clear_partial
from cpudist.train.dist import RankInfo
from cpudist.train.durable import Mirror
from cpudist.train.elastic_loop import train_elastic
from cpudist.train.export import save_model
from cpudist.train.keep import Evaluations
from cpudist.train.loop import TrainStats, train
from cpudist.train.preempt import NoticePoller
from cpudist.train.result import build_result, peak_rss_mb
from cpudist.train.saver import Saver
from cpudist.train.setup import Job, setup
from cpudist.train.startup import Startup
from cpudist.train.store_watch import StoreWatch
from cpudist.wire import events, exits, programs, stop_marker


@dataclass(frozen=True)
class Provider:
    """What a rank reaches of its cloud provider, built by the entry point; nothing by default."""

    # --checkpoint-s3's location -> its object store
    store: Callable[[str], ObjectStore] | None = None
    # --imds's setting -> a poller (None: no notices)
    notices: Callable[[str], NoticePoller | None] | None = None


def _mirror(cfg: TrainConfig, provider: Provider) -> Mirror | None:
    """The durable copy of the checkpoints, when --checkpoint-s3 is given."""
    if not cfg.checkpoint_s3:
        return None
    if provider.store is None:
        raise BadInput(f"--checkpoint-s3 {cfg.checkpoint_s3}: this rank has no object store to "
                       "copy checkpoints to",
                       f"Start ranks with `{programs.usage(programs.RANK)}` "
                       "(as `cpudist run` does)")
    return Mirror(provider.store(cfg.checkpoint_s3), cfg.run_id)


def _say_rank0(rank: int) -> Callable[[str], None]:
    def say(line: str) -> None:
        if rank == 0:
            sys.stdout.write(f"[cpudist] {line}\n")
            sys.stdout.flush()

    return say


def _wire(cfg: TrainConfig, info: RankInfo) -> TrainConfig:
    """--grad-compression auto made what it does here (bf16 for ddp across nodes), said by rank 0
    when it is bf16."""
    if cfg.sync.grad_compression != "auto":
        return cfg
    # an elastic node is a world of its own: its average always crosses the network
    across = cfg.elastic or info.local_world_size < info.world_size
    wire = resolved_compression(cfg.sync.grad_compression, cfg.sync.strategy, across)
    if wire != "none":
        _say_rank0(info.rank)(f"gradients cross the network in {wire} (--grad-compression auto: "
                              f"{wire} for ddp "
                              "when the ranks span nodes; --grad-compression none keeps fp32)")
    return dataclasses.replace(cfg, sync=dataclasses.replace(cfg.sync, grad_compression=wire))


def _warn(line: str) -> None:
    sys.stderr.write(f"[cpudist] {line}\n")  # one write: launchers interleave partial writes
    sys.stderr.flush()


def run(cfg: TrainConfig, info: RankInfo, provider: Provider,
        startup: Startup | None = None) -> int:
    """Set up, train, evaluate and (on rank 0) write the rank report; the exit code. `startup` holds
    the phases timed before this call (Startup.at_entry)."""
    started, started_at = time.perf_counter(), datetime.now(UTC).isoformat(timespec="seconds")
    # on every rank, before any collective: all stop alike
    report_to.check_installed(cfg.report_to, cfg.mlflow_uri)
    cfg = _wire(cfg, info)
    job = setup(cfg, info, startup)
    mirror = _mirror(cfg, provider)
    with job.startup.phase("checkpoint_lookup"):
        cfg, restored = _restore(cfg, job.run_dir, info, _say_rank0(info.rank), mirror)
    job = dataclasses.replace(job, cfg=cfg)
    saver = _saver(cfg, job.run_dir, restored, started, mirror)
    if info.rank == 0:
        stop_marker.clear(job.run_dir)
        for name in clear_partial(saver.folder):  # a part stopped mid-write: nothing half is kept
            _say_rank0(0)(f"removed {saver.folder / name}, a checkpoint an earlier part left "
                          "half-written")
    params = sum(p.numel() for p in job.model.parameters())
    trained = sum(p.numel() for p in job.model.parameters() if p.requires_grad)
    share = f" ({trained / 1e6:.2f}M trainable, {trained / params:.2%})" if trained < params else ""
    # One write per line: launchers interleave partial writes of different ranks.
    sys.stdout.write(f"rank {info.rank}/{info.world_size} ready: {len(job.train_data)} train rows, "
                     f"{params / 1e6:.1f}M params{share}, {'bf16' if job.bf16 else 'fp32'}, "
                     f"{torch.get_num_threads()} threads\n")
    sys.stdout.flush()
    # One poller per node.
    poller = provider.notices(
        cfg.imds) if provider.notices is not None and info.local_rank == 0 else None
    evals = Evaluations.of(job)
    report = report_to.Reporters.open(cfg.report_to, info.rank, job.run_dir,
                                      dataclasses.asdict(cfg),
                                      restored.meta.step if restored else 0)
    try:
        watch = StoreWatch(mirror.store,
                           _warn) if mirror is not None and info.rank == 0 else nullcontext()
        # the copies' store, watched by the rank that copies
        with preempt.StopRequests(poller) as stop, watch:
            stats = (train_elastic(job, saver, stop, restored, evals, report) if cfg.elastic
                     else train(job, saver, stop, restored, evals, report))
        if stats.stopped is not None and cfg.elastic:  # this node leaves; the others go on
            _say_rank0(0)(f"left the elastic run at step {stats.steps} ({stats.stopped})")
            return exits.PREEMPTED
        if stats.stopped is not None:
            return _stopped(job, stats, info)
        metrics: dict[str, float] = {}
        phases: dict[str, float] = {}
        if evals.stopped is not None:  # early stopping: the evaluation it stopped at is the last
            metrics = evals.history[-1]["metrics"]
            _say_rank0(info.rank)(f"stopped early at step {stats.steps}: {evals.stopped['reason']}")
        elif cfg.do_eval:  # the model as trained (local SGD, DiLoCo: the ranks' average)
            metrics, phases = evals.run(job, stats.steps)
            report.log_eval(stats.steps, metrics)
        model_store = provider.store(
            cfg.model_s3) if cfg.model_s3 and provider.store and info.rank == 0 else None
        _finish(job, stats, metrics, phases, saver, started_at, restored, evals, model_store)
    finally:
        report.close()  # the event files are whole on every way out
    return 0


def _restore(cfg: TrainConfig, run_dir: Path, info: RankInfo, say: Callable[[str], None],
             mirror: Mirror | None) -> tuple[TrainConfig, Restored | None]:
    """(config to train with, checkpoint to continue from): a collective, every rank calls it."""
    rank, world = info.rank, info.world_size
    path = resume.pick(cfg, run_dir, say, mirror) if rank == 0 else None
    restored = checkpoint.load(path, rank, world)
    if restored is None:
        return cfg, None
    meta = restored.meta
    adapted = resume.adapt(cfg, meta, world, restored.path)
    if rank == 0:
        change = (f"; {meta.world_size} -> {world} ranks: per-rank batch {adapted.batch_size}, "
                  f"global batch {meta.global_batch} and lr {effective_lr(adapted, world):g} kept, "
                  "dropout noise re-seeded"
                  if meta.world_size != world else "")
        say(f"resuming from {restored.path} at step {meta.step}{change}")
        resume.set_aside(adapted, run_dir, meta.step, mirror, say)
    return adapted, restored


def _saver(cfg: TrainConfig, run_dir: Path, restored: Restored | None, started: float,
           mirror: Mirror | None) -> Saver:
    """When and where this part writes checkpoints (and their durable copy), and what the earlier
    parts took."""
    return Saver(folder=resume.checkpoint_folder(cfg, run_dir), every=cfg.checkpoint_every,
                 every_s=cfg.checkpoint_every_min * 60 if cfg.checkpoint_every_min else None,
                 keep=cfg.keep_checkpoints,
                 mirror=mirror, wall_before_s=restored.meta.wall_s if restored else 0.0,
                 parts=restored.meta.parts + 1 if restored else 1, started=started,
                 strategy=cfg.save_strategy)


def _finish(job: Job, stats: TrainStats, metrics: dict[str, float], phases: dict[str, float],
            saver: Saver, started_at: str, restored: Restored | None, evals: Evaluations,
            model_store: ObjectStore | None) -> None:
    """Gather every rank's host and memory; on rank 0 save the model (and copy it to --model-s3's
    store) and write its report (run/outcome.record makes result.json of it); leave together."""
    info = job.info
    clock = stats.strategy.clock if stats.strategy else None
    mine = {"host": socket.gethostname(), "peak_rss_mb": peak_rss_mb(), "tx_bytes": stats.tx_bytes,
            "iface": job.iface, "comm_s": clock.busy_s if clock else 0.0,
            "exposed_s": clock.exposed_s if clock else 0.0, "threads": torch.get_num_threads(),
            "waits": stats.anatomy.waits()}  # per step: rank 0 tells wire from slowest rank by them
    rank_info: list[dict[str, Any]] = [mine]
    if info.world_size > 1:
        rank_info = [{}] * info.world_size
        dist.all_gather_object(rank_info, mine)
    if info.rank == 0:
        result = build_result(job, stats, metrics, phases, saver, started_at, rank_info, restored)
        # the final card
        result = save_model(job, evals, launched.read_card_part(job.run_dir).apply(result))
        if result.model_dir:
            events.emit(events.MODEL, path=result.model_dir, step=result.model_step,
                        bytes=result.model_bytes, seconds=round(result.model_save_s or 0.0, 2))
            if model_store is not None:
                copied = model_upload.upload(model_store, Path(result.model_dir), result.run_id)
                result = dataclasses.replace(result, model_s3=copied)
                events.emit(events.MODEL_S3, **copied)
        events.emit(events.DONE, result=str(launched.write_report(job.run_dir, result)))
    if info.world_size > 1:
        # Leave together: a rank tearing down gloo while a peer still talks to it can abort the
        # peer ("terminate called without an active exception").
        dist.barrier()


def _stopped(job: Job, stats: TrainStats, info: RankInfo) -> int:
    """The ranks stopped early after a checkpoint: say where, leave together with
    exits.PREEMPTED."""
    reasons: list[Any] = [(socket.gethostname(), stats.stopped)]
    if info.world_size > 1:
        reasons = [None] * info.world_size
        dist.all_gather_object(reasons, (socket.gethostname(), stats.stopped))
    if info.rank == 0:
        host, why = preempt.stop_reason(reasons)
        # the user's stop: resumable all the same, but nothing was preempted
        if stop_marker.asked(job.run_dir):
            stop = stop_marker.Stop(stats.steps, stats.checkpoints[-1], preempt.USER, host)
            events.emit(events.STOPPED, **stop.to_dict())
        else:
            stop = stop_marker.Stop(stats.steps, stats.checkpoints[-1], why or "SIGTERM", host)
            stop_marker.write(job.run_dir, stop)
            events.emit(events.PREEMPTED, **stop.to_dict())
    if info.world_size > 1:
        dist.barrier()
    return exits.PREEMPTED
