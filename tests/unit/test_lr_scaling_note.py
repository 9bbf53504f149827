"""What `cpudist run` (and --dry-run) says before a multi-rank run about its learning rate
(run/request.py): the lr the ranks will use and the rule that chose it, or, unscaled, what that
costs."""

from __future__ import annotations

import dataclasses

import pytest

from cpudist.config import TrainConfig, effective_lr
from cpudist.run.request import lr_note
from cpudist.wire.payload import Script

BASE = TrainConfig(task="mrpc", output_dir="o", batch_size=32, lr=5e-5)


def test_one_rank_says_nothing() -> None:
    assert lr_note(BASE, 1) is None


@pytest.mark.parametrize(("change", "said", "lr"), [
    ({},
     "lr 5e-05 x 4 = 0.0002 (--lr-scaling auto: linear on more than one rank; --lr-scaling none "
     "keeps 5e-05)",
     2e-4),
    ({"peft": "lora", "lr": 1e-3},
     "lr 0.001 x sqrt(4) = 0.002 (--lr-scaling auto: sqrt for LoRA on more than one rank", 2e-3),
    ({"lr_scaling": "linear", "peft": "lora"}, "lr 5e-05 x 4 = 0.0002 (--lr-scaling linear;", 2e-4),
    ({"lr_scaling": "sqrt"}, "lr 5e-05 x sqrt(4) = 0.0001 (--lr-scaling sqrt;", 1e-4),
])
def test_the_note_gives_the_lr_the_ranks_use_and_the_rule(change: dict[str, object], said: str,
                                                          lr: float) -> None:
    cfg = dataclasses.replace(BASE, **change)  # type: ignore[arg-type]
    note = lr_note(cfg, 4)
    assert note is not None and note.startswith(
        "4 ranks x batch 32 = global batch 128: ") and said in note, note
    # what the ranks train at (train/loop.py) is what was said
    assert effective_lr(cfg, 4) == pytest.approx(lr)
    assert note.endswith(")")
    resumed = lr_note(dataclasses.replace(cfg, resume="auto"), 4) or ""
    # train/resume.py
    assert resumed.endswith("; a resume on another rank count keeps its checkpoint's lr")


def test_unscaled_says_what_it_costs_and_a_script_or_synthetic_run_is_left_alone() -> None:
    none = dataclasses.replace(BASE, lr_scaling="none")
    note = lr_note(none, 4) or ""
    assert "1/4 of one rank's optimizer steps per epoch at the same --lr 5e-05" in note
    assert lr_note(dataclasses.replace(none, task="synthetic"), 4) is None  # no accuracy to lose
    assert lr_note(BASE, 4, Script(command=("train.py",))) is None  # the script's lr is its own
