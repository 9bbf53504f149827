"""The options of `--peft lora` (cpudist/train/lora.py), for `cpudist run` and each run of `cpudist
sweep`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from cpudist.train.lora import DEFAULTS, METHODS

F = TypeVar("F", bound=Callable[..., Any])


def _targets(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, ...]:
    return tuple(t.strip() for t in (value or "").split(",") if t.strip())


def lora_options(command: F) -> F:
    """Add --peft --lora-r --lora-alpha --lora-dropout --lora-targets --lora-modules-to-save
    --merge-lora to a command."""
    options = [
        click.option("--peft", type=click.Choice(METHODS), default="none", show_default=True,
                     help="lora: train low-rank adapters on every Linear of the layers and the "
                          "classifier head in "
                     "full (peft; pip install 'cpudist[lora]'); every other weight is frozen and "
                     "never crosses the wire."),
        click.option("--lora-r", type=click.IntRange(min=1), default=DEFAULTS["lora_r"],
                     show_default=True, help="--peft lora: the adapters' rank."),
        click.option("--lora-alpha", type=click.FloatRange(min=0, min_open=True),
                     default=DEFAULTS["lora_alpha"], show_default=True,
                     help="--peft lora: the adapters' scale is alpha / r."),
        click.option("--lora-dropout", type=click.FloatRange(0, 1, max_open=True),
                     default=DEFAULTS["lora_dropout"],
                     show_default=True,
                     help="--peft lora: dropout on the adapters' input (a mask over every "
                     "adapted Linear's input each step: slower, and no better on MRPC)."),
        click.option("--lora-targets", callback=_targets,
                     help="--peft lora: module names to adapt, comma-separated [default: every "
                          "Linear of the "
                     "layers: query,key,value,dense for BERT, RoBERTa, ELECTRA; "
                     "q_lin,k_lin,v_lin,out_lin,lin1,lin2 for DistilBERT; ...]; query,value "
                     "adapts the attention's query and value only (fewer bytes, lower accuracy: "
                     "benchmarks/README.md)."),
        click.option("--lora-modules-to-save", callback=_targets,
                     help="--peft lora: modules trained in full beside the adapters, "
                          "comma-separated; the classifier "
                     "always is [default: the rest of the family's head: pooler for BERT and "
                     "ALBERT, pre_classifier for DistilBERT, head for ModernBERT; `classifier` "
                     "alone freezes BERT's pooler]."),
        click.option("--merge-lora", is_flag=True,
                     help="--peft lora: save the adapters merged into a plain model (pipeline() "
                          "loads it) instead "
                     "of the adapter alone (loaded with peft on its base model)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command
