from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from cpudist.config import TrainConfig, from_argv, to_argv
from cpudist.strategies import SyncSpec
from cpudist.sync_flags import ASKED

names = st.text(alphabet=st.characters(categories=["L", "N"], include_characters="_-."), min_size=1,
                max_size=12)


@given(
    batch=st.integers(1, 512),
    epochs=st.floats(0.01, 100, allow_nan=False),
    max_steps=st.none() | st.integers(1, 10_000),
    dropout=st.none() | st.floats(0, 1),
    columns=st.lists(names, min_size=0, max_size=2).map(tuple),
    do_eval=st.booleans(),
    model=names,
)
def test_argv_round_trip(batch: int, epochs: float, max_steps: int | None, dropout: float | None,
                         columns: tuple[str, ...], do_eval: bool, model: str) -> None:
    cfg = TrainConfig(task="mrpc", output_dir="out dir", model=model, batch_size=batch,
                      epochs=epochs,
                      max_steps=max_steps, dropout=dropout, text_columns=columns, do_eval=do_eval)
    assert from_argv(to_argv(cfg)) == cfg


def test_defaults_are_left_out() -> None:
    assert to_argv(TrainConfig(task="sst2", output_dir="o")) == ["--task=sst2", "--output-dir=o"]


def test_lr_scaling_follows_the_global_batch_of_every_strategy() -> None:
    from cpudist.config import effective_lr

    base = TrainConfig(task="mrpc", output_dir="", lr=1e-4)
    assert base.lr_scaling == "auto"
    assert effective_lr(base, 4) == 4e-4 and effective_lr(base, 1) == 1e-4
    assert effective_lr(dataclasses.replace(base, lr_scaling="none"), 4) == 1e-4
    # resumed on 4 ranks, written by 2: the global batch was kept
    resumed = dataclasses.replace(base, lr_world=2)
    assert effective_lr(resumed, 4) == 2e-4 and effective_lr(resumed, 1) == 2e-4
    # auto chose none for the 1-rank run
    assert effective_lr(dataclasses.replace(base, lr_world=1), 4) == 1e-4
    assert effective_lr(TrainConfig(task="mrpc", output_dir="", lr=1e-4, lr_scaling="linear"),
                        4) == 4e-4
    assert effective_lr(TrainConfig(task="mrpc", output_dir="", lr=1e-4, lr_scaling="sqrt"),
                        4) == 2e-4
    assert effective_lr(TrainConfig(task="mrpc", output_dir="", lr=1e-4, lr_scaling="sqrt"),
                        1) == 1e-4
    local = TrainConfig(task="mrpc", output_dir="", lr=1e-4, lr_scaling="linear",
                        sync=SyncSpec(strategy="local-sgd"))
    # the ranks' averaged steps move the model as one global-batch step
    assert effective_lr(local, 4) == 4e-4


def test_the_sync_crosses_as_run_s_own_flags() -> None:
    """TrainConfig.sync nests; a rank's command line spells it as `cpudist run` does, defaults
    left out."""
    assert to_argv(TrainConfig(task="mrpc", output_dir="o", sync=ASKED)) == ["--task=mrpc",
                                                                              "--output-dir=o"]
    local = TrainConfig(task="mrpc", output_dir="o",
                        sync=SyncSpec(strategy="local-sgd", grad_compression="bf16", sync_every=4,
                                      outer_optimizer="nesterov", outer_lr=0.5, bucket_cap_mb=2.5))
    argv = to_argv(local)
    assert {"--sync=local-sgd", "--grad-compression=bf16", "--sync-every=4",
            "--outer-optimizer=nesterov", "--outer-lr=0.5", "--bucket-cap-mb=2.5"} <= set(argv)
    assert from_argv(argv) == local
    powersgd = TrainConfig(task="mrpc", output_dir="o",
                           sync=SyncSpec(grad_compression="powersgd", powersgd_rank=3))
    assert from_argv(to_argv(powersgd)) == powersgd
