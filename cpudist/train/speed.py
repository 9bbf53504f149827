"""Speed levers of one node, each off unless asked for (benchmarks/README.md has their measured
effect).

- freeze_embeddings: the word-embedding table keeps its pretrained values (no gradient, no optimizer
  state): for MiniLM that is half of the parameters, so half of the gradient bytes and AdamW work.
- checkpoint_activations: each layer's activations are recomputed during backward instead of kept
  from the forward (transformers' activation checkpointing): a rank's peak memory drops by most of
  the activations, for about one more forward pass of compute. A memory lever, not a speed one: for
  models or batches that do not fit.
- use_ipex: Intel Extension for PyTorch's `optimize` (archived upstream in 2026; used when
  installed).
- compile: torch.compile with sequence lengths rounded up to a few static shapes and Inductor's
  cache kept across runs, so a second run loads kernels instead of compiling them.
"""

from __future__ import annotations

from typing import Any

import torch

from cpudist.errors import BadInput

# with --compile, batches are padded to a multiple of this: 4 shapes up to 128 tokens
COMPILE_BUCKET = 32


def freeze_embeddings(model: torch.nn.Module) -> int:
    """Stop training the word embeddings; the number of parameters frozen."""
    table = model.get_input_embeddings()  # type: ignore[operator]
    if table is None:
        raise BadInput("--freeze-embeddings: this model has no input embeddings",
                       "Drop --freeze-embeddings")
    table.weight.requires_grad_(False)
    return int(table.weight.numel())


def checkpoint_activations(model: torch.nn.Module) -> None:
    """Turn on transformers' activation checkpointing of every layer, non-reentrant
    (torch.utils.checkpoint's recommended mode: it keeps gradients to frozen inputs, as LoRA's, and
    works under DDP). The recompute replays the forward's dropout masks: checkpoint restores the CPU
    generator's state, which cpudist/train/dropout.py draws from as torch's dropout does. Call
    before LoRA wraps the model."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise BadInput(f"--gradient-checkpointing: {type(model).__name__} has no activation "
                       "checkpointing in transformers",
                       "Drop --gradient-checkpointing, or lower --batch-size to use less memory")
    enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5.x's name
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        enable = model.gradient_checkpointing_enable
        enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # type: ignore[operator]


def checkpointed_layers(model: torch.nn.Module) -> int:
    """Layers whose activations a training step recomputes (0: checkpointing off)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    # A layer whose forward is replaced on the instance (cpudist/train/last_layer.py's first-token
    # layer) bypasses the class's checkpointing wrapper: it keeps its (mostly one-token) activations
    # and is not counted.
    return sum(1 for m in model.modules() if isinstance(m, GradientCheckpointingLayer)
               and m.gradient_checkpointing
               and "forward" not in vars(m))


def use_ipex(model: torch.nn.Module, opt: torch.optim.Optimizer, bf16: bool) -> tuple[Any, Any]:
    """`ipex.optimize(model, optimizer)` in the run's precision; a clear error when IPEX is
    missing."""
    try:
        import intel_extension_for_pytorch as ipex
    except ImportError as e:  # also IPEX refusing a torch other than its own (it raises at import)
        raise BadInput(f"--ipex: Intel Extension for PyTorch does not import here ({e})",
                       "Install the IPEX that matches this torch, or drop --ipex (upstream torch "
                       "is the default)",
                       ) from e
    # In place: the caller's handle on the model (evaluation, checkpoints) must see the trained
    # weights.
    dtype = torch.bfloat16 if bf16 else torch.float32
    return ipex.optimize(model, optimizer=opt, dtype=dtype, inplace=True)


def compiled(model: torch.nn.Module) -> Any:
    """The model compiled for static shapes (one graph per padded length; the rank entry point puts
    Inductor's cache in ~/.cpudist/inductor, so later runs load these kernels instead of compiling
    them)."""
    return torch.compile(model, dynamic=False)
