"""The optimizer a rank trains with, and its step (clipping, schedule, zeroing)."""

from __future__ import annotations

from typing import Any

import torch

from cpudist.config import TrainConfig


def optimizer(cfg: TrainConfig, model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    """AdamW (or plain SGD) over the trainable parameters, biases and LayerNorms without weight
    decay."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for name, p in model.named_parameters():
        if not p.requires_grad:  # --freeze-embeddings: no gradient, no optimizer state
            continue
        (no_decay if p.ndim < 2 or "LayerNorm" in name or "bias" in name else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=lr)
    # Fused AdamW: one kernel over all parameters, 80 -> 19 ms a step for MiniLM
    # (benchmarks/README.md).
    return torch.optim.AdamW(groups, lr=lr, fused=True)


def clip_and_step(model: torch.nn.Module, opt: torch.optim.Optimizer, sched: Any,
                  max_norm: float) -> float:
    """Clip the (already all-reduced) gradients to `max_norm` (0: no clipping), step; the norm
    before clipping."""
    params = [p for p in model.parameters() if p.grad is not None]
    if max_norm > 0:
        norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    else:
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad)
                                                           for p in params])))
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    return norm
