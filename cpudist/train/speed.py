"""Speed levers of one node, each off unless asked for (benchmarks/README.md has their measured effect).

- freeze_embeddings: the word-embedding table keeps its pretrained values (no gradient, no optimizer
  state): for MiniLM that is half of the parameters, so half of the gradient bytes and AdamW work.
- use_ipex: Intel Extension for PyTorch's `optimize` (archived upstream in 2026; used when installed).
- compile: torch.compile with sequence lengths rounded up to a few static shapes and Inductor's cache
  kept across runs, so a second run loads kernels instead of compiling them.
"""

from __future__ import annotations

from typing import Any

import torch

from cpudist.errors import BadInput

COMPILE_BUCKET = 32  # with --compile, batches are padded to a multiple of this: 4 shapes up to 128 tokens


def freeze_embeddings(model: torch.nn.Module) -> int:
    """Stop training the word embeddings; the number of parameters frozen."""
    table = model.get_input_embeddings()  # type: ignore[operator]
    if table is None:
        raise BadInput("--freeze-embeddings: this model has no input embeddings", "Drop --freeze-embeddings")
    table.weight.requires_grad_(False)
    return int(table.weight.numel())


def use_ipex(model: torch.nn.Module, opt: torch.optim.Optimizer, bf16: bool) -> tuple[Any, Any]:
    """`ipex.optimize(model, optimizer)` in the run's precision; a clear error when IPEX is missing."""
    try:
        import intel_extension_for_pytorch as ipex
    except ImportError as e:  # also IPEX refusing a torch other than its own (it raises at import)
        raise BadInput(f"--ipex: Intel Extension for PyTorch does not import here ({e})",
                       "Install the IPEX that matches this torch, or drop --ipex (upstream torch is the default)",
                       ) from e
    # In place: the caller's handle on the model (evaluation, checkpoints) must see the trained weights.
    dtype = torch.bfloat16 if bf16 else torch.float32
    return ipex.optimize(model, optimizer=opt, dtype=dtype, inplace=True)


def compiled(model: torch.nn.Module) -> Any:
    """The model compiled for static shapes (one graph per padded length; the rank entry point puts Inductor's
    cache in ~/.cpudist/inductor, so later runs load these kernels instead of compiling them)."""
    return torch.compile(model, dynamic=False)
