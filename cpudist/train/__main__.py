"""Rank entry point: one process per rank, started by a launcher.

    mpirun -np 2 -ppn 2 -genv MASTER_ADDR 127.0.0.1 -genv MASTER_PORT 29500 \
        python -m cpudist.train --task mrpc --data-dir glue/MRPC --model tiny --output-dir run
    torchrun --standalone --nproc-per-node 2 -m cpudist.train --task synthetic --output-dir run

`cpudist run` builds these commands for you (see `cpudist run --dry-run`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# Inductor (--compile) fixes its cache folder when torch is imported: the user's, kept across runs and reboots.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path.home() / ".cpudist" / "inductor"))

import torch
import torch.distributed as dist

from cpudist.errors import CpudistError
from cpudist.flops import shape_of
from cpudist.train import events, preempt, resume
from cpudist.train.checkpoint import Restored
from cpudist.train.config import TrainConfig, from_argv
from cpudist.train.dist import RankInfo, discover_rank, shutdown_distributed
from cpudist.train.evaluate import evaluate
from cpudist.train.loop import Saver, TrainStats, train
from cpudist.train.result import build_result, peak_rss_mb
from cpudist.train.setup import Job, setup


def _say_rank0(rank: int) -> Callable[[str], None]:
    def say(line: str) -> None:
        if rank == 0:
            sys.stdout.write(f"[cpudist] {line}\n")
            sys.stdout.flush()

    return say


def run(cfg: TrainConfig, info: RankInfo) -> int:
    """Set up, train, evaluate and (on rank 0) write result.json; the exit code."""
    started, started_at = time.perf_counter(), datetime.now(UTC).isoformat(timespec="seconds")
    job = setup(cfg, info)
    cfg, restored = resume.start(cfg, job.run_dir, info.rank, info.world_size, _say_rank0(info.rank))
    job = dataclasses.replace(job, cfg=cfg)
    saver = resume.saver(cfg, job.run_dir, restored, started)
    if info.rank == 0:
        (job.run_dir / preempt.MARKER).unlink(missing_ok=True)
    params = sum(p.numel() for p in job.model.parameters())
    # One write per line: launchers interleave partial writes of different ranks.
    sys.stdout.write(f"rank {info.rank}/{info.world_size} ready: {len(job.train_data)} train rows, "
                     f"{params / 1e6:.1f}M params, {'bf16' if job.bf16 else 'fp32'}, "
                     f"{torch.get_num_threads()} threads\n")
    sys.stdout.flush()
    imds = preempt.imds_endpoint(cfg.imds) if info.local_rank == 0 else None  # one poller per node
    with preempt.StopRequests(imds) as stop:
        stats = train(cfg, job.model, job.train_data, job.regression, job.bf16, job.run_dir, info.rank,
                      info.world_size, shape_of(getattr(job.model, "module", job.model)), saver, stop, restored,
                      job.iface)
    if stats.stopped is not None:
        return _stopped(job, stats, info)
    metrics: dict[str, float] = {}
    phases: dict[str, float] = {}
    if cfg.do_eval:
        if info.rank == 0:
            events.emit("eval", rows=len(job.eval_data))
        metrics, phases = evaluate(getattr(job.model, "module", job.model), job.eval_data, job.metrics, job.regression,
                                   cfg.eval_batch_size, job.bf16, info.rank, info.world_size)
    _finish(job, stats, metrics, phases, saver, started_at, restored)
    return 0


def _finish(job: Job, stats: TrainStats, metrics: dict[str, float], phases: dict[str, float], saver: Saver,
            started_at: str, restored: Restored | None) -> None:
    """Gather every rank's host and memory, write result.json on rank 0, and leave together."""
    info = job.info
    clock = stats.strategy.clock if stats.strategy else None
    mine = {"host": socket.gethostname(), "peak_rss_mb": peak_rss_mb(), "tx_bytes": stats.tx_bytes,
            "iface": job.iface, "comm_s": clock.busy_s if clock else 0.0,
            "exposed_s": clock.exposed_s if clock else 0.0, "threads": torch.get_num_threads()}
    rank_info: list[dict[str, Any]] = [mine]
    if info.world_size > 1:
        rank_info = [{}] * info.world_size
        dist.all_gather_object(rank_info, mine)
    if info.rank == 0:
        result = build_result(job, stats, metrics, phases, saver, started_at, rank_info, restored)
        tmp = job.run_dir / "result.json.tmp"
        tmp.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
        tmp.replace(job.run_dir / "result.json")
        events.emit("done", result=str(job.run_dir / "result.json"))
    if info.world_size > 1:
        # Leave together: a rank tearing down gloo while a peer still talks to it can abort the
        # peer ("terminate called without an active exception").
        dist.barrier()


def _stopped(job: Job, stats: TrainStats, info: RankInfo) -> int:
    """The ranks stopped early after a checkpoint: say where, leave together with EXIT_PREEMPTED."""
    reasons: list[Any] = [(socket.gethostname(), stats.stopped)]
    if info.world_size > 1:
        reasons = [None] * info.world_size
        dist.all_gather_object(reasons, (socket.gethostname(), stats.stopped))
    if info.rank == 0:
        host, why = preempt.stop_reason(reasons)
        marker = {"step": stats.steps, "checkpoint": stats.checkpoints[-1], "reason": why, "host": host}
        (job.run_dir / preempt.MARKER).write_text(json.dumps(marker) + "\n")
        events.emit("preempted", **marker)
    if info.world_size > 1:
        dist.barrier()
    return preempt.EXIT_PREEMPTED


def main(argv: list[str] | None = None) -> int:
    """Run one rank; errors print one line prefixed with host:rank and set the exit code."""
    cfg = from_argv(sys.argv[1:] if argv is None else argv)
    rank = "?"
    try:
        info = discover_rank(os.environ)
        rank = str(info.rank)
        return run(cfg, info)
    except CpudistError as e:
        sys.stderr.write(f"[{socket.gethostname()}:{rank}] error: {e.message}\n")
        sys.stderr.flush()
        return e.exit_code
    except OSError as e:  # e.g. a model or tokenizer that cannot be loaded
        sys.stderr.write(f"[{socket.gethostname()}:{rank}] error: {e}\n")
        sys.stderr.flush()
        return 1
    finally:
        shutdown_distributed()


if __name__ == "__main__":
    sys.exit(main())
