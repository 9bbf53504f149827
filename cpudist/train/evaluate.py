"""Evaluation sharded across ranks, gathered without duplicates, scored on rank 0."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from cpudist.train.features import Encoded, collate
from cpudist.train.metrics import compute_metrics
from cpudist.train.trainer_choices import EVAL_LOSS


def evaluate(model: torch.nn.Module, data: Encoded, metric_names: tuple[str, ...],
             regression: bool, batch_size: int, bf16: bool, rank: int,
             world: int, loss: bool = False) -> tuple[dict[str, float], dict[str, float]]:
    """Metrics (identical on every rank) and the time of each phase; `loss`: eval_loss too, the
    mean over the rows of the loss the model trains on (cross-entropy, or the squared error for
    regression), as HF's evaluate reports."""
    times: dict[str, float] = {}
    t = time.perf_counter()
    # Rank r takes rows r, r+W, ...: every row exactly once, no padding duplicates.
    # Shortest first: each batch pads to rows of about its own length (the order of MRPC's dev set
    # pads a batch of 64 to its longest row; sorted, the padding all but vanishes).
    mine = sorted(range(rank, len(data), world), key=lambda i: len(data.input_ids[i]))
    preds: list[float] = []
    losses: list[float] = []
    model.eval()
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        for start in range(0, len(mine), batch_size):
            idx = mine[start:start + batch_size]
            batch = collate(data, idx, regression)
            labels = batch.pop("labels")
            logits = model(**batch).logits.float()
            preds += (logits[:, 0] if regression else logits.argmax(-1)).tolist()
            if loss:
                losses += _row_losses(logits, labels, regression).tolist()
    model.train()
    times["predict_s"] = time.perf_counter() - t

    t = time.perf_counter()
    gathered: list[Any] = [None] * world if rank == 0 else []
    rows = list(zip(mine, zip(preds, losses or [0.0] * len(preds), strict=True), strict=True))
    if world > 1:
        dist.gather_object(rows, gathered if rank == 0 else None, dst=0)
    else:
        gathered = [rows]
    times["gather_s"] = time.perf_counter() - t

    t = time.perf_counter()
    metrics: dict[str, float] = {}
    if rank == 0:
        by_row = dict(pair for part in gathered for pair in part)
        assert len(by_row) == len(data), "evaluation lost or duplicated rows"
        predictions = np.array([by_row[i][0] for i in range(len(data))])
        metrics = compute_metrics(metric_names, predictions, np.array(data.labels))
        if loss:
            metrics[EVAL_LOSS] = float(np.mean([by_row[i][1] for i in range(len(data))]))
    times["metric_s"] = time.perf_counter() - t

    t = time.perf_counter()
    if world > 1:
        box = [metrics]
        dist.broadcast_object_list(box, src=0)
        metrics = box[0]
    times["broadcast_s"] = time.perf_counter() - t
    return metrics, times


def _row_losses(logits: torch.Tensor, labels: torch.Tensor, regression: bool) -> torch.Tensor:
    """Each row's loss, as the model's own loss averages them (MSE for one regression output, else
    cross-entropy)."""
    if regression:
        return (logits[:, 0] - labels.float()) ** 2
    return F.cross_entropy(logits, labels, reduction="none")
