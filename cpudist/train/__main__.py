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
import resource
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# Inductor (--compile) fixes its cache folder when torch is imported: the user's, kept across runs and reboots.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path.home() / ".cpudist" / "inductor"))

import torch
import torch.distributed as dist

from cpudist import __version__
from cpudist.cpu import read_cpu
from cpudist.errors import BadInput, CpudistError
from cpudist.flops import cpu_ghz, peak_flops, shape_of
from cpudist.results.schema import RunResult
from cpudist.train import events, preempt, resume, speed
from cpudist.train.checkpoint import Restored, seed_all
from cpudist.train.config import TrainConfig, from_argv
from cpudist.train.data import TaskData, load_custom, load_glue_hub, load_glue_tsv
from cpudist.train.dist import RankInfo, discover_rank, init_distributed
from cpudist.train.evaluate import evaluate
from cpudist.train.features import Encoded, encode, synthetic
from cpudist.train.loop import Saver, TrainStats, train
from cpudist.train.models import build_model, load_tokenizer

CPU = read_cpu()  # read once per rank


@dataclass(frozen=True)
class Job:
    """Everything set up before the first step."""

    cfg: TrainConfig
    info: RankInfo
    model: torch.nn.Module
    train_data: Encoded
    eval_data: Encoded
    metrics: tuple[str, ...]
    regression: bool
    bf16: bool
    run_dir: Path


def load_task(cfg: TrainConfig) -> TaskData:
    """The task's text data from wherever the config points (not for `synthetic`)."""
    if cfg.task == "custom":
        if cfg.train_file is None:
            raise BadInput("task 'custom' needs --train-file", "Add --train-file and --validation-file")
        return load_custom(Path(cfg.train_file), Path(cfg.validation_file) if cfg.validation_file else None,
                           cfg.text_columns or ("text",), cfg.label_column or "label")
    if cfg.data_dir is not None:
        return load_glue_tsv(cfg.task, Path(cfg.data_dir))
    return load_glue_hub(cfg.task)


def resolve_precision(requested: str, has_bf16: bool) -> str:
    """`auto` means bf16 autocast where the CPU computes bf16 natively, else fp32."""
    if requested == "auto":
        return "bf16" if has_bf16 else "fp32"
    return requested


def setup(cfg: TrainConfig, info: RankInfo) -> Job:
    """Threads, seeds, process group, data, model: the work before training."""
    if "OMP_NUM_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    seed_all(cfg.seed)  # the same model initialization on every rank
    init_distributed(info, cfg.backend, os.environ, cfg.dist_timeout_s)
    if info.rank != 0:
        import transformers

        transformers.logging.set_verbosity_error()
    model: torch.nn.Module
    if cfg.task == "synthetic":
        model = build_model(cfg.model, 2, False, cfg.dropout)
        vocab = int(getattr(model.config, "vocab_size", 30522))
        train_data = synthetic(cfg.synthetic_samples, cfg.max_seq_len, vocab, 2, cfg.seed)
        eval_data = synthetic(max(64, cfg.synthetic_samples // 8), cfg.max_seq_len, vocab, 2, cfg.seed + 1)
        metrics: tuple[str, ...] = ("accuracy",)
        regression = False
    else:
        task = load_task(cfg)
        tokenizer = load_tokenizer(cfg.model, cfg.tokenizer)
        train_data = encode(task.train.head(cfg.max_train_samples), tokenizer, cfg.max_seq_len)
        eval_data = encode(task.validation.head(cfg.max_eval_samples), tokenizer, cfg.max_seq_len)
        metrics, regression = task.metrics, task.is_regression
        torch.manual_seed(cfg.seed)  # same classifier init whatever the tokenizer consumed
        model = build_model(cfg.model, task.num_labels, regression, cfg.dropout)
    if cfg.freeze_embeddings:
        speed.freeze_embeddings(model)
    seed_all(cfg.seed + info.rank)  # dropout noise differs between ranks, as with HF Trainer
    bf16 = resolve_precision(cfg.precision, CPU.has_bf16) == "bf16"
    run_dir = Path(cfg.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    return Job(cfg, info, model, train_data, eval_data, metrics, regression, bf16, run_dir)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def versions() -> dict[str, str]:
    import transformers

    return {"cpudist": __version__, "python": sys.version.split()[0], "torch": torch.__version__,
            "transformers": transformers.__version__}


def build_result(job: Job, stats: TrainStats, metrics: dict[str, float], phases: dict[str, float],
                 saver: Saver, started_at: str, rank_info: list[dict[str, object]],
                 restored: Restored | None) -> RunResult:
    """Assemble result.json from what every rank reported."""
    cfg, world = job.cfg, job.info.world_size
    hosts = tuple(str(r["host"]) for r in rank_info)
    params = sum(p.numel() for p in job.model.parameters())
    eval_time = sum(phases.values())
    flops_per_s = stats.flops / stats.train_time_s if stats.train_time_s else 0.0
    cpu = CPU
    ghz = cpu_ghz(Path("/proc/cpuinfo").read_text()) if Path("/proc/cpuinfo").exists() else 0.0
    # The cores the job computes on: every rank's threads (one per physical core by default).
    peak = peak_flops(cpu, torch.get_num_threads() * world, ghz)
    peak_used = peak.bf16 if job.bf16 else peak.fp32
    return RunResult(
        task=cfg.task, model=cfg.model, world_size=world, nodes=tuple(dict.fromkeys(hosts)),
        ppn=max(hosts.count(h) for h in hosts), precision="bf16" if job.bf16 else "fp32",
        backend=cfg.backend, sync="ddp", per_rank_batch_size=cfg.batch_size, grad_accum=cfg.grad_accum,
        global_batch_size=cfg.batch_size * cfg.grad_accum * world, max_seq_len=cfg.max_seq_len,
        steps=stats.steps, train_samples=stats.samples, train_time_s=stats.train_time_s,
        eval_time_s=eval_time, wall_time_s=saver.wall_before_s + time.perf_counter() - saver.started,
        train_samples_per_s=stats.samples / stats.train_time_s if stats.train_time_s else 0.0,
        steady_samples_per_s=stats.steady_samples_per_s(),
        train_tokens_per_s=stats.tokens / stats.train_time_s if stats.train_time_s else 0.0,
        metrics=metrics,
        # Ring all-reduce: each rank sends 2(W-1)/W of the fp32 gradients per optimizer step.
        comm_bytes_per_step=int(2 * (world - 1) / world * params * 4),
        versions=versions(), cpu=cpu.summary(), run_id=job.run_dir.name, started_at=started_at,
        rank_hosts=hosts, epochs=cfg.epochs if cfg.max_steps is None else None, max_steps=cfg.max_steps,
        seed=cfg.seed, lr=cfg.lr, threads_per_rank=torch.get_num_threads(),
        final_loss=stats.losses[-1] if stats.losses else None,
        peak_rss_mb=max(float(r["peak_rss_mb"]) for r in rank_info),  # type: ignore[arg-type]
        eval_phases=phases, run_dir=str(job.run_dir.resolve()), train_flops_per_s=flops_per_s,
        mfu=flops_per_s / peak_used if peak_used else 0.0, peak_flops_per_s=peak_used, peak_how=peak.how,
        resumed_from_step=int(restored.meta["step"]) if restored else None,
        resumed_from=restored.path if restored else None, parts=saver.parts,
        checkpoints={"folder": str(saver.folder), "written": stats.checkpoints, "s3": cfg.checkpoint_s3,
                     "keep": saver.keep} if stats.checkpoints or restored else {},
    )


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
                      info.world_size, shape_of(getattr(job.model, "module", job.model)), saver, stop, restored)
    if stats.stopped is not None:
        return _stopped(job, stats, info)
    metrics: dict[str, float] = {}
    phases: dict[str, float] = {}
    if cfg.do_eval:
        if info.rank == 0:
            events.emit("eval", rows=len(job.eval_data))
        metrics, phases = evaluate(getattr(job.model, "module", job.model), job.eval_data, job.metrics, job.regression,
                                   cfg.eval_batch_size, job.bf16, info.rank, info.world_size)
    mine = {"host": socket.gethostname(), "peak_rss_mb": peak_rss_mb()}
    rank_info: list[dict[str, object]] = [mine]
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
    return 0


def _stopped(job: Job, stats: TrainStats, info: RankInfo) -> int:
    """The ranks stopped early after a checkpoint: say where, leave together with EXIT_PREEMPTED."""
    reasons: list[Any] = [(socket.gethostname(), stats.stopped)]
    if info.world_size > 1:
        reasons = [None] * info.world_size
        dist.all_gather_object(reasons, (socket.gethostname(), stats.stopped))
    if info.rank == 0:
        host, why = next(((h, r) for h, r in reasons if r and not r.startswith("a peer")), reasons[0])
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
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
