"""One Hugging Face Trainer run on GLUE MRPC, the baseline arms of benchmarks/throughput.py.

    python benchmarks/hf_trainer.py --mode best --data-dir ../shared/data/glue/MRPC --model PATH \
        --epochs 3
    # fp32, every row padded to 128 (run_glue.py's way)
    python benchmarks/hf_trainer.py --mode blog ...

Prints one JSON line: steady samples/s and steady tokens/s (first steps excluded; tokens: the
batches' real, unpadded tokens, as cpudist's steps.jsonl counts them), train time, peak RSS, dev
metrics.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.metrics import accuracy_score, f1_score
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    default_data_collator,
)

from cpudist.cpu import read_cpu
from cpudist.train.data import load_glue_tsv
from cpudist.train.models import PRESETS, offline_minilm_dir

WARMUP = 3


class StepClock(TrainerCallback):
    """Wall time at the end of every optimizer step."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        self.ends.append(time.perf_counter())


class Counted:
    """A collator that notes each training batch's real (attention-mask) tokens, in the order
    Trainer asks for them: samples/s alone compares different batches when two samplers order rows
    by length differently (Trainer's group_by_length puts its longest batches first)."""

    def __init__(self, collate: Any) -> None:
        self.collate, self.tokens = collate, list[int]()

    def __call__(self, rows: list[dict[str, Any]]) -> Any:
        batch = self.collate(rows)
        self.tokens.append(int(torch.as_tensor(batch["attention_mask"]).sum()))
        return batch


class Rows(torch.utils.data.Dataset):
    def __init__(self, enc: dict[str, list[list[int]]], labels: list[int]) -> None:
        self.enc, self.labels = enc, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, object]:
        return {**{k: v[i] for k, v in self.enc.items()}, "labels": self.labels[i]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["best", "blog"], required=True)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--epochs", type=float, default=3)
    ap.add_argument("--max-steps", type=int, default=-1)
    ap.add_argument("--max-train-samples", type=int)
    ap.add_argument("--no-eval", action="store_true")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto",
                    help="best mode: auto is bf16 where the CPU has it (blog mode is always fp32)")
    ap.add_argument("--gradient-checkpointing", action="store_true",
                    help="TrainingArguments(activation_checkpointing=True): Trainer's activation "
                         "checkpointing")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    data = load_glue_tsv("mrpc", Path(a.data_dir))
    train_split = data.train.head(a.max_train_samples)
    tok_dir = a.model if a.model not in PRESETS else str(offline_minilm_dir())
    tok = AutoTokenizer.from_pretrained(tok_dir)
    pad = {"padding": "max_length"} if a.mode == "blog" else {}
    enc = tok(*train_split.texts, truncation=True, max_length=128, **pad)
    dev = tok(*data.validation.texts, truncation=True, max_length=128, **pad)
    keys = ("input_ids", "token_type_ids", "attention_mask")
    train_ds = Rows({k: enc[k] for k in keys}, [int(x) for x in train_split.labels])
    dev_ds = Rows({k: dev[k] for k in keys}, [int(x) for x in data.validation.labels])
    if a.model in PRESETS:
        preset = dict(PRESETS[a.model])
        config = AutoConfig.for_model(preset.pop("model_type"), num_labels=2, **preset)
        model = AutoModelForSequenceClassification.from_config(config)
    else:
        model = AutoModelForSequenceClassification.from_pretrained(a.model, num_labels=2)
    best = a.mode == "best"
    bf16 = best and (a.precision == "bf16" or (a.precision == "auto" and read_cpu().has_bf16))
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out, per_device_train_batch_size=a.batch_size, per_device_eval_batch_size=64,
            learning_rate=a.lr, num_train_epochs=a.epochs, max_steps=a.max_steps, warmup_steps=0.1,
            weight_decay=0.01, use_cpu=True, bf16=bf16, seed=a.seed, report_to=[],
            save_strategy="no",
            eval_strategy="no", logging_strategy="no", dataloader_num_workers=0,
            train_sampling_strategy="group_by_length" if best else "random",
            # gradient_checkpointing: deprecated in 5.x
            activation_checkpointing=a.gradient_checkpointing)
        clock = StepClock()
        collator = Counted(DataCollatorWithPadding(tok) if best else default_data_collator)
        trainer = Trainer(model=model, args=args, train_dataset=train_ds, data_collator=collator,
                          callbacks=[clock])
        start = time.perf_counter()
        trainer.train()
        train_time = time.perf_counter() - start
        steps = len(clock.ends)
        steady = (steps - WARMUP) * a.batch_size / (clock.ends[-1] - clock.ends[WARMUP - 1])
        # The training batches are the first `steps` the collator made (evaluation, if any, comes
        # after)
        steady_tokens = (sum(collator.tokens[WARMUP:steps])
                         / (clock.ends[-1] - clock.ends[WARMUP - 1]))
        metrics = {}
        eval_time = 0.0
        if not a.no_eval:
            started = time.perf_counter()
            pred = trainer.predict(dev_ds)
            eval_time = time.perf_counter() - started
            # With group_by_length, Trainer evaluates in length-grouped order too (transformers 5's
            # _get_eval_sampler): predictions come back in that order, so score them against the
            # label_ids predict returns beside them, never against the file's order (that read ~0.61
            # on MRPC dev).
            labels = np.asarray(pred.label_ids)
            logits = pred.predictions[0] if isinstance(pred.predictions,
                                                       tuple) else pred.predictions
            guess = logits.argmax(-1)
            metrics = {"accuracy": float(accuracy_score(labels, guess)),
                       "f1": float(f1_score(labels, guess))}
    samples = min(steps * a.batch_size, len(train_ds)
                  * max(1, int(np.ceil(a.epochs)))) if a.max_steps < 0 \
        else steps * a.batch_size
    print(json.dumps({"arm": f"hf_{a.mode}", "steps": steps, "precision": "bf16" if bf16
                      else "fp32",
                      "steady_samples_per_s": steady, "steady_tokens_per_s": steady_tokens,
                      "train_time_s": train_time,
                      "train_samples_per_s": samples / train_time, "eval_time_s": eval_time,
                      # Linux: KiB
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "metrics": metrics}))


if __name__ == "__main__":
    main()
