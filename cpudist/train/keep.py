"""The run's evaluations (every --eval-every steps and at the end) and, for --save-model best, the best one's weights.

As HF Trainer's load_best_model_at_end with metric_for_best_model set to the task's first metric (accuracy for
MRPC, Matthews' correlation for CoLA, Pearson's r for STS-B; greater is better): a later evaluation replaces the
best only when it scores strictly higher, so a tie keeps the earlier model. Rank 0 keeps the best weights in memory
(one more copy of the model); the other ranks keep nothing. Each checkpoint holds the best evaluation so far and,
for --save-model best, its weights (train/saver.py), so a resumed run's best is the best of all its parts; its
`history` (result.json's evaluations) is its own part's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from cpudist import events
from cpudist.train.evaluate import evaluate
from cpudist.train.setup import Job


@dataclass
class Evaluations:
    """Every evaluation of this part of the run, in order, and the best one's step, metrics and (rank 0) weights."""

    every: int | None  # optimizer steps between evaluations during training (None: at the end only)
    metric: str  # what "best" compares
    keep_best: bool  # --save-model best: copy the weights of each new best (rank 0)
    # {"step", "metrics", "seconds", "at"}: "at" is the wall clock (Unix seconds) when it ended, so a benchmark reads
    # the time from its launch to an accuracy (benchmarks/time_to_accuracy.py)
    history: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] | None = None
    best_state: dict[str, torch.Tensor] | None = None

    @classmethod
    def of(cls, job: Job) -> Evaluations:
        return cls(job.cfg.eval_every, job.metrics[0], job.cfg.save_model == "best" and job.info.rank == 0)

    def due(self, step: int, total: int) -> bool:
        """An evaluation during training after this step (the last step's is the final evaluation's)."""
        return self.every is not None and step % self.every == 0 and step < total

    def run(self, job: Job, step: int, during: bool = False) -> tuple[dict[str, float], dict[str, float]]:
        """Evaluate the model as it is now (every rank calls it), note it, keep its weights if it is the best."""
        model = getattr(job.model, "module", job.model)
        if job.info.rank == 0 and not during:
            events.emit("eval", rows=len(job.eval_data))
        metrics, phases = evaluate(model, job.eval_data, job.metrics, job.regression, job.cfg.eval_batch_size,
                                   job.bf16, job.info.rank, job.info.world_size)
        if job.info.rank == 0 and during:
            events.emit("evaluated", step=step, metrics=metrics)
        entry = {"step": step, "metrics": metrics, "seconds": sum(phases.values()), "at": round(time.time(), 3)}
        self.history.append(entry)
        if self.best is None or _score(metrics[self.metric]) > _score(self.best["metrics"][self.metric]):
            self.best = entry
            if self.keep_best:
                self.best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        return metrics, phases

    def saved(self, save_model: str) -> dict[str, Any] | None:
        """The evaluation whose model --save-model keeps: the best one, or the last (None: no evaluation)."""
        if not self.history:
            return None
        return self.best if save_model == "best" else self.history[-1]


def _score(value: float) -> float:
    """NaN (Pearson's r of constant predictions) ranks below every number."""
    return value if value == value else float("-inf")
