"""The options a Hugging Face Trainer user reaches for (cpudist/train/trainer_choices.py), and
the names of TrainingArguments and run_glue.py accepted beside cpudist's own, for `cpudist run`
and each run of `cpudist sweep`.

    cpudist run --model_name_or_path ./bert --task_name mrpc --do_train --do_eval \\
        --max_seq_length 128 --per_device_train_batch_size 32 --learning_rate 2e-5 \\
        --num_train_epochs 3 --output_dir runs/mrpc

An alias is a hidden option that stores into its cpudist option's parameter: the value goes
through that option's own type and checks, and --help lists cpudist's names only (its section
heading says that the others work).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from cpudist.config import TrainConfig
from cpudist.errors import BadInput
from cpudist.train import trainer_choices
from cpudist.train.tasks import GLUE_TASKS
from cpudist.train.trainer_choices import EVAL_STRATEGIES, LR_SCHEDULERS, SAVE_STRATEGIES

F = TypeVar("F", bound=Callable[..., Any])

HEADING = "Evaluation, early stopping, schedule (HF Trainer's --snake_case names work too)"
SECTION = ("eval_strategy", "save_strategy", "metric_for_best_model", "greater_is_better",
           "early_stopping_patience", "early_stopping_threshold", "lr_scheduler", "warmup_steps")

# HF's name -> the parameter of the cpudist option it stands for (docs: the migration table)
ALIASES: dict[str, str] = {
    "--model_name_or_path": "model", "--tokenizer_name": "tokenizer",
    "--max_seq_length": "max_seq_len", "--per_device_train_batch_size": "batch_size",
    "--per_device_eval_batch_size": "eval_batch_size",
    "--gradient_accumulation_steps": "grad_accum",
    "--num_train_epochs": "epochs", "--max_steps": "max_steps", "--learning_rate": "lr",
    "--weight_decay": "weight_decay", "--warmup_ratio": "warmup_ratio",
    "--warmup_steps": "warmup_steps", "--lr_scheduler_type": "lr_scheduler",
    "--max_grad_norm": "max_grad_norm", "--output_dir": "output_dir", "--train_file": "train_file",
    "--validation_file": "validation_file", "--max_train_samples": "max_train_samples",
    "--max_eval_samples": "max_eval_samples", "--eval_strategy": "eval_strategy",
    "--evaluation_strategy": "eval_strategy", "--eval_steps": "eval_every",
    "--save_strategy": "save_strategy", "--save_steps": "checkpoint_every",
    "--save_total_limit": "keep_checkpoints", "--logging_steps": "log_every",
    "--metric_for_best_model": "metric_for_best_model",
    "--early_stopping_patience": "early_stopping_patience",
    "--early_stopping_threshold": "early_stopping_threshold",
    "--resume_from_checkpoint": "resume", "--report_to": "report_to", "--ddp_backend": "backend",
}
# HF's flags -> (the parameter they set, its value); a parameter of no cpudist option: a no-op
FLAGS: dict[str, tuple[str, Any]] = {
    "--do_eval": ("do_eval", True), "--load_best_model_at_end": ("save_model", "best"),
    "--greater_is_better": ("greater_is_better", True), "--bf16": ("precision", "bf16"),
    "--do_train": ("hf_do_train", True), "--use_cpu": ("hf_use_cpu", True),
    "--no_cuda": ("hf_no_cuda", True), "--torch_compile": ("compile", True),
    "--gradient_checkpointing": ("gradient_checkpointing", True),
}
REFUSED: dict[str, str] = {
    "--fp16": "CPUs train in bf16 or fp32 here: use --bf16 (or --precision bf16)",
    "--do_predict": "Predict with the saved model afterwards: cpudist predict RUN --file FILE",
}


def _task_name(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """--task_name: TASK when the argument is not given (a default the argument falls back on)."""
    if value is not None:
        ctx.default_map = {**(ctx.default_map or {}), "task": value}


def _refuse(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    if value:
        flag = param.opts[0]
        raise BadInput(f"{flag} has no cpudist counterpart", REFUSED[flag])


def _aliases() -> list[Callable[[Any], Any]]:
    """The hidden options: HF's names, each storing into its cpudist option's parameter."""
    said = "HF's name of the option whose parameter is {}."
    out = [click.option(flag, name, hidden=True, expose_value=False, help=said.format(name))
           for flag, name in ALIASES.items()]
    out += [click.option(flag, name, is_flag=True, flag_value=value, default=None, hidden=True,
                         expose_value=False, help=f"HF's flag: {name} = {value!r}.")
            for flag, (name, value) in FLAGS.items()]
    out += [click.option(flag, is_flag=True, hidden=True, expose_value=False, callback=_refuse,
                         help=f"Refused: {REFUSED[flag]}.") for flag in REFUSED]
    out.append(click.option("--task_name", "--task-name", "hf_task_name", hidden=True,
                            expose_value=False, is_eager=True, callback=_task_name,
                            help="run_glue.py's name of the TASK argument."))
    return out


def hf_options(command: F) -> F:
    """Add the HF Trainer options (eval and save strategy, best-model metric, early stopping,
    schedule) and the hidden HF-named aliases of cpudist's options to a command."""
    options = [
        click.option("--eval-strategy", type=click.Choice(EVAL_STRATEGIES), default="auto",
                     show_default=True,
                     help="Evaluate during training every --eval-every steps (steps), at each "
                     "epoch's end (epoch), or not (no); auto: steps with --eval-every, else no. "
                     "The final evaluation follows --eval/--no-eval."),
        click.option("--save-strategy", type=click.Choice(SAVE_STRATEGIES), default="steps",
                     show_default=True,
                     help="Checkpoints every --checkpoint-every steps or -min minutes (steps), at "
                     "each epoch's end (epoch), after each evaluation during training, holding the "
                     "best so far (eval: follows --eval-strategy), or none (no)."),
        click.option("--metric-for-best-model", default="", metavar="NAME",
                     help="What --save-model best and early stopping compare: a metric the task "
                     "reports (accuracy, f1, matthews_correlation, pearson, ...) or eval_loss "
                     "[default: the task's first]."),
        click.option("--greater-is-better/--no-greater-is-better", default=None,
                     help="Whether a higher --metric-for-best-model is better [default: lower for "
                     "eval_loss, higher for the rest]."),
        click.option("--early-stopping-patience", type=click.IntRange(min=1), metavar="N",
                     help="Stop after N evaluations in a row without improvement of "
                     "--metric-for-best-model (HF's EarlyStoppingCallback); keeps the best model "
                     "(--save-model best unless given)."),
        click.option("--early-stopping-threshold", type=click.FloatRange(min=0), default=0.0,
                     show_default=True,
                     help="An improvement counts for early stopping when it is larger than this."),
        click.option("--lr-scheduler", type=click.Choice(LR_SCHEDULERS), default="linear",
                     show_default=True,
                     help="The learning rate after the warm-up (transformers' get_scheduler)."),
        click.option("--warmup-steps", type=click.IntRange(min=0),
                     help="Optimizer steps of lr warm-up; wins over --warmup-ratio when given."),
    ]
    for option in reversed([*options, *_aliases()]):
        command = option(command)
    return command


def with_hf_defaults(cfg: TrainConfig, ctx: click.Context,
                     say: Callable[[str], None]) -> TrainConfig:
    """Early stopping keeps the best model: --save-model best where it was not given (HF's
    load_best_model_at_end); then the HF choices checked, against the task's metrics if known."""
    given = ctx.get_parameter_source("save_model") not in (None, ParameterSource.DEFAULT)
    if cfg.early_stopping_patience is not None and cfg.save_model == "last" and not given:
        cfg = dataclasses.replace(cfg, save_model="best")
        say("--early-stopping-patience keeps the best model: --save-model best")
    glue = GLUE_TASKS.get(cfg.task)
    known = glue.metrics if glue is not None else ("accuracy",) if cfg.task == "synthetic" else None
    trainer_choices.check(cfg, known)
    return cfg
