"""A resume whose options change what its checkpoint fixes (optimizer, learning-rate schedule, data
position in micro-batches of --grad-accum) is refused in one line naming each change
(train/resume.py, checkpoint_meta.py): it used to go on with the checkpoint's values and record the
new ones (--max-steps 10, then --resume auto --max-steps 20: 10 steps trained, 20 reported)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cpudist.config import TrainConfig, effective_lr
from cpudist.errors import BadInput
from cpudist.train import resume
from tests.unit.test_checkpoint import meta_of, write

BASE = TrainConfig(task="mrpc", output_dir="o", batch_size=16, max_steps=10, lr=1e-3)


@pytest.mark.parametrize(("change", "named"), [
    ({"max_steps": 20}, "--max-steps: 10 there, 20 here"),
    ({"epochs": 5.0, "max_steps": None},
     "--epochs: 3.0 there, 5.0 here; --max-steps: 10 there, None here"),
    ({"lr": 2e-3}, "--lr: 0.001 there, 0.002 here"),
    ({"grad_accum": 2, "batch_size": 8}, "--grad-accum: 1 there, 2 here"),
    ({"warmup_ratio": 0.0, "weight_decay": 0.1},
     "--weight-decay: 0.01 there, 0.1 here; --warmup-ratio: 0.1 there"),
    ({"optimizer": "sgd"}, "--optimizer: 'adamw' there, 'sgd' here"),
])
def test_a_changed_schedule_is_refused_naming_each_change(change: dict[str, object],
                                                          named: str) -> None:
    meta = meta_of(BASE)
    with pytest.raises(BadInput) as e:
        resume.adapt(dataclasses.replace(BASE, **change), meta, 2, "ck")  # type: ignore[arg-type]
    text = str(e.value)
    assert text.startswith(
        "checkpoint ck was written with other training options (") and named in text, text
    assert "resume with the options of the run that wrote it" in text and "\n" not in text


def test_the_same_options_go_on_and_what_the_checkpoint_adapts_is_not_a_change() -> None:
    meta = meta_of(BASE)
    assert resume.adapt(BASE, meta, 2, "ck").batch_size == 16
    # another world: the global batch is kept
    assert resume.adapt(BASE, meta, 1, "ck").batch_size == 32
    assert resume.adapt(dataclasses.replace(BASE, batch_size=4, max_grad_norm=0.5, log_every=1),
                        meta, 2,
                        # the per-rank batch follows the global batch; clipping applies live
                        "ck").batch_size == 16
    older = dataclasses.replace(meta,
                                config={k: v for k, v in meta.config.items() if k != "optimizer"})
    # a key it lacks: no say
    assert resume.adapt(dataclasses.replace(BASE, optimizer="sgd"), older, 2, "ck")


@pytest.mark.parametrize("scaling", ["auto", "linear", "sqrt"])
def test_lr_scaling_on_another_rank_count_keeps_the_checkpoints_lr(scaling: str) -> None:
    """Another rank count keeps the global batch, so the lr stays what --lr-scaling made it for the
    ranks that wrote the checkpoint (2 here), through a second resume too; it used to be refused."""
    scaled = dataclasses.replace(BASE, lr_scaling=scaling)
    written = effective_lr(scaled, 2)
    assert written > BASE.lr  # each of the three scales 2 ranks' lr
    four = resume.adapt(scaled, meta_of(scaled), 4, "ck")
    assert four.batch_size == 8 and effective_lr(four, 4) == written
    # the 4-rank part's checkpoint, resumed on 1
    one = resume.adapt(scaled, meta_of(four, world=4), 1, "ck")
    assert one.batch_size == 32 and effective_lr(one, 1) == written


def test_auto_is_no_change_where_it_scales_as_the_checkpoints_choice_did() -> None:
    """A checkpoint of --lr-scaling linear (or none on 1 rank) goes on under the default auto; none
    on 2 ranks does not (auto would double its lr), and the refusal names it."""
    auto = dataclasses.replace(BASE, lr_scaling="auto")
    assert resume.adapt(auto, meta_of(dataclasses.replace(BASE, lr_scaling="linear")), 2,
                        "ck").batch_size == 16
    one_rank = meta_of(dataclasses.replace(BASE, lr_scaling="none"), world=1)
    assert effective_lr(resume.adapt(auto, one_rank, 2, "ck"), 2) == BASE.lr
    with pytest.raises(BadInput, match="--lr-scaling: 'none' there, 'auto' here"):
        resume.adapt(auto, meta_of(dataclasses.replace(BASE, lr_scaling="none")), 2, "ck")


def test_refused_before_any_rank_starts(tmp_path: Path) -> None:
    """`cpudist run` calls preflight: a real checkpoint of the run folder, --resume auto with
    --max-steps raised."""
    run = tmp_path / "run"
    write(run / "checkpoints", 5)  # written by mrpc's defaults: max_steps None, epochs 3.0
    cfg = TrainConfig(task="mrpc", output_dir=str(run), resume="auto", max_steps=20)
    with pytest.raises(BadInput,
                       match=r"other training options \(--max-steps: None there, 20 here\)"):
        resume.preflight(cfg, 2)
    resume.preflight(dataclasses.replace(cfg, max_steps=None), 2)


def test_an_elastic_nodes_checkpoint_goes_on_only_as_an_elastic_run_with_its_lr() -> None:
    """An elastic node's checkpoint holds a world of 1 (its share of a global batch planned for
    the run's nodes): taken up by plain ranks it would split that share as if it were the global
    batch, so each side refuses the other's in one line. Resumed elastic, the lr stays the planned
    nodes' (the node writes lr_world)."""
    node = dataclasses.replace(BASE, elastic=True, lr_scaling="linear")
    meta = meta_of(dataclasses.replace(node, lr_world=4), world=1, global_batch=16)
    for cfg, theirs, np in ((BASE, meta, 4), (node, meta_of(BASE), 1)):
        with pytest.raises(BadInput) as e:
            resume.adapt(cfg, theirs, np, "ck")
        assert "elastic" in e.value.message and "\n" not in e.value.message
    again = resume.adapt(node, meta, 1, "ck")
    assert again.batch_size == 16 and effective_lr(again, 4) == 4 * BASE.lr
