"""The job spec every rank receives, and its round trip through a command line.

The launcher passes the spec as ordinary `--flag value` pairs (not one JSON blob) so that the
printed `mpirun` command stays readable and survives the shell quoting of SSH launchers.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any

from cpudist.errors import BadInput
from cpudist.strategies import STRATEGIES, SyncSpec
from cpudist.sync_flags import ASKED, flag
from cpudist.wire import programs

POWERSGD_START_SHARE = 0.1  # PowerSGD's plain fp32 steps before it compresses: 10% of the run
PRECISIONS = ("auto", "fp32", "bf16")
SAMPLERS = ("random", "grouped")
BACKENDS = ("gloo", "ccl")
OPTIMIZERS = ("adamw", "sgd")
MOMENTS = ("none", "first", "second", "both")
LR_SCALINGS = ("auto", "none", "linear", "sqrt")
SAVE_MODELS = ("last", "best", "none")


def lr_scaling_on(cfg: TrainConfig, world: int) -> str:
    """What --lr-scaling does on `world` ranks: auto is none on one rank; on more, linear, or sqrt
    for LoRA.

    A multi-rank run grows the global batch and takes 1/world of one rank's optimizer steps, so an
    unscaled lr loses accuracy (benchmarks/results/accuracy-scaling.md); LoRA keeps more of it with
    sqrt. A resume on another rank count keeps the checkpoint's global batch, so it scales by the
    rank count that wrote it (cfg.lr_world).
    """
    return resolved_scaling(cfg.lr_scaling, cfg.lr_world or world, cfg.peft)


def resolved_scaling(lr_scaling: str, ranks: int, peft: str = "none") -> str:
    """--lr-scaling with auto made what it does on `ranks` ranks (lr_scaling_on)."""
    if lr_scaling != "auto":
        return lr_scaling
    return "none" if ranks == 1 else "sqrt" if peft == "lora" else "linear"


def resolved_compression(text: str, sync: str, across_nodes: bool) -> str:
    """--grad-compression with auto made what it does: bf16 for ddp when the ranks span more than
    one node, else none. Across nodes the wire is what a step waits for
    (benchmarks/results/time-to-accuracy-*.md); within one node the bytes cost little."""
    if text != "auto":
        return text
    return "bf16" if sync == "ddp" and across_nodes else "none"


def effective_lr(cfg: TrainConfig, world: int) -> float:
    """--lr for one rank's batch, scaled to the global batch of `world` ranks as --lr-scaling asks.

    linear: Goyal et al.'s rule (batch k times larger, learning rate k times larger, with warm-up);
    sqrt: the gentler rule often used with Adam. Local SGD as well: each rank steps on its own
    batch, but the average of the ranks' steps is what the model keeps, which moves it as far as one
    step on the global batch (what each rule costs in accuracy: benchmarks/README.md).
    """
    ranks = cfg.lr_world or world
    scaling = resolved_scaling(cfg.lr_scaling, ranks, cfg.peft)
    if scaling == "none":
        return cfg.lr
    return cfg.lr * (ranks if scaling == "linear" else ranks**0.5)  # one rank: x 1 either way


@dataclass(kw_only=True, frozen=True)
class TrainConfig:
    """Everything a rank needs to train and evaluate one model on one task."""

    task: str
    output_dir: str
    model: str = "bert-base-uncased"
    tokenizer: str | None = None
    data_dir: str | None = None
    train_file: str | None = None
    validation_file: str | None = None
    text_columns: tuple[str, ...] = ()
    label_column: str | None = None
    max_seq_len: int = 128
    batch_size: int = 16
    eval_batch_size: int = 64
    grad_accum: int = 1
    epochs: float = 3.0
    max_steps: int | None = None
    lr: float = 2e-5
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    seed: int = 42
    precision: str = "auto"
    backend: str = "gloo"
    sampler: str = "grouped"  # grouped: length-grouped global batches; random: DistributedSampler
    dropout: float | None = None
    max_train_samples: int | None = None
    max_eval_samples: int | None = None
    synthetic_samples: int = 2048
    do_eval: bool = True
    # optimizer steps between evaluations during training (HF's eval_steps)
    eval_every: int | None = None
    # HF Trainer's choices under its names (cpudist/train/trainer_choices.py)
    eval_strategy: str = "auto"  # auto (steps with eval_every, else no) | steps | epoch | no
    save_strategy: str = "steps"  # steps (checkpoint_every) | epoch | eval (at evaluations) | no
    metric_for_best_model: str = ""  # a task metric or eval_loss ("": the task's first metric)
    greater_is_better: bool | None = None  # None: lower for a loss, higher for the rest
    early_stopping_patience: int | None = None  # evaluations without improvement, then stop
    early_stopping_threshold: float = 0.0  # an improvement counts when larger than this
    lr_scheduler: str = "linear"  # transformers' get_scheduler name
    warmup_steps: int | None = None  # wins over warmup_ratio when given
    # last | best | none: the weights rank 0 writes to <output_dir>/model (train/export.py)
    save_model: str = "last"
    # tensorboard, mlflow: rank 0 writes step metrics, evaluations (train/report_to.py)
    report_to: tuple[str, ...] = ()
    # --report-to mlflow's tracking URI (default: <output_dir>/mlruns, a file store)
    mlflow_uri: str | None = None
    log_every: int = 10
    dist_timeout_s: int = 300
    max_grad_norm: float = 1.0  # like HF Trainer; 0 turns clipping off
    checkpoint_every: int | None = None  # optimizer steps between checkpoints
    # minutes between checkpoints (rank 0's clock decides)
    checkpoint_every_min: float | None = None
    checkpoint_dir: str | None = None  # default: <output_dir>/checkpoints
    keep_checkpoints: int = 2
    checkpoint_s3: str | None = None  # s3://bucket/prefix: a durable copy of every checkpoint
    # s3://bucket/prefix: rank 0 copies the saved model there (train/model_upload.py)
    model_s3: str | None = None
    # auto: the newest usable checkpoint, if any | a checkpoint or its folder
    resume: str | None = None
    resume_required: bool = False  # a recovery's part: no checkpoint found stops it, never step 0
    # where staging took the model from (the launching side's absolute path): a LoRA adapter
    # names its base there, so it loads where the model comes home, not from a node's stage folder
    model_given: str = ""
    # the run's id (cpudist/run/identity.py), given by `cpudist run`; a resume keeps the run's
    run_id: str = ""
    imds: str = "auto"  # spot notices: auto (AWS's metadata service on EC2) | off | URL
    # the word-embedding table is not trained (cpudist/train/speed.py)
    freeze_embeddings: bool = False
    # activations recomputed in backward, not kept (cpudist/train/speed.py)
    gradient_checkpointing: bool = False
    compile: bool = False  # torch.compile, batches padded to a few static lengths
    ipex: bool = False  # Intel Extension for PyTorch's optimize(), when installed
    # dropout masks from 16-bit lanes of 64-bit draws (cpudist/train/dropout.py)
    fast_dropout: bool = True
    # the last layer computes [CLS] only (cpudist/train/last_layer.py)
    first_token_last_layer: bool = True
    # --peft lora: adapters on the attention, the head in full, all else frozen
    # (cpudist/train/lora.py)
    peft: str = "none"  # none | lora
    lora_r: int = 8
    lora_alpha: float = 16.0
    # none on the adapters' input, as peft's own default: a mask per adapted Linear costs a large
    # share of a step and accuracy did not need it (benchmarks/results/lora-step-profile-*.txt)
    lora_dropout: float = 0.0
    lora_targets: tuple[str, ...] = ()  # empty: every Linear of the family's layers (train/lora.py)
    # trained in full beside the classifier; empty: the family's head
    lora_modules_to_save: tuple[str, ...] = ()
    # save the adapters merged into a plain model instead of the adapter alone
    merge_lora: bool = False
    # auto | none | linear | sqrt: --lr times world size (or its root), every sync
    lr_scaling: str = "auto"
    # a resume on another rank count: the rank count that wrote the checkpoint (0: this run's)
    lr_world: int = 0
    # sgd: plain SGD (no momentum), linear in the gradient: for teaching and checks
    optimizer: str = "adamw"
    # how the ranks agree on the model: --sync and its knobs, as asked (cpudist/strategies.py)
    sync: SyncSpec = ASKED
    # each node a torchft replica group that may leave and join (cpudist/train/elastic.py)
    elastic: bool = False


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _encode(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def to_argv(cfg: TrainConfig) -> list[str]:
    """Render a config as `--flag=value` words; defaults are left out to keep commands short.
    TrainConfig.sync's knobs are flags of their own (--sync, --sync-every ...), as `cpudist run`
    takes them."""
    argv: list[str] = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.name == "sync":
            argv += [f"{_flag(flag(k))}={_encode(getattr(value, k.name))}"
                     for k in dataclasses.fields(SyncSpec)
                     if getattr(value, k.name) != getattr(ASKED, k.name)]
        elif value is not None and value != _default(f):
            argv.append(f"{_flag(f.name)}={_encode(value)}")  # `=`: a value may start with "-"
    return argv


def _base_type(hint: Any) -> Any:
    """`int | None` -> int; other hints unchanged."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0]
    return hint


def _decoder(hint: Any) -> Any:
    base = _base_type(hint)
    if base is bool:
        return lambda s: s in ("1", "true", "True")
    if typing.get_origin(base) is tuple:
        return lambda s: tuple(p for p in s.split(",") if p)
    return base


def from_argv(argv: list[str]) -> TrainConfig:
    """Parse what `to_argv` rendered back into a TrainConfig."""
    hints = typing.get_type_hints(TrainConfig)
    knobs = typing.get_type_hints(SyncSpec)
    parser = argparse.ArgumentParser(prog=programs.usage(programs.RANK))
    for f in dataclasses.fields(TrainConfig):
        if f.name != "sync":
            parser.add_argument(_flag(f.name), dest=f.name, type=_decoder(hints[f.name]),
                                required=_default(f) is dataclasses.MISSING,
                                default=argparse.SUPPRESS)
    for k in dataclasses.fields(SyncSpec):
        parser.add_argument(_flag(flag(k)), dest="sync." + k.name, type=_decoder(knobs[k.name]),
                            default=argparse.SUPPRESS)
    given = vars(parser.parse_args(argv))
    sync = {k.removeprefix("sync."): given.pop(k) for k in list(given) if k.startswith("sync.")}
    return TrainConfig(**given, sync=dataclasses.replace(ASKED, **sync))


def check_save(cfg: TrainConfig) -> None:
    """--save-model best and --eval-every: refused where they cannot mean what they say."""
    if cfg.save_model not in SAVE_MODELS:
        raise BadInput(f"--save-model {cfg.save_model}: unknown",
                       f"Use one of: {', '.join(SAVE_MODELS)}")
    if cfg.model_s3 and cfg.save_model == "none":
        raise BadInput("--model-s3 copies the saved model, and --save-model none saves none",
                       "Drop --model-s3, or pick --save-model last or best")
    if not cfg.do_eval and (cfg.save_model == "best" or cfg.eval_every):
        what = "--save-model best" if cfg.save_model == "best" else "--eval-every"
        raise BadInput(f"{what} needs evaluations, and --no-eval turns them off",
                       f"Drop --no-eval or {what}")
    sync = cfg.sync
    if cfg.eval_every and sync.strategy == "local-sgd" and (cfg.eval_every % sync.sync_every
                                                            or sync.local_sgd_warmup
                                                            % sync.sync_every):
        # Between averages every rank holds its own model: an evaluation there would score a mix of
        # them.
        raise BadInput(f"--eval-every {cfg.eval_every} with --sync local-sgd evaluates between "
                       "parameter averages, where the ranks' models differ",
                       f"Give --eval-every a multiple of --sync-every {sync.sync_every} (and "
                       "--local-sgd-warmup too)")


def spec_of(cfg: TrainConfig, total_steps: int) -> SyncSpec:
    """The SyncSpec the run trains with: auto resolved, warm-ups worked out from its length."""
    sync = cfg.sync
    if sync.strategy not in STRATEGIES:
        raise BadInput(f"--sync {sync.strategy}: unknown", f"Use one of: {', '.join(STRATEGIES)}")
    # a rank resolved auto already (train/main.py knows the nodes); elsewhere, as on one node
    return dataclasses.replace(
        sync, grad_compression=resolved_compression(sync.grad_compression, sync.strategy, False),
        powersgd_start=max(2, round(POWERSGD_START_SHARE * total_steps)),
        local_sgd_warmup=sync.local_sgd_warmup if sync.strategy == "local-sgd" else 0)
