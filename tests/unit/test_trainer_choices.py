"""HF Trainer's choices under its names: the best model's metric and direction, early stopping as
transformers' own EarlyStoppingCallback counts, the eval/save strategies, the lr schedule through
get_scheduler and its exact continuation from a real checkpoint, and run_glue's spelling of the
options (parsed by the real `cpudist run` in --dry-run)."""

from __future__ import annotations

import random
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from cpudist.config import TrainConfig, from_argv, to_argv
from cpudist.errors import BadInput
from cpudist.train import checkpoint, trainer_choices
from cpudist.train.checkpoint_meta import Position
from cpudist.train.keep import Evaluations
from cpudist.train.loop import TrainStats
from cpudist.train.saver import Saver, Training, restore, save
from cpudist.train.trainer_choices import LR_SCHEDULERS, check, metric_name
from tests.integration.helpers import in_process


def cfg_of(**given: Any) -> TrainConfig:
    return TrainConfig(task="mrpc", output_dir="run", **given)


def test_the_metric_is_named_as_the_evaluations_name_it() -> None:
    task = ("accuracy", "f1")
    assert metric_name("", task) == "accuracy"  # the task's first, as before
    assert metric_name("f1", task) == metric_name("eval_f1", task) == "f1"  # HF's prefix accepted
    assert metric_name("eval_loss", task) == metric_name("loss", task) == "eval_loss"
    with pytest.raises(BadInput, match="report accuracy, f1, eval_loss"):
        metric_name("matthews_correlation", task)


def test_a_loss_is_better_lower_the_rest_higher_unless_told() -> None:
    assert not trainer_choices.greater_is_better("eval_loss", None)
    assert trainer_choices.greater_is_better("accuracy", None)
    assert trainer_choices.greater_is_better("eval_loss", True)  # --greater-is-better overrides
    assert not trainer_choices.greater_is_better("pearson", False)
    nan = float("nan")
    assert trainer_choices.better(0.1, nan, True) and not trainer_choices.better(nan, 0.1, True)
    assert trainer_choices.better(0.1, nan, False) and not trainer_choices.better(nan, 0.1, False)


def _hf_stop(values: list[float], greater: bool, patience: int, threshold: float) -> int | None:
    """The evaluation (index) at which transformers' EarlyStoppingCallback stops training, with the
    best metric updated after each evaluation as Trainer._determine_best_metric does."""
    from transformers import EarlyStoppingCallback, TrainerControl, TrainerState

    callback = EarlyStoppingCallback(patience, threshold)
    args = types.SimpleNamespace(metric_for_best_model="accuracy", greater_is_better=greater)
    state, control = TrainerState(), TrainerControl()
    for i, value in enumerate(values):
        callback.on_evaluate(args, state, control, metrics={"eval_accuracy": value})
        if control.should_training_stop:
            return i
        best = state.best_metric
        if best is None or (value > best if greater else value < best):
            state.best_metric = value
    return None


@pytest.mark.parametrize("greater", [True, False])
@pytest.mark.parametrize("threshold", [0.0, 0.05])
def test_early_stopping_stops_where_transformers_callback_does(greater: bool,
                                                                threshold: float) -> None:
    rng = random.Random(7)
    for trial in range(200):
        values = [round(rng.uniform(0, 1), 2) for _ in range(rng.randint(1, 12))]
        patience = rng.randint(1, 4)
        evals = Evaluations(every=1, metric="accuracy", keep_best=False, greater=greater,
                            patience=patience, threshold=threshold)
        mine = None
        for i, value in enumerate(values):
            evals.note(i + 1, {"accuracy": value}, 0.0, None, during=True)
            if evals.stopped is not None:
                mine = i
                break
        assert mine == _hf_stop(values, greater, patience, threshold), (trial, values, patience)
        if mine is not None:
            assert evals.stopped is not None and evals.stopped["step"] == mine + 1
            best = (max if greater else min)(values[: mine + 1])
            assert evals.best is not None and evals.best["metrics"]["accuracy"] == best


def test_the_final_evaluation_does_not_count_towards_patience() -> None:
    evals = Evaluations(every=1, metric="accuracy", keep_best=False, patience=1)
    evals.note(1, {"accuracy": 0.9}, 0.0, None, during=True)
    evals.note(2, {"accuracy": 0.1}, 0.0, None, during=False)
    assert evals.stopped is None and evals.stale == 0


def test_the_strategies_decide_evaluations_and_checkpoints() -> None:
    epoch = Evaluations(every=None, metric="accuracy", keep_best=False, strategy="epoch")
    assert epoch.due(5, 10, epoch_end=True) and not epoch.due(4, 10) and not epoch.due(10, 10, True)
    steps = Evaluations(every=2, metric="accuracy", keep_best=False, strategy="steps")
    assert steps.due(4, 10) and not steps.due(3, 10) and not steps.due(10, 10)
    assert trainer_choices.save_due("eval", True, False, True)
    assert trainer_choices.save_due("epoch", False, True, True)
    assert not trainer_choices.save_due("epoch", False, True, False)  # the last step: model saved
    assert not trainer_choices.save_due("steps", True, True, True)  # --checkpoint-every's own rule
    assert trainer_choices.eval_strategy(cfg_of(eval_every=5)) == "steps"
    assert trainer_choices.eval_strategy(cfg_of()) == "no"


@pytest.mark.parametrize(("given", "said"), [
    ({"eval_strategy": "steps"}, "none is given"),
    ({"eval_strategy": "epoch", "eval_every": 3}, "--eval-every is for --eval-strategy steps"),
    ({"eval_strategy": "epoch", "do_eval": False}, "--no-eval turns evaluations off"),
    ({"save_strategy": "eval"}, "there is none"),
    ({"save_strategy": "no", "checkpoint_every": 5}, "asks for some"),
    ({"early_stopping_patience": 2}, "counts evaluations during training"),
    ({"early_stopping_patience": 2, "eval_every": 5}, "--save-model last keeps the one it stopped"),
    ({"metric_for_best_model": "pearson"}, "report accuracy, f1, eval_loss"),
    ({"lr_scheduler": "cosine_with_restarts"}, "unknown"),
])
def test_what_cannot_mean_what_it_says_is_refused(given: dict[str, Any], said: str) -> None:
    with pytest.raises(BadInput, match=said):
        check(cfg_of(**given), ("accuracy", "f1"))


def test_the_choices_cross_to_the_ranks() -> None:
    cfg = cfg_of(eval_strategy="epoch", greater_is_better=False, early_stopping_patience=3,
                 early_stopping_threshold=0.01, lr_scheduler="cosine", warmup_steps=0,
                 metric_for_best_model="eval_loss", save_strategy="eval")
    assert from_argv(to_argv(cfg)) == cfg


def _lrs(cfg: TrainConfig, total: int, tmp_path: Path, resume_at: int | None) -> list[float]:
    """Every step's lr of a `total`-step run, straight or resumed from a real checkpoint written
    at `resume_at` by a part that stopped there."""
    def part() -> tuple[torch.nn.Module, Any, Any]:
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        return model, opt, trainer_choices.scheduler(cfg, opt, total)

    model, opt, sched = part()
    seen = []
    for step in range(1, total + 1):
        opt.step()
        sched.step()
        seen.append(sched.get_last_lr()[0])
        if step == resume_at:
            t = Training(cfg=cfg, model=model, opt=opt, sched=sched, rank=0, world=1,
                         evals=Evaluations(every=None, metric="accuracy", keep_best=False))
            stats = TrainStats(steps=step)
            save(Saver(folder=tmp_path / "ckpt", every=None, every_s=None, keep=1), t, stats,
                 Position(0, step), total)
            model, opt, sched = part()  # a new process: a fresh optimizer and schedule ...
            restored = checkpoint.load(Path(stats.checkpoints[-1]), 0, 1)
            assert restored is not None
            restore(restored,
                    Training(cfg=cfg, model=model, opt=opt, sched=sched, rank=0, world=1,
                             evals=None), TrainStats())  # resumed
    return seen


@pytest.mark.parametrize("name", LR_SCHEDULERS)
def test_a_resumed_schedule_goes_on_exactly_as_the_straight_one(name: str, tmp_path: Path) -> None:
    from transformers import get_scheduler

    cfg = cfg_of(lr_scheduler=name, warmup_steps=3)
    straight = _lrs(cfg, 12, tmp_path / "a", None)
    assert _lrs(cfg, 12, tmp_path / "b", resume_at=5) == straight  # exactly, not approximately
    opt = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters(), lr=1e-3)
    theirs = get_scheduler(name, opt, num_warmup_steps=3, num_training_steps=12)
    expected = []
    for _ in range(12):
        opt.step()
        theirs.step()
        expected.append(theirs.get_last_lr()[0])
    assert straight == expected  # transformers' own schedule, not one written here


def test_warmup_steps_win_over_the_ratio() -> None:
    assert trainer_choices.warmup_steps(cfg_of(warmup_ratio=0.5), 10) == 5
    assert trainer_choices.warmup_steps(cfg_of(warmup_ratio=0.5, warmup_steps=2), 10) == 2
    assert trainer_choices.warmup_steps(cfg_of(warmup_ratio=0.5, warmup_steps=0), 10) == 0


def test_patience_counted_so_far_survives_a_checkpoint(tmp_path: Path) -> None:
    cfg = cfg_of(early_stopping_patience=3, eval_every=1, save_model="best")
    evals = Evaluations(every=1, metric="accuracy", keep_best=False, patience=3)
    for step, value in enumerate((0.8, 0.7, 0.6), start=1):
        evals.note(step, {"accuracy": value}, 0.0, None, during=True)
    assert evals.stale == 2 and evals.stopped is None
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = trainer_choices.scheduler(cfg, opt, 10)
    stats = TrainStats(steps=3)
    save(Saver(folder=tmp_path, every=None, every_s=None, keep=1),
         Training(cfg=cfg, model=model, opt=opt, sched=sched, rank=0, world=1, evals=evals), stats,
         Position(0, 3), 10)
    restored = checkpoint.load(Path(stats.checkpoints[-1]), 0, 1)
    assert restored is not None
    again = Evaluations(every=1, metric="accuracy", keep_best=False, patience=3)
    restore(restored,
            Training(cfg=cfg, model=model, opt=opt, sched=sched, rank=0, world=1, evals=again),
            TrainStats())
    again.note(4, {"accuracy": 0.75}, 0.0, None, during=True)  # below the best (0.8): the third
    assert again.stopped is not None and again.stopped["best_step"] == 1


def test_run_glue_spelling_reaches_the_ranks_as_cpudist_options(tmp_path: Path) -> None:
    r = in_process("run", "--model_name_or_path", "tiny", "--task_name", "mrpc", "--do_train",
                   "--do_eval", "--max_seq_length", "64", "--per_device_train_batch_size", "8",
                   "--learning_rate", "3e-4", "--num_train_epochs", "2", "--output_dir",
                   tmp_path / "out", "--lr_scheduler_type", "cosine", "--warmup_steps", "2",
                   "--eval_strategy", "epoch", "--load_best_model_at_end",
                   "--metric_for_best_model", "f1", "--save_total_limit", "3", "--logging_steps",
                   "5", "--dry-run",
                   env={"HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr
    rank = r.stdout.split(" -m cpudist.rank ", 1)[1].split()
    assert rank[0] == "--task=mrpc" and f"--output-dir={tmp_path / 'out'}" in rank
    for word in ("--model=tiny", "--max-seq-len=64", "--batch-size=8", "--lr=0.0003",
                 "--epochs=2.0",
                 "--lr-scheduler=cosine", "--warmup-steps=2", "--eval-strategy=epoch",
                 "--save-model=best", "--metric-for-best-model=f1", "--keep-checkpoints=3",
                 "--log-every=5"):
        assert word in rank, (word, rank)
    refused = in_process("run", "mrpc", "--fp16", "--dry-run", env={})
    assert refused.returncode == 2 and "--fp16 has no cpudist counterpart" in refused.stderr
