from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cpudist.train.sampling import global_batches, rank_batches

lengths = st.lists(st.integers(1, 128), min_size=1, max_size=400)


@given(lengths, st.integers(1, 64), st.integers(0, 5), st.booleans())
def test_every_row_once_per_epoch(ls: list[int], batch: int, epoch: int, grouped: bool) -> None:
    batches = global_batches(ls, batch, seed=3, epoch=epoch, grouped=grouped)
    assert sorted(i for b in batches for i in b) == list(range(len(ls)))
    assert all(len(b) <= batch for b in batches)


@given(lengths, st.sampled_from([1, 2, 4]), st.integers(1, 16))
def test_global_batches_do_not_depend_on_the_split(ls: list[int], world: int, per_rank: int) -> None:
    batches = global_batches(ls, per_rank * world, seed=1, epoch=0)
    shares = [rank_batches(batches, r, world) for r in range(world)]
    assert all(len(s) == len(shares[0]) for s in shares)  # every rank takes the same number of steps
    for step, whole in enumerate(b for b in batches if len(b) >= world):
        assert sorted(i for s in shares for i in s[step]) == sorted(whole)


def test_grouping_cuts_padding_and_epochs_differ() -> None:
    ls = [(i * 37) % 120 + 8 for i in range(3200)]
    def padding(grouped: bool) -> int:
        return sum(len(b) * max(ls[i] for i in b) - sum(ls[i] for i in b)
                   for b in global_batches(ls, 32, seed=0, epoch=0, grouped=grouped))
    assert padding(True) < padding(False) / 5
    assert global_batches(ls, 32, 0, 0) != global_batches(ls, 32, 0, 1)


def test_too_few_rows_for_the_ranks_is_an_error_not_a_hang() -> None:
    import pytest

    from cpudist.config import TrainConfig
    from cpudist.errors import BadInput
    from cpudist.train.features import Encoded
    from cpudist.train.sampling import batch_plan

    data = Encoded([[101, 7, 102]], None, [0.0], 0)
    with pytest.raises(BadInput, match="cannot feed 2 ranks"):
        batch_plan(TrainConfig(task="mrpc", output_dir="o"), data, rank=0, world=2)
    assert batch_plan(TrainConfig(task="mrpc", output_dir="o"), data, rank=0, world=1)[0] == 1


@given(lengths, st.sampled_from([1, 2, 4]), st.integers(1, 8), st.sampled_from([1, 2, 3]))
def test_accumulated_micro_batches_give_each_rank_its_rows_of_the_step(ls: list[int], world: int, per_rank: int,
                                                                       accum: int) -> None:
    from cpudist.train.sampling import fed_batches

    steps = global_batches(ls, per_rank * world * accum, seed=2, epoch=0)
    micro = fed_batches(steps, world, accum)
    kept = [b for b in steps if len(b) >= world * accum]
    assert len(micro) == accum * len(kept)
    for i, whole in enumerate(kept):
        parts = micro[i * accum:(i + 1) * accum]
        assert all(len(m) >= world for m in parts)  # every rank has rows in every micro-batch
        for r in range(world):  # rank r's rows of the step are its rows of the unsplit step batch
            assert [x for m in parts for x in m[r::world]] == whole[r::world]
