"""The peer arm of benchmarks/time_to_accuracy.py: a user's HF Trainer script, started by torchrun
on every host.

    torchrun --nnodes 4 --nproc-per-node 1 --node-rank I --master-addr HEAD --master-port 29641 \
        benchmarks/tta_hf.py --task sst2 --data-dir ../shared/data/glue/SST-2 --model MODEL \
        --batch-size 32 --lr 2e-4 --max-steps 375 --eval-steps 31 --seed 42 --out result.json

Trainer's best CPU settings, as benchmarks/hf_trainer.py uses them on one node: bf16 autocast where
the CPU has it, length-grouped batches (`train_sampling_strategy="group_by_length"`), dynamic
padding, gloo between hosts. The learning rate is the caller's (time_to_accuracy.py scales it by the
processes, as Accelerate's guide "Comparing performance across distributed setups" says to for a
larger global batch). Evaluation every `--eval-steps` optimizer steps (Trainer's
`eval_strategy="steps"`, sharded over the ranks) and once at the end; rank 0 writes each one's end
on the wall clock, so the caller times launch to accuracy as it does for cpudist.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from cpudist.cpu import read_cpu
from cpudist.train.data import load_glue_tsv
from cpudist.train.models import resolve_model


class Rows(torch.utils.data.Dataset):
    def __init__(self, enc: Any, labels: list[int]) -> None:
        self.enc, self.labels = enc, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {**{k: v[i] for k, v in self.enc.items()}, "labels": self.labels[i]}


class Evaluated(TrainerCallback):
    """Each evaluation's step, accuracy, duration and end (Unix seconds: the hosts share the
    caller's clock)."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def on_evaluate(self, args, state, control, metrics=None,
                    **kwargs):  # type: ignore[no-untyped-def]
        m = metrics or {}
        self.seen.append({"step": state.global_step,
                          "metrics": {"accuracy": m.get("eval_accuracy")},
                          "seconds": m.get("eval_runtime"), "at": round(time.time(), 3)})


def accuracy(pred: Any) -> dict[str, float]:
    logits = pred.predictions[0] if isinstance(pred.predictions, tuple) else pred.predictions
    return {"accuracy": float(np.mean(np.asarray(logits).argmax(-1) == np.asarray(pred.label_ids)))}


def main() -> None:
    ap = argparse.ArgumentParser()
    for name in ("--task", "--data-dir", "--model", "--out"):
        ap.add_argument(name, required=True)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--max-steps", type=int, required=True)
    ap.add_argument("--eval-steps", type=int, required=True)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--max-train-samples", type=int)
    ap.add_argument("--max-eval-samples", type=int)
    a = ap.parse_args()
    data = load_glue_tsv(a.task, Path(a.data_dir))
    train, dev = data.train.head(a.max_train_samples), data.validation.head(a.max_eval_samples)
    path = resolve_model(a.model)
    tok = AutoTokenizer.from_pretrained(path)
    keys = ("input_ids", "token_type_ids", "attention_mask")
    enc, dev_enc = (tok(*split.texts, truncation=True, max_length=128) for split in (train, dev))
    train_ds = Rows({k: enc[k] for k in keys}, [int(x) for x in train.labels])
    dev_ds = Rows({k: dev_enc[k] for k in keys}, [int(x) for x in dev.labels])
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)
    clock = Evaluated()
    args = TrainingArguments(
        output_dir=str(Path(a.out).parent / "hf"), per_device_train_batch_size=a.batch_size,
        per_device_eval_batch_size=64, learning_rate=a.lr, max_steps=a.max_steps, warmup_steps=0.1,
        weight_decay=0.01, use_cpu=True, bf16=read_cpu().has_bf16, ddp_backend="gloo", seed=a.seed,
        report_to=[], save_strategy="no", eval_strategy="steps", eval_steps=a.eval_steps,
        logging_strategy="no",
        dataloader_num_workers=0, train_sampling_strategy="group_by_length")
    trainer = Trainer(model=model, args=args, train_dataset=train_ds, eval_dataset=dev_ds,
                      data_collator=DataCollatorWithPadding(tok), compute_metrics=accuracy,
                      callbacks=[clock])
    out = trainer.train()
    if not clock.seen or clock.seen[-1]["step"] != out.global_step:
        trainer.evaluate()  # the final model's, as cpudist's last evaluation
    if int(os.environ.get("RANK", "0")) == 0:
        Path(a.out).write_text(json.dumps({
            "steps": out.global_step, "train_time_s": out.metrics.get("train_runtime"),
            "train_samples_per_s": out.metrics.get("train_samples_per_second"),
            "world_size": int(os.environ.get("WORLD_SIZE", "1")),
            "threads_per_rank": torch.get_num_threads(),
            "precision": "bf16" if args.bf16 else "fp32", "lr": a.lr,
            "metrics": clock.seen[-1]["metrics"], "evaluations": clock.seen}) + "\n")


if __name__ == "__main__":
    main()
