"""The work before the first step of a rank: threads, seeds, process group, data, model."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from cpudist import state
from cpudist.config import TrainConfig
from cpudist.cpu import read_cpu
from cpudist.train import dropout, last_layer, lora, netcount, speed
from cpudist.train.checkpoint import seed_all
from cpudist.train.data import load_task
from cpudist.train.dist import RankInfo, init_distributed
from cpudist.train.features import Encoded, synthetic
from cpudist.train.models import build_model, load_tokenizer
from cpudist.train.startup import Startup
from cpudist.train.tasks import GLUE_DIR_NAMES, display_labels
from cpudist.train.threads import rank_threads
from cpudist.train.token_cache import cached_encode
from cpudist.wire.elastic import node_index

CPU = read_cpu()  # read once per rank


@dataclass(kw_only=True, frozen=True)
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
    # the network interface whose sent bytes this rank counts (one rank per node)
    iface: str | None = None
    # class names in id order (empty: regression), for the saved model's id2label
    labels: tuple[str, ...] = ()
    # where the rows came from, for result.json and the model card
    data: dict[str, Any] = field(default_factory=dict)
    startup: Startup = field(default_factory=Startup)  # where the time before the first step went


def resolve_precision(requested: str, has_bf16: bool) -> str:
    """`auto` means bf16 autocast where the CPU computes bf16 natively, else fp32."""
    if requested == "auto":
        return "bf16" if has_bf16 else "fp32"
    return requested


def noise_seed(cfg: TrainConfig, info: RankInfo, env: Mapping[str, str]) -> int:
    """The seed of a rank's dropout noise, which differs between ranks as with HF Trainer: and
    between an elastic run's nodes, each the rank 0 of a world of its own."""
    return cfg.seed + info.rank + (node_index(env) if cfg.elastic else 0)


def setup(cfg: TrainConfig, info: RankInfo, startup: Startup | None = None) -> Job:
    """Process group, threads, seeds, data, model: the work before training, each phase timed in
    `startup`."""
    startup = startup or Startup()
    with startup.phase("process_group"):
        init_distributed(info, cfg.backend, os.environ, cfg.dist_timeout_s)
    torch.set_num_threads(rank_threads(os.environ, info.world_size))  # from this node's usable CPUs
    seed_all(cfg.seed)  # the same model initialization on every rank
    if info.rank != 0:
        import transformers

        transformers.logging.set_verbosity_error()
    model: torch.nn.Module
    if cfg.task == "synthetic":
        with startup.phase("model"):
            # synthetic rows pad with 0
            model = build_model(cfg.model, 2, False, cfg.dropout, pad_token_id=0)
        vocab = int(getattr(model.config, "vocab_size", 30522))
        train_data = synthetic(cfg.synthetic_samples, cfg.max_seq_len, vocab, 2, cfg.seed)
        eval_data = synthetic(max(64, cfg.synthetic_samples // 8), cfg.max_seq_len, vocab, 2,
                              cfg.seed + 1)
        metrics: tuple[str, ...] = ("accuracy",)
        regression = False
        labels: tuple[str, ...] = ("0", "1")
        data = {"source": "synthetic", "train_rows": len(train_data), "eval_rows": len(eval_data)}
    else:
        with startup.phase("data"):
            task = load_task(cfg)
        with startup.phase("tokenizer"):
            tokenizer = load_tokenizer(cfg.model, cfg.tokenizer)
        with startup.phase("tokenize"):
            cache = state.token_cache_dir()
            train_data, hit = cached_encode(task.train.head(cfg.max_train_samples), tokenizer,
                                            cfg.max_seq_len, cache)
            eval_data, hit_eval = cached_encode(task.validation.head(cfg.max_eval_samples),
                                                tokenizer, cfg.max_seq_len, cache)
            startup.tokens_cached = hit and hit_eval
        metrics, regression = task.metrics, task.is_regression
        labels = display_labels(task.name, task.label_names)
        data = {**data_source(cfg), "train_rows": len(train_data), "eval_rows": len(eval_data),
                "labels": list(labels)}
        torch.manual_seed(cfg.seed)  # same classifier init whatever the tokenizer consumed
        with startup.phase("model"):
            model = build_model(cfg.model, task.num_labels, regression, cfg.dropout,
                                tokenizer.pad_token_id)
    if cfg.gradient_checkpointing:  # before LoRA wraps the model: peft's wrapper has its own switch
        speed.checkpoint_activations(model)
    if cfg.peft == "lora":  # after the model's seeded init, so every rank draws the same adapters
        model = lora.apply(model, cfg)
    if cfg.freeze_embeddings:
        speed.freeze_embeddings(model)
    if cfg.fast_dropout:
        dropout.install(model)
    # after dropout.install: it reads the attention that install chose
    if cfg.first_token_last_layer:
        last_layer.install(model)
    seed_all(noise_seed(cfg, info, os.environ))
    bf16 = resolve_precision(cfg.precision, CPU.has_bf16) == "bf16"
    run_dir = Path(cfg.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    counted = info.local_rank == 0 and info.world_size > 1
    iface = netcount.iface_toward(os.environ) if counted else None
    return Job(cfg=cfg, info=info, model=model, train_data=train_data, eval_data=eval_data,
               metrics=metrics, regression=regression, bf16=bf16, run_dir=run_dir, iface=iface,
               labels=labels, data=data, startup=startup)


def data_source(cfg: TrainConfig) -> dict[str, Any]:
    """Where the task's rows were read from."""
    if cfg.task == "custom":
        return {"source": "files", "train": cfg.train_file, "validation": cfg.validation_file}
    name = GLUE_DIR_NAMES.get(cfg.task, cfg.task)  # as GLUE spells it, for the card
    if cfg.data_dir is not None:
        return {"source": "glue-tsv", "dir": cfg.data_dir, "name": name}
    return {"source": "hub", "dataset": "nyu-mll/glue", "config": cfg.task, "name": name}
