"""The trained model, saved by rank 0 into <run folder>/model/ as transformers' save_pretrained
writes it.

    cpudist run mrpc --data-dir glue/MRPC --model minilm-l6 --save-model best --eval-every 50
    python -c 'from transformers import pipeline; print(pipeline("text-classification",
               model="runs/.../model")("hi"))'

model.safetensors and config.json (id2label/label2id with the task's class names, problem_type for
regression), the tokenizer's files, and README.md, the model card (cpudist/results/card.py). The
weights are those the chosen evaluation scored: the end of training (last; local SGD and DiLoCo: the
ranks' average, as evaluated), or the best evaluation's (best). Written as model.tmp/ and renamed,
so a folder named model/ is always complete.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from cpudist.results.card import folder_bytes, write_card
from cpudist.results.schema import RunResult
from cpudist.train import lora
from cpudist.train.keep import Evaluations
from cpudist.train.models import PRESETS, load_tokenizer
from cpudist.train.setup import Job
from cpudist.wire import names


def hub_base(model: str) -> str | None:
    """The Hub id the weights started from (the card's base_model); None for a preset's random
    weights or a folder."""
    if model in PRESETS or model.startswith((".", "/", "~")) or Path(model).expanduser().exists():
        return None
    return model


def label_config(config: Any, labels: tuple[str, ...], regression: bool) -> None:
    """id2label/label2id as the Hub's models carry them; regression keeps transformers' LABEL_0 and
    says so."""
    if regression:
        config.num_labels = 1
        config.problem_type = "regression"
        return
    config.id2label = dict(enumerate(labels))
    config.label2id = {name: i for i, name in enumerate(labels)}


def save_model(job: Job, evals: Evaluations, result: RunResult) -> RunResult:
    """Write <run folder>/model (rank 0 only) and return the result with where, which step, size and
    time."""
    cfg = job.cfg
    chosen = evals.saved(cfg.save_model)
    result = result.with_updates(save_model=cfg.save_model, evaluations=tuple(evals.history),
                                 base_model=hub_base(cfg.model), metric_for_best_model=evals.metric,
                                 greater_is_better=evals.greater,
                                 early_stopping=evals.stopped or {})
    if chosen is not None and cfg.save_model == "best":
        result = result.with_updates(metrics=chosen["metrics"])
    # synthetic rows are noise: nothing worth keeping
    if cfg.save_model == "none" or cfg.task == "synthetic":
        return result
    started = time.perf_counter()
    final, tmp = job.run_dir / names.MODEL, job.run_dir / names.aside(names.MODEL)
    shutil.rmtree(tmp, ignore_errors=True)
    model: Any = getattr(job.model, "module", job.model)  # a transformers PreTrainedModel
    label_config(model.config, job.labels, job.regression)
    state = evals.best_state if cfg.save_model == "best" else None
    from transformers.utils import logging

    logging.disable_progress_bar()  # a shard bar in the ranks' output helps nobody
    if cfg.peft == "lora":
        lora.save(model, tmp, state, cfg)
    else:
        model.save_pretrained(tmp, state_dict=state)
    load_tokenizer(cfg.model, cfg.tokenizer).save_pretrained(tmp)
    step = chosen["step"] if chosen is not None else result.steps
    result = result.with_updates(model_dir=str(final.resolve()), model_step=step)
    write_card(tmp, result)
    if final.exists():  # the folder of an earlier part or run in this output folder
        shutil.rmtree(final)
    tmp.replace(final)
    return result.with_updates(model_bytes=folder_bytes(final), model_save_s=time.perf_counter()
                               - started)
