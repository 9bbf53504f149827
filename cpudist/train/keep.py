"""The run's evaluations (--eval-strategy: every --eval-every steps or each epoch, and at the
end), the best one's weights for --save-model best, and early stopping.

As HF Trainer's load_best_model_at_end with metric_for_best_model (--metric-for-best-model; the
task's first metric by default: accuracy for MRPC, Matthews' correlation for CoLA, Pearson's r for
STS-B) and greater_is_better (lower for eval_loss, higher for the rest): a later evaluation replaces
the best only when it scores strictly better, so a tie keeps the earlier model. As its
EarlyStoppingCallback: an evaluation during training that does not beat the best before it by more
than --early-stopping-threshold counts towards --early-stopping-patience; every rank holds the same
(broadcast) metrics, so every rank decides alike at the same step. Rank 0 keeps the best weights in
memory (one more copy of the model); the other ranks keep nothing. Each checkpoint holds the best
evaluation so far, the count towards patience and, for --save-model best, the best weights
(train/saver.py), so a resumed run's best is the best of all its parts; its `history`
(result.json's evaluations) is its own part's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from cpudist.train import trainer_choices
from cpudist.train.evaluate import evaluate
from cpudist.train.setup import Job
from cpudist.train.trainer_choices import EVAL_LOSS, better
from cpudist.wire import events


@dataclass(kw_only=True)
class Evaluations:
    """Every evaluation of this part of the run, in order, and the best one's step, metrics and
    (rank 0) weights."""

    every: int | None  # optimizer steps between evaluations during training (None: at the end only)
    metric: str  # what "best" compares
    keep_best: bool  # --save-model best: copy the weights of each new best (rank 0)
    # {"step", "metrics", "seconds", "at"}: "at" is the wall clock (Unix seconds) when it ended, so
    # a benchmark reads the time from its launch to an accuracy (benchmarks/time_to_accuracy.py)
    history: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] | None = None
    best_state: dict[str, torch.Tensor] | None = None
    greater: bool = True  # a higher `metric` is better
    strategy: str = "steps"  # steps (every `every`) | epoch | no: evaluations during training
    patience: int | None = None  # early stopping after this many evaluations (None: never)
    threshold: float = 0.0
    stale: int = 0  # evaluations in a row that did not beat the best before them by `threshold`
    stopped: dict[str, Any] | None = None  # why and where early stopping ended the training

    @classmethod
    def of(cls, job: Job) -> Evaluations:
        cfg = job.cfg
        metric = trainer_choices.metric_name(cfg.metric_for_best_model, job.metrics)
        strategy = trainer_choices.eval_strategy(cfg)
        greater = trainer_choices.greater_is_better(metric, cfg.greater_is_better)
        return cls(every=cfg.eval_every if strategy == "steps" else None, metric=metric,
                   keep_best=cfg.save_model == "best" and job.info.rank == 0, greater=greater,
                   strategy=strategy, patience=cfg.early_stopping_patience,
                   threshold=cfg.early_stopping_threshold)

    def due(self, step: int, total: int, epoch_end: bool = False) -> bool:
        """An evaluation during training after this step (the last step's is the final
        evaluation's); `epoch_end`: the step took an epoch's last batch."""
        if step >= total:
            return False
        if self.strategy == "epoch":
            return epoch_end
        return self.every is not None and step % self.every == 0

    def run(self, job: Job, step: int,
            during: bool = False) -> tuple[dict[str, float], dict[str, float]]:
        """Evaluate the model as it is now (every rank calls it), note it, keep its weights if it is
        the best."""
        model = getattr(job.model, "module", job.model)
        if job.info.rank == 0 and not during:
            events.emit(events.EVAL, rows=len(job.eval_data))
        metrics, phases = evaluate(model, job.eval_data, job.metrics, job.regression,
                                   job.cfg.eval_batch_size, job.bf16, job.info.rank,
                                   job.info.world_size, self.metric == EVAL_LOSS)
        if job.info.rank == 0 and during:
            events.emit(events.EVALUATED, step=step, metrics=metrics)
        self.note(step, metrics, sum(phases.values()), model, during)
        return metrics, phases

    def note(self, step: int, metrics: dict[str, float], seconds: float,
             model: torch.nn.Module | None, during: bool) -> None:
        """Record an evaluation: the history, the best (and its weights), early stopping's count."""
        entry = {"step": step, "metrics": metrics, "seconds": seconds, "at": round(time.time(), 3)}
        self.history.append(entry)
        best = self.best
        before = best if best is not None and self.metric in best["metrics"] else None
        value = metrics[self.metric]
        if before is None or better(value, before["metrics"][self.metric], self.greater):
            self.best = entry
            if self.keep_best and model is not None:
                self.best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if during and self.patience is not None:
            self._count(step, value, before)

    def _count(self, step: int, value: float, before: dict[str, Any] | None) -> None:
        """EarlyStoppingCallback's count: against the best before this evaluation, by more than
        the threshold."""
        assert self.patience is not None and self.best is not None
        improved = before is None or better(value, before["metrics"][self.metric], self.greater,
                                            self.threshold)
        self.stale = 0 if improved else self.stale + 1
        if self.stale >= self.patience:
            best = self.best
            self.stopped = {"step": step, "metric": self.metric, "patience": self.patience,
                            "threshold": self.threshold, "best_step": best["step"],
                            "reason": trainer_choices.stop_reason(self.metric, self.patience,
                                                                  self.threshold, best)}

    def saved(self, save_model: str) -> dict[str, Any] | None:
        """The evaluation whose model --save-model keeps: the best one, or the last (None: no
        evaluation)."""
        if not self.history:
            return None
        return self.best if save_model == "best" else self.history[-1]

