"""result.json of a run: what every rank measured, assembled on rank 0."""

from __future__ import annotations

import dataclasses
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch

from cpudist import __version__
from cpudist.config import effective_lr
from cpudist.flops import cpu_ghz, peak_flops
from cpudist.results.schema import RunResult
from cpudist.traffic import expected_traffic, payload_bytes
from cpudist.train import dropout, last_layer, lora, speed, sync
from cpudist.train.anatomy import step_anatomy
from cpudist.train.checkpoint import Restored
from cpudist.train.loop import TrainStats
from cpudist.train.saver import Saver
from cpudist.train.setup import CPU, Job


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def versions() -> dict[str, str]:
    import transformers

    return {"cpudist": __version__, "python": sys.version.split()[0], "torch": torch.__version__,
            "transformers": transformers.__version__}


def build_result(job: Job, stats: TrainStats, metrics: dict[str, float], phases: dict[str, float],
                 saver: Saver, started_at: str, rank_info: list[dict[str, Any]],
                 restored: Restored | None) -> RunResult:
    """Assemble result.json from what every rank reported."""
    cfg, world = job.cfg, job.info.world_size
    hosts = tuple(str(r["host"]) for r in rank_info)
    eval_time = sum(phases.values())
    flops_per_s = stats.flops / stats.train_time_s if stats.train_time_s else 0.0
    cpu = CPU
    ghz = cpu_ghz(Path("/proc/cpuinfo").read_text()) if Path("/proc/cpuinfo").exists() else 0.0
    # The cores the job computes on: every rank's threads (one per usable physical core by default).
    peak = peak_flops(cpu, sum(int(r["threads"]) for r in rank_info), ghz)
    peak_used = peak.bf16 if job.bf16 else peak.fp32
    return RunResult(
        task=cfg.task, model=cfg.model, world_size=world, nodes=tuple(dict.fromkeys(hosts)),
        ppn=max(hosts.count(h) for h in hosts), precision="bf16" if job.bf16 else "fp32",
        backend=cfg.backend, per_rank_batch_size=cfg.batch_size, grad_accum=cfg.grad_accum,
        global_batch_size=cfg.batch_size * cfg.grad_accum * world, max_seq_len=cfg.max_seq_len,
        steps=stats.steps, train_samples=stats.samples, train_time_s=stats.train_time_s,
        eval_time_s=eval_time, wall_time_s=saver.wall_before_s + time.perf_counter()
        - saver.started,
        train_samples_per_s=stats.samples / stats.train_time_s if stats.train_time_s else 0.0,
        steady_samples_per_s=stats.steady_samples_per_s(),
        train_tokens_per_s=stats.tokens / stats.train_time_s if stats.train_time_s else 0.0,
        metrics=metrics,
        versions=versions(), cpu=cpu.summary(), run_id=cfg.run_id or job.run_dir.name,
        started_at=started_at,
        rank_hosts=hosts, epochs=cfg.epochs if cfg.max_steps is None else None,
        max_steps=cfg.max_steps,
        seed=cfg.seed, lr=effective_lr(cfg, world), lr_scaling=cfg.lr_scaling,
        threads_per_rank=torch.get_num_threads(),
        rank_threads=tuple(int(r["threads"]) for r in rank_info),
        final_loss=stats.losses[-1] if stats.losses else None,
        peak_rss_mb=max(float(r["peak_rss_mb"]) for r in rank_info),
        eval_phases=phases, run_dir=str(job.run_dir.resolve()), train_flops_per_s=flops_per_s,
        mfu=flops_per_s / peak_used if peak_used else 0.0, peak_flops_per_s=peak_used,
        peak_how=peak.how,
        resumed_from_step=restored.meta.step if restored else None,
        resumed_from=restored.path if restored else None, parts=saver.parts,
        checkpoints={"folder": str(saver.folder), "written": stats.checkpoints,
                     "s3": cfg.checkpoint_s3,
                     "keep": saver.keep} if stats.checkpoints or restored else {},
        startup=job.startup.as_dict(stats.step_times[0] if stats.step_times else None),
        optimizer=cfg.optimizer, fast_dropout=cfg.fast_dropout,
        attention=dropout.attention_used(job.model),
        last_layer=last_layer.used(job.model),
        freeze_embeddings=cfg.freeze_embeddings,
        checkpointed_layers=speed.checkpointed_layers(job.model),
        data=job.data, peft=lora.settings(job.model, cfg),
        trainable_params=sum(p.numel() for p in job.model.parameters() if p.requires_grad),
        lr_scheduler=cfg.lr_scheduler, warmup_steps=stats.warmup_steps,
        step_anatomy=step_anatomy(stats.step_times, stats.anatomy,
                                  [r.get("waits", []) for r in rank_info]),
        membership=stats.membership,
        **_sync_fields(job, stats, rank_info, hosts),
    )


def _sync_fields(job: Job, stats: TrainStats, rank_info: list[dict[str, Any]],
                 hosts: tuple[str, ...]) -> dict[str, Any]:
    """The sync's knobs, the bytes it should move and did move between nodes, and its times."""
    assert stats.strategy is not None
    spec, world = stats.strategy.spec, job.info.world_size
    shapes = tuple(sync.named_shapes(job.model))
    nodes = tuple(dict.fromkeys(hosts))
    # the word embedding's, if sent so
    rows = stats.strategy.rows if isinstance(stats.strategy, sync.DDP) else None
    rows = rows if rows is not None and rows.syncs > 0 else None
    wire, mask = ((rows.wire_shapes(shapes), rows.weight.shape[0]) if rows is not None
                  else (shapes, 0))
    expected = expected_traffic(spec, wire, world, max(1, world // len(nodes)), stats.steps, mask)
    part_steps = len(stats.step_times)  # the counters and clocks saw this part's steps only
    sent = {str(r["host"]): r["tx_bytes"] for r in rank_info if r.get("tx_bytes") is not None}
    measured = None
    if len(nodes) > 1 and part_steps and len(sent) == len(nodes):
        measured = sum(sent.values()) / part_steps
    comm = sum(float(r["comm_s"]) for r in rank_info) / world
    exposed = sum(float(r["exposed_s"]) for r in rank_info) / world
    busy_bytes = expected.rank_send * part_steps
    return {
        "sync": spec.label,
        "sync_options": dataclasses.asdict(spec), "grad_bytes": payload_bytes(shapes),
        "param_shapes": shapes,
        "comm_bytes_per_step": int(expected.rank_send),
        "expected_tx_bytes_per_step": expected.total_node_tx,
        "measured_tx_bytes_per_step": measured,
        "tx_bytes_by_node": {h: b / part_steps for h, b in sent.items()} if measured is not None
        else {},
        "traffic_iface": next((str(r["iface"]) for r in rank_info if r.get("iface")), ""),
        "comm_time_s": comm, "exposed_comm_s": exposed,
        "embedding_rows_per_step": rows.rows_per_step() if rows is not None else None,
        "bus_bandwidth_gbps": busy_bytes * 8 / comm / 1e9 if comm > 0 and busy_bytes else None,
    }
