"""Checkpoint folders: atomic, verified, pruned; the trainer's clipping step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cpudist.errors import BadInput
from cpudist.train import checkpoint, resume
from cpudist.train.config import TrainConfig
from cpudist.train.loop import clip_and_step


def write(folder: Path, step: int, keep: int = 3) -> Path:
    cfg = TrainConfig(task="mrpc", output_dir=str(folder))
    meta = {"config": cfg.__dict__, "world_size": 2, "global_batch": 32, "stats": {}}
    return checkpoint.write(folder, step, {"w": torch.arange(1000.0) * step}, [checkpoint.rng_state()] * 2, meta, keep)


def test_write_is_complete_verified_and_pruned(tmp_path: Path) -> None:
    for step in (10, 20, 30, 40):
        write(tmp_path, step)
    assert [p.name for p in checkpoint.complete_checkpoints(tmp_path)] == ["step-000040", "step-000030", "step-000020"]
    assert all(checkpoint.damage(p) is None for p in checkpoint.complete_checkpoints(tmp_path))
    assert not list(tmp_path.glob("*.tmp"))


def test_a_half_written_checkpoint_is_never_picked(tmp_path: Path) -> None:
    write(tmp_path, 10)
    crashed = tmp_path / "step-000020.tmp"  # a write that died before its rename
    crashed.mkdir()
    (crashed / "state.pt").write_bytes(b"partial")
    no_marker = tmp_path / "step-000030"  # a folder without COMPLETE (copied by hand, say)
    no_marker.mkdir()
    said: list[str] = []
    assert checkpoint.choose(tmp_path, said.append) == tmp_path / "step-000010"
    assert said == []


@pytest.mark.parametrize("harm", ["truncate", "flip", "remove"])
def test_damage_falls_back_to_the_previous_one_and_says_why(tmp_path: Path, harm: str) -> None:
    write(tmp_path, 10)
    newest = write(tmp_path, 20)
    state = newest / "state.pt"
    if harm == "truncate":
        state.write_bytes(state.read_bytes()[:100])
    elif harm == "flip":
        data = bytearray(state.read_bytes())
        data[-10] ^= 0xFF
        state.write_bytes(bytes(data))
    else:
        state.unlink()
    said: list[str] = []
    assert checkpoint.choose(tmp_path, said.append) == tmp_path / "step-000010"
    assert said and said[0].startswith("resuming from step-000010 instead: step-000020 is damaged (state.pt ")


def test_global_batch_is_kept_or_the_new_world_refused(tmp_path: Path) -> None:
    cfg = TrainConfig(task="mrpc", output_dir="o", batch_size=16)
    meta = {"config": {**cfg.__dict__}, "world_size": 2, "global_batch": 32}
    assert resume.adapt(cfg, meta, 4, "ck").batch_size == 8
    assert resume.adapt(cfg, meta, 1, "ck").batch_size == 32
    with pytest.raises(BadInput, match="global batch of 32 cannot be split over 3 rank"):
        resume.adapt(cfg, meta, 3, "ck")
    with pytest.raises(BadInput, match="random sampler cannot continue it on 4"):
        resume.adapt(TrainConfig(task="mrpc", output_dir="o", sampler="random"),
                     {**meta, "config": {**meta["config"], "sampler": "random"}}, 4, "ck")
    with pytest.raises(BadInput, match=r"another run \(model: 'bert-base-uncased' there, 'tiny' here\)"):
        resume.adapt(TrainConfig(task="mrpc", output_dir="o", model="tiny"), meta, 2, "ck")
    assert json.dumps(meta)  # meta stays plain JSON


def test_clipping_bounds_the_gradient_norm_and_reports_the_norm_before() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    before = [p.detach().clone() for p in model.parameters()]
    (model(torch.randn(16, 8)) * 100).sum().backward()
    norm = clip_and_step(model, opt, sched, max_norm=0.5)
    assert norm > 0.5
    moved = torch.sqrt(sum(((p.detach() - b) ** 2).sum() for p, b in zip(model.parameters(), before, strict=True)))
    assert abs(float(moved) - 0.5) < 1e-4  # SGD at lr 1 moves by exactly the clipped gradient
    (model(torch.randn(16, 8)) * 100).sum().backward()
    before = [p.detach().clone() for p in model.parameters()]
    norm = clip_and_step(model, opt, sched, max_norm=0)  # 0: no clipping
    moved = torch.sqrt(sum(((p.detach() - b) ** 2).sum() for p, b in zip(model.parameters(), before, strict=True)))
    assert abs(float(moved) - norm) < 1e-3 * norm and norm > 0.5


def test_every_ranks_own_state_is_written_verified_and_given_back(tmp_path: Path) -> None:
    cfg = TrainConfig(task="mrpc", output_dir=str(tmp_path))
    meta = {"config": cfg.__dict__, "world_size": 1, "global_batch": 32, "stats": {}}
    mine = {"powersgd": {"error": [torch.arange(5.0), None]}}
    path = checkpoint.write(tmp_path, 7, {"w": torch.ones(3)}, [checkpoint.rng_state()], meta, 3, [mine])
    written = json.loads((path / "meta.json").read_text())
    assert written["format"] == checkpoint.FORMAT == 2 and written["rank_state"] is True
    assert set(written["files"]) == {"state.pt", "rng.pt", "ranks.pt"}
    restored = checkpoint.load(path, 0, 1)
    assert restored is not None and restored.rank_state is not None
    error = restored.rank_state["powersgd"]["error"]
    assert torch.equal(error[0], torch.arange(5.0)) and error[1] is None
    ranks = path / "ranks.pt"
    size = ranks.stat().st_size
    ranks.write_bytes(ranks.read_bytes()[:-3])
    assert checkpoint.damage(path) == f"ranks.pt has {size - 3} bytes, {size} were written"


def test_a_format_1_checkpoint_still_loads_without_rank_state(tmp_path: Path) -> None:
    path = write(tmp_path, 10)
    (path / "ranks.pt").unlink()
    meta = json.loads((path / "meta.json").read_text())
    del meta["files"]["ranks.pt"], meta["rank_state"]
    (path / "meta.json").write_text(json.dumps({**meta, "format": 1}))
    assert checkpoint.damage(path) is None
    restored = checkpoint.load(path, 0, 1)
    assert restored is not None and restored.rank_state is None


def sgd_meta(**over: object) -> dict[str, object]:
    cfg = TrainConfig(task="mrpc", output_dir="o", sync="local-sgd", sync_every=4, batch_size=16)
    return {"config": {**cfg.__dict__}, "world_size": 2, "global_batch": 32, "total": 16, "sync": "local-sgd:4",
            "rank_state": True, "format": 2, **over}


def test_per_rank_state_is_refused_on_other_ranks_or_another_sync() -> None:
    cfg = TrainConfig(task="mrpc", output_dir="o", sync="local-sgd", sync_every=4, batch_size=16)
    assert resume.adapt(cfg, sgd_meta(), 2, "ck").batch_size == 16
    with pytest.raises(BadInput, match="holds each of 2 ranks' own local-sgd:4 state; 1 rank") as e:
        resume.adapt(cfg, sgd_meta(), 1, "ck")
    assert str(e.value).endswith(". Resume with --np 2")
    with pytest.raises(BadInput, match="holds the ranks' own local-sgd:4 state; this run asks for local-sgd:8"):
        resume.adapt(TrainConfig(task="mrpc", output_dir="o", sync="local-sgd", sync_every=8), sgd_meta(), 2, "ck")
    # No rank has a state of its own (ddp, or PowerSGD before it compressed): another world size goes on.
    assert resume.adapt(cfg, sgd_meta(rank_state=False), 4, "ck").batch_size == 8


def test_a_checkpoint_of_a_newer_format_is_refused_in_one_line() -> None:
    cfg = TrainConfig(task="mrpc", output_dir="o", sync="local-sgd", sync_every=4)
    with pytest.raises(BadInput, match=r"checkpoint ck has format 3, newer than this cpudist's \(2\)"):
        resume.adapt(cfg, sgd_meta(format=3), 2, "ck")
