"""--save-model best across the parts of a resumed run: each checkpoint carries the best evaluation
so far (meta) and its weights (state.pt, when they are not the model's own), and a resumed part
starts from that best, so the model it saves is the best of the whole run. Real checkpoints written
and read by train/saver.py and train/checkpoint.py (one rank: no process group)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from cpudist.config import TrainConfig
from cpudist.errors import BadInput
from cpudist.train import checkpoint
from cpudist.train.checkpoint_meta import CheckpointMeta, Position
from cpudist.train.keep import Evaluations
from cpudist.train.loop import TrainStats
from cpudist.train.saver import BEST, Saver, Training, restore, save


def _training(evals: Evaluations, seed: int) -> Training:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    return Training(cfg=TrainConfig(task="mrpc", output_dir="run", save_model="best"), model=model,
                    opt=opt, sched=sched, rank=0, world=1, evals=evals)


def _evaluated(evals: Evaluations, step: int, accuracy: float, model: torch.nn.Module) -> None:
    """What Evaluations.run notes after scoring `model` (the scoring itself is evaluate()'s, tested
    elsewhere)."""
    entry = {"step": step, "metrics": {"accuracy": accuracy}, "seconds": 0.1}
    evals.history.append(entry)
    if evals.best is None or accuracy > evals.best["metrics"]["accuracy"]:
        evals.best = entry
        evals.best_state = {k: v.detach().clone() for k,
                            v in model.state_dict().items()} if evals.keep_best else None


def _checkpoint(tmp_path: Path, t: Training, step: int) -> Path:
    stats = TrainStats(steps=step)
    save(Saver(folder=tmp_path / "ckpt", every=None, every_s=None, keep=5), t, stats,
         Position(0, step), total=10)
    return Path(stats.checkpoints[-1])


def _resumed(path: Path, keep_best: bool = True) -> tuple[Evaluations, dict[str, Any]]:
    restored = checkpoint.load(path, 0, 1)
    assert restored is not None
    evals = Evaluations(every=2, metric="accuracy", keep_best=keep_best)
    restore(restored, _training(evals, seed=99), TrainStats())
    return evals, restored.state


def test_the_earlier_best_and_its_weights_come_back(tmp_path: Path) -> None:
    part1 = Evaluations(every=2, metric="accuracy", keep_best=True)
    t = _training(part1, seed=0)
    _evaluated(part1, 2, 0.8, t.model)  # the best, at step 2 ...
    best_weights = {k: v.clone() for k, v in t.model.state_dict().items()}
    with torch.no_grad():
        # ... then training moves on (the weight) and scores worse at step 4
        next(t.model.parameters()).add_(1.0)
    _evaluated(part1, 4, 0.6, t.model)
    path = _checkpoint(tmp_path, t, 4)

    evals, state = _resumed(path)
    assert BEST in state  # the best's weights are not the checkpoint's model: they travel with it
    assert evals.best == {"step": 2, "metrics": {"accuracy": 0.8}, "seconds": 0.1}
    assert evals.best_state is not None and evals.best_state.keys() == best_weights.keys()
    assert all(torch.equal(evals.best_state[k], best_weights[k]) for k in best_weights)
    assert not torch.equal(evals.best_state["weight"], state["model"]["weight"])
    assert evals.history == []  # result.json's evaluations stay this part's
    assert evals.saved("best") is None  # nothing scored in this part yet

    # the resumed part's later evaluation competes with step 2's: lower keeps it, as in one unbroken
    # run
    model = torch.nn.Linear(4, 2)
    _evaluated(evals, 6, 0.7, model)
    assert evals.saved("best") == {"step": 2, "metrics": {"accuracy": 0.8}, "seconds": 0.1}
    _evaluated(evals, 8, 0.9, model)
    best = evals.saved("best")
    assert best is not None and best["step"] == 8


def test_a_best_at_the_checkpoint_is_the_model_itself(tmp_path: Path) -> None:
    """Evaluated at the checkpoint's step (the loop evaluates before it saves): no second copy in
    state.pt."""
    part1 = Evaluations(every=2, metric="accuracy", keep_best=True)
    t = _training(part1, seed=0)
    _evaluated(part1, 4, 0.8, t.model)
    evals, state = _resumed(_checkpoint(tmp_path, t, 4))
    assert BEST not in state
    assert evals.best is not None and evals.best["step"] == 4
    assert evals.best_state is not None
    assert all(torch.equal(evals.best_state[k], v) for k, v in t.model.state_dict().items())


def test_no_weights_to_come_back_means_this_parts_own_best(tmp_path: Path) -> None:
    """A part with --save-model last wrote no best weights: a --save-model best resume cannot save
    the earlier best, so it keeps only its own (never the earlier metrics over this part's weights);
    other ranks keep no weights."""
    # --save-model last (or a rank other than 0)
    part1 = Evaluations(every=2, metric="accuracy", keep_best=False)
    t = _training(part1, seed=0)
    _evaluated(part1, 2, 0.8, t.model)
    with torch.no_grad():
        next(t.model.parameters()).add_(1.0)
    path = _checkpoint(tmp_path, t, 4)
    evals, _ = _resumed(path, keep_best=True)
    assert evals.best is None and evals.best_state is None
    other, _ = _resumed(path, keep_best=False)
    assert other.best is not None and other.best["step"] == 2 and other.best_state is None


def test_the_meta_keeps_the_best_and_older_metas_have_none() -> None:
    raw = {"config": {}, "total": 10, "position": {"epoch": 0, "index": 4}, "world_size": 1,
           "global_batch": 8, "sync": "ddp",
           "stats": {"steps": 4, "samples": 32, "tokens": 0, "flops": 0.0, "train_time_s": 1.0},
           "format": 3, "step": 4}
    assert CheckpointMeta.from_dict(raw, "old").best is None  # written before the best travelled
    meta = CheckpointMeta.from_dict({**raw,
                                     "best": {"step": 2, "metrics": {"f1": 0.5}, "seconds": 1}},
                                    "new")
    assert meta.best == {"step": 2, "metrics": {"f1": 0.5}, "seconds": 1.0}
    assert CheckpointMeta.from_dict(meta.to_dict(), "again") == meta
    with pytest.raises(BadInput, match="cannot be read"):
        CheckpointMeta.from_dict({**raw, "best": [2]}, "bad")
