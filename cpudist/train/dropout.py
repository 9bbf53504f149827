"""Dropout whose random mask costs less than torch's: the lever that matters once bf16 GEMMs are
cheap.

torch draws every dropout element from its CPU generator one at a time (bernoulli_), which made
dropout a large share of a MiniLM training step on an AMX CPU
(benchmarks/results/dropout-draw-*.md). Here one 64-bit random word gives four 16-bit uniforms: an
element is kept when its uniform falls under round(65536 (1 - p)), and kept elements are scaled by
65536 / that threshold, so the expectation is exact. Same p, same seeding and checkpointed RNG
state; a different (equally random) mask than torch's.

The words come from numpy's SFC64 generator seeded by torch's default generator, not from torch's
random_ (its CPU kernel is serial and costs a call per element). A draw is serial either way, so
once the matrix products use every core it is what is left
(benchmarks/results/lora-step-profile-*.txt; the two draws side by side:
benchmarks/dropout_draw.py).

`install(model)` swaps every nn.Dropout for FastDropout and, for the families in FAST_ATTENTION,
routes the attention of training steps through `attention` (softmax, this dropout, matmul);
evaluation keeps PyTorch's fused SDPA kernel. Another family keeps its own attention (DeBERTa's
disentangled one never calls transformers' attention interface); `attention_used(model)` says which
ran, for result.json.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

ATTENTION = "cpudist_fast_dropout"
# model_type of the families whose attention `attention` computes as SDPA does: plain or
# grouped-query heads, masks from transformers' mask interface (padding, causal, sliding windows),
# no bias added to the scores. Each is proven against SDPA in tests/unit/test_architectures.py; a
# family joins only with its test.
FAST_ATTENTION = frozenset({"bert", "roberta", "xlm-roberta", "electra", "albert", "distilbert",
                            "modernbert", "qwen2", "llama"})
LANES = 4  # 16-bit uniforms per 64-bit draw


def keep_mask(shape: torch.Size, p: float) -> tuple[torch.Tensor, float]:
    """(bool mask of elements kept with probability ~1 - p, the exact keep probability)."""
    n = shape.numel()
    threshold = round((1.0 - p) * 65536)
    if threshold >= 65536:  # p under 1/65536 drops nothing (and 32768 is past int16's range)
        return torch.ones(shape, dtype=torch.bool), 1.0
    uniforms = random_words((n + LANES - 1) // LANES).view(torch.int16)[:n].view(shape)
    return uniforms < threshold - 32768, threshold / 65536


def torch_words(n: int) -> torch.Tensor:
    """n int64 words from torch's random_ over the full signed range, on the default generator."""
    return torch.empty(n, dtype=torch.int64).random_(-(2**63), 2**63 - 1)


SFC64_FROM = 8192  # words; below, torch's draw is cheaper than seeding a generator (~45 us)


def random_words(n: int) -> torch.Tensor:
    """n random int64 words over the full signed range, from torch's default generator's state: the
    same seed gives the same words, and a checkpoint's RNG state the same masks. From SFC64_FROM
    words on, numpy's SFC64 seeded by one draw of it; below, torch's random_ on it directly (its
    full signed range: random_() with its own bounds leaves the top bit 0, which would bias every
    fourth 16-bit lane)."""
    if n < SFC64_FROM:
        return torch_words(n)
    seed = int(torch.randint(0, 2**62, ()))
    return torch.from_numpy(np.random.SFC64(seed).random_raw(n).view(np.int64))


class _Dropout(torch.autograd.Function):
    """x * keep * scale. Backward keeps the bool mask (1 byte an element, as torch's dropout does),
    not a float one: for attention weights [batch, heads, L, L] in fp32 a float mask was 4 bytes an
    element of what the forward holds for backward. The numbers are those of x * (keep * scale) to
    the bit: times 1 or 0, then the scale, rounded to x's dtype as before."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, p: float) -> torch.Tensor:
        keep, kept = keep_mask(x.shape, p)
        scale = torch.tensor(1.0 / kept, dtype=x.dtype)
        ctx.save_for_backward(keep, scale)
        return x.mul(keep).mul_(scale)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        keep, scale = ctx.saved_tensors
        return grad.mul(keep).mul_(scale), None


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """F.dropout's contract, with the cheaper mask."""
    if not training or p == 0.0:
        return x
    if p >= 1.0:
        return x * 0.0
    return _Dropout.apply(x, p)


class FastDropout(torch.nn.Dropout):
    """nn.Dropout with the cheaper mask (same p, same train/eval switch)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, scaling: float | None = None,
              dropout_p: float = 0.0, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers' attention interface: SDPA without dropout; with it, the eager path and this
    dropout."""
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    p = float(kwargs.pop("dropout", dropout_p))
    if p == 0.0 or not module.training:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                      dropout=0.0, **kwargs)
    groups = int(getattr(module, "num_key_value_groups", 1))
    # grouped-query attention (Llama, Qwen2): each key/value head serves `groups` query heads
    if groups > 1:
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    causal = kwargs.get("is_causal")
    causal = getattr(module, "is_causal", True) if causal is None else causal  # SDPA's default
    # an all-causal mask left to SDPA's is_causal
    if attention_mask is None and causal and query.size(2) > 1:
        attention_mask = torch.ones(query.size(2), key.size(2), dtype=torch.bool).tril()
    scores = torch.matmul(query, key.transpose(2, 3)) * (query.size(-1) ** -0.5 if scaling is None
                                                         else scaling)
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:  # SDPA's mask form: True where a query may attend
            scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + attention_mask
    weights = dropout(torch.softmax(scores, dim=-1), p)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), None


def install(model: torch.nn.Module) -> int:
    """Use FastDropout everywhere in `model`; the number of dropout layers swapped."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    swapped = 0
    for parent in model.modules():
        for name, child in parent.named_children():
            if type(child) is torch.nn.Dropout:
                setattr(parent, name, FastDropout(child.p, child.inplace))
                swapped += 1
    config = getattr(model, "config", None)
    if (getattr(config, "model_type", None) in FAST_ATTENTION
            and getattr(config, "_attn_implementation", None) in ("sdpa", "eager")):
        AttentionInterface.register(ATTENTION, attention)
        AttentionMaskInterface.register(ATTENTION, sdpa_mask)
        config._attn_implementation = ATTENTION  # type: ignore[union-attr]
    return swapped


def attention_used(model: torch.nn.Module) -> str:
    """The attention of training steps: 'cpudist-fast-dropout', or the model's own ('sdpa', 'eager',
    ...)."""
    used = str(getattr(getattr(model, "config", None), "_attn_implementation", None) or "")
    return "cpudist-fast-dropout" if used == ATTENTION else used
