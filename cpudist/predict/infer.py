"""The model over one process's share of the rows: the same sorted, sharded batches as the run's
evaluation."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from cpudist.errors import BadInput
from cpudist.predict.source import Settings
from cpudist.train import lora
from cpudist.train.data import Split
from cpudist.train.features import Encoded, collate, encode


def load(model_dir: str) -> tuple[Any, Any]:
    """The model (in eval mode, fp32 weights) and its tokenizer from a save_pretrained folder; never
    the Hub."""
    import transformers
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    # a load report and a bar per process would drown the progress
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, use_fast=True, local_files_only=True)
        # --peft lora's adapter: on its base model, with the run's labels
        if lora.is_adapter(Path(model_dir)):
            model = lora.load_adapter(Path(model_dir), local_files_only=True)
        else:
            model = AutoModelForSequenceClassification.from_pretrained(
                model_dir, local_files_only=True)
    # transformers and safetensors raise many kinds; each means the folder is unusable
    except Exception as e:
        said = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise BadInput(f"cannot load the model in {model_dir}: {said}",
                       "Give a folder that save_pretrained() wrote (model and tokenizer)") from None
    # transformers loads weights in the dtype they were saved in; bf16 autocast (--precision bf16)
    # computes from fp32 weights, as the run's evaluation did, and fp32 must not compute in bf16
    # weights
    return model.float().eval(), tokenizer


def shard(rows: int, rank: int, world: int) -> list[int]:
    """This process's rows of the evaluation's own split: rank, rank+world, ..."""
    return list(range(rank, rows, world))


def encode_rows(texts: tuple[tuple[str, ...], ...], tokenizer: Any, max_seq_len: int) -> Encoded:
    """Token ids of every row, truncated as the run truncated its rows."""
    return encode(Split(texts, (0.0,) * len(texts[0])), tokenizer, max_seq_len)


def predict_rows(model: torch.nn.Module, data: Encoded, rows: Sequence[int], settings: Settings,
                 on_batch: Callable[[int], None] = lambda n: None) -> list[tuple[int, list[float]]]:
    """(row, logits) for the encoded rows (`rows` their numbers in the input), in inference mode.

    Shortest first (a stable sort, as the evaluation's), so a batch pads to rows of about its own
    length.
    """
    order = sorted(range(len(data)), key=lambda i: len(data.input_ids[i]))
    out: list[tuple[int, list[float]]] = []
    bf16 = settings.precision == "bf16"
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        for start in range(0, len(order), settings.batch_size):
            idx = order[start:start + settings.batch_size]
            batch = collate(data, idx, regression=False)
            batch.pop("labels")
            logits = model(**batch).logits.float()
            out += zip((rows[i] for i in idx), logits.tolist(), strict=True)
            on_batch(len(idx))
    return out


def run_shard(texts: tuple[tuple[str, ...], ...], rank: int, world: int, settings: Settings,
              on_batch: Callable[[int], None] = lambda n: None) -> list[tuple[int, list[float]]]:
    """Load the model, tokenize this process's rows and predict them with the given thread count."""
    torch.set_num_threads(settings.threads)
    if not Path(settings.model_dir).is_dir():
        raise BadInput(f"model folder not found: {settings.model_dir}",
                       "Give a folder saved with save_pretrained()")
    model, tokenizer = load(settings.model_dir)
    rows = shard(len(texts[0]), rank, world)
    if not rows:  # more processes than rows
        return []
    data = encode_rows(tuple(tuple(col[i] for i in rows) for col in texts), tokenizer,
                       settings.max_seq_len)
    return predict_rows(model, data, rows, settings, on_batch)
