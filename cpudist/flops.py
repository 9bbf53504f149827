"""Model FLOPs of training a BERT-family encoder, and this CPU's peak, for MFU.

Training FLOPs of one sequence of l real tokens (padding excluded), after Kaplan et al. and the PaLM
MFU definition: 3 x forward, forward = 2 x N x l for the weight matmuls (N: parameters outside the
embeddings) + 4 x L x h x l^2 for attention scores and their weighted sum. When the last layer
computes the first token only (cpudist/train/last_layer.py), the work it skips is not counted: its
weights other than keys and values meet 1 token instead of l, and its attention has 1 query instead
of l. Peak FLOP/s = cores x clock x FLOP per cycle of the vector units: 2 FMA pipes x lanes x 2.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cpudist.cpu import CpuInfo

# fp32 lanes per FMA pipe and pipes per core, by the widest vector extension present.
VECTOR_UNITS = (("avx512f", 16, 2), ("avx2", 8, 2), ("", 4, 2))


@dataclass(frozen=True)
class ModelShape:
    """What the FLOP count needs from a model config."""

    non_embedding_params: int
    layers: int
    hidden: int
    # the last layer's weights that meet only the first token (0: every token)
    first_token_only_params: int = 0


def training_flops(shape: ModelShape, lengths: Iterable[int]) -> float:
    """FLOPs of one forward+backward pass over sequences of these real lengths."""
    skipped = shape.first_token_only_params
    return float(sum(3
                     * (2 * shape.non_embedding_params * n + 4 * shape.layers * shape.hidden * n * n
                        - (2 * skipped * (n - 1) + 4 * shape.hidden * (n * n - n) if skipped
                           else 0))
                     for n in lengths))


def shape_of(model: object) -> ModelShape:
    """Parameter count without embeddings, layers and hidden size of a transformers model."""
    config = model.config  # type: ignore[attr-defined]
    params = sum(p.numel() for name, p in model.named_parameters()  # type: ignore[attr-defined]
                 if "embeddings" not in name)
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layers", None) or 0
    hidden = getattr(config, "hidden_size", None) or getattr(config, "dim", None) or 0
    return ModelShape(params, int(layers), int(hidden))


@dataclass(frozen=True)
class Peak:
    """Peak FLOP/s of the cores a job uses, and how it was computed."""

    fp32: float
    bf16: float
    how: str


def peak_flops(cpu: CpuInfo, cores: int, ghz: float) -> Peak:
    """cores x GHz x FLOP/cycle; bf16 doubles it only with native bf16 dot products
    (AVX512-BF16/AMX)."""
    flag, lanes, pipes = next(v for v in VECTOR_UNITS if not v[0] or v[0] in cpu.flags)
    per_cycle = pipes * lanes * 2  # an FMA is 2 FLOPs
    fp32 = cores * ghz * 1e9 * per_cycle
    if "amx_bf16" in cpu.flags:
        bf16, note = cores * ghz * 1e9 * 1024, "AMX: 1024 bf16 FLOP/cycle/core"
    elif "avx512_bf16" in cpu.flags:
        bf16, note = 2 * fp32, "AVX512-BF16: 2x the fp32 FMA rate"
    else:
        bf16, note = fp32, "no native bf16: bf16 runs at (at best) the fp32 rate"
    how = (f"{cores} cores x {ghz:.3f} GHz x {per_cycle} fp32 FLOP/cycle ({pipes} FMA pipes x "
           f"{lanes} lanes of {flag or 'SSE'} x 2); {note}")
    return Peak(fp32, bf16, how)


def cpu_ghz(cpuinfo: str) -> float:
    """The clock from /proc/cpuinfo's `cpu MHz` (base clock under a hypervisor)."""
    for line in cpuinfo.splitlines():
        if line.startswith("cpu MHz"):
            return float(line.split(":")[1]) / 1000
    return 0.0
