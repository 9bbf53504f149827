"""A checkpoint comes from --resume PATH or an object store: its .pt files are read without running
their pickles."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from cpudist.config import TrainConfig
from cpudist.errors import BadInput
from cpudist.train import checkpoint
from cpudist.train import checkpoint_meta as ckpt
from cpudist.train.checkpoint_meta import CheckpointMeta, Done, Position


class Planted:
    """What a hostile checkpoint holds: unpickling it creates the file `marker` (any call could be
    made instead)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def written(folder: Path) -> Path:
    cfg = TrainConfig(task="mrpc", output_dir=str(folder))
    meta = CheckpointMeta(config=dataclasses.asdict(cfg), total=16, position=Position(0, 10),
                          world_size=1, global_batch=32, sync="ddp", parts=1, wall_s=0.0,
                          stats=Done(10, 320, 0, 0.0, 0.0), step=10)
    return checkpoint.write(folder, {"w": torch.ones(3)}, [checkpoint.rng_state()], meta, 3, [{}])


def plant(path: Path, name: str, content: Any) -> None:
    """Replace one file and its sums in meta.json, as whoever made the checkpoint can: no damage
    shows."""
    torch.save(content, path / name)
    meta = json.loads((path / "meta.json").read_text())
    meta["files"][name] = dataclasses.asdict(ckpt.file_sum(path / name))
    (path / "meta.json").write_text(json.dumps(meta))
    assert ckpt.damage(path) is None


@pytest.mark.parametrize("name", ["state.pt", "rng.pt", "ranks.pt"])
def test_a_planted_pickle_is_refused_in_one_line_and_never_run(tmp_path: Path, name: str) -> None:
    path = written(tmp_path / "ck")
    marker = tmp_path / "ran"
    box = {"model": Planted(marker)} if name == "state.pt" else [{"torch": Planted(marker)}]
    plant(path, name, box)
    with pytest.raises(BadInput) as e:
        checkpoint.load(path, 0, 1)
    assert not marker.exists()
    text = str(e.value)
    assert text.startswith(f"checkpoint {path}: {name} holds more than tensors and plain data, "
                           "refused unread")
    assert "GLOBAL io.open" in text and "\n" not in text and "start over" in text


def test_the_rng_state_round_trips_through_the_safe_unpickler(tmp_path: Path) -> None:
    """numpy's state is saved as a dict and a tensor; every generator continues exactly where it was
    saved."""
    checkpoint.seed_all(1234)
    np.random.normal()  # numpy's cached gaussian is part of its state
    path = written(tmp_path)
    expect = (torch.rand(3), random.random(), np.random.rand(3), np.random.normal())
    checkpoint.seed_all(99)
    restored = checkpoint.load(path, 0, 1)
    assert restored is not None and restored.rng is not None
    checkpoint.set_rng_state(restored.rng)
    got = (torch.rand(3), random.random(), np.random.rand(3), np.random.normal())
    assert torch.equal(got[0], expect[0]) and got[1] == expect[1]
    assert np.array_equal(got[2], expect[2]) and got[3] == expect[3]
