"""What a Hugging Face Trainer user chooses, under its names: the metric that picks the best
evaluation and its direction, early stopping, when to evaluate and checkpoint, the lr schedule.

    cpudist run mrpc --eval-strategy epoch --metric-for-best-model f1 --early-stopping-patience 2

As TrainingArguments and EarlyStoppingCallback mean them: `metric_for_best_model` names one of the
task's metrics or `eval_loss` (an `eval_` prefix is accepted); a loss is better lower and every
other metric higher unless `greater_is_better` says otherwise; training stops after `patience`
evaluations in a row that did not beat the best before them by more than `threshold`. The schedule
is transformers' `get_scheduler`; --warmup-steps, when given, wins over --warmup-ratio (as HF's
warmup_steps does). No torch here: the CLI checks these before any rank starts.
"""

from __future__ import annotations

from typing import Any

from cpudist.config import TrainConfig
from cpudist.errors import BadInput

EVAL_STRATEGIES = ("auto", "steps", "epoch", "no")  # auto: steps with --eval-every, else no
SAVE_STRATEGIES = ("steps", "epoch", "eval", "no")  # steps: --checkpoint-every/-min as given
LR_SCHEDULERS = ("linear", "cosine", "constant", "constant_with_warmup", "polynomial")
EVAL_LOSS = "eval_loss"


def metric_name(given: str, task_metrics: tuple[str, ...]) -> str:
    """--metric-for-best-model as the evaluations name it ("": the task's first metric)."""
    if not given:
        return task_metrics[0]
    bare = given.removeprefix("eval_")
    name = EVAL_LOSS if bare == "loss" else bare if bare in task_metrics else given
    if name not in (*task_metrics, EVAL_LOSS):
        known = ", ".join((*task_metrics, EVAL_LOSS))
        raise BadInput(f"--metric-for-best-model {given}: this task's evaluations report {known}",
                       "Name one of those")
    return name


def greater_is_better(metric: str, given: bool | None) -> bool:
    """Whether a higher `metric` is better: `given` when set, else lower for a loss, higher else."""
    return given if given is not None else not metric.endswith("loss")


def better(value: float, than: float, greater: bool, by: float = 0.0) -> bool:
    """`value` beats `than` by more than `by`, as HF compares (NaN never beats; any number beats
    NaN, the Pearson's r of constant predictions)."""
    if value != value:
        return False
    if than != than:
        return True
    return (value > than if greater else value < than) and abs(value - than) > by


def eval_strategy(cfg: TrainConfig) -> str:
    """--eval-strategy with auto made what it does: steps when --eval-every is given, else no."""
    if cfg.eval_strategy != "auto":
        return cfg.eval_strategy
    return "steps" if cfg.eval_every else "no"


def warmup_steps(cfg: TrainConfig, total: int) -> int:
    """Warm-up steps of a run of `total` steps: --warmup-steps, else --warmup-ratio's share."""
    return cfg.warmup_steps if cfg.warmup_steps is not None else int(cfg.warmup_ratio * total)


def scheduler(cfg: TrainConfig, optimizer: Any, total: int) -> Any:
    """transformers' scheduler of --lr-scheduler over `total` steps (a resume builds the same and
    loads its state)."""
    from transformers import get_scheduler

    return get_scheduler(cfg.lr_scheduler, optimizer, num_warmup_steps=warmup_steps(cfg, total),
                         num_training_steps=total)


def save_due(strategy: str, evaluated: bool, epoch_end: bool, before_end: bool) -> bool:
    """A checkpoint after this step by --save-strategy (steps: --checkpoint-every's rule, decided
    by the loop): after each evaluation during training (eval), at each epoch's end but the
    last (epoch)."""
    return (strategy == "eval" and evaluated) or (strategy == "epoch" and epoch_end and before_end)


def check(cfg: TrainConfig, task_metrics: tuple[str, ...] | None) -> None:
    """Refuse the combinations that cannot mean what they say; `task_metrics`: the task's where
    known before the ranks read the data (the ranks check a custom task's)."""
    if cfg.lr_scheduler not in LR_SCHEDULERS:
        raise BadInput(f"--lr-scheduler {cfg.lr_scheduler}: unknown",
                       f"Use one of: {', '.join(LR_SCHEDULERS)}")
    if task_metrics is not None:
        metric_name(cfg.metric_for_best_model, task_metrics)
    strategy = eval_strategy(cfg)
    if strategy == "steps" and not cfg.eval_every:
        raise BadInput("--eval-strategy steps evaluates every --eval-every steps, and none is "
                       "given",
                       "Add --eval-every N, or use --eval-strategy epoch")
    if strategy != "steps" and cfg.eval_every:
        raise BadInput(f"--eval-every is for --eval-strategy steps, and this run asks for "
                       f"{strategy}",
                       "Drop --eval-every, or use --eval-strategy steps")
    if strategy != "no" and not cfg.do_eval:
        raise BadInput(f"--eval-strategy {strategy} evaluates, and --no-eval turns evaluations off",
                       "Drop --no-eval, or use --eval-strategy no")
    if cfg.save_strategy == "eval" and strategy == "no":
        raise BadInput("--save-strategy eval writes a checkpoint at each evaluation during "
                       "training, and there is none",
                       "Add --eval-strategy epoch, or --eval-every N")
    if cfg.save_strategy == "no" and (cfg.checkpoint_every or cfg.checkpoint_every_min):
        raise BadInput("--save-strategy no writes no checkpoints, and --checkpoint-every asks for "
                       "some",
                       "Drop one of them")
    if cfg.early_stopping_patience is not None:
        if strategy == "no":
            raise BadInput("--early-stopping-patience counts evaluations during training, and "
                           "there are none", "Add --eval-strategy epoch, or --eval-every N")
        if cfg.save_model == "last":
            raise BadInput("--early-stopping-patience keeps the best model, and --save-model last "
                           "keeps the one it stopped with", "Use --save-model best (or none)")


def stop_reason(metric: str, patience: int, threshold: float, best: dict[str, Any]) -> str:
    """Why the ranks stopped early, in one line."""
    by = f" by more than {threshold:g}" if threshold else ""
    return (f"{metric} did not beat its best{by} in {patience} evaluation(s) in a row; the best, "
            f"{best['metrics'][metric]:.4f}, was at step {best['step']}")
