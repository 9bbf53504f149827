"""Checkpoint folders: atomic, verified, pruned, their meta typed and checked; the trainer's
clipping step."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from cpudist.config import TrainConfig
from cpudist.errors import BadInput
from cpudist.strategies import SyncSpec
from cpudist.train import checkpoint, resume
from cpudist.train import checkpoint_meta as ckpt
from cpudist.train.checkpoint_meta import CheckpointMeta, Done, Position
from cpudist.train.optim import clip_and_step


def meta_of(cfg: TrainConfig, world: int = 2, global_batch: int = 32, step: int = 0,
            **over: Any) -> CheckpointMeta:
    """A meta as the loop writes it (the writer sets files, rank_state and format)."""
    done = Done(step, step * global_batch, 0, 0.0, 0.0)
    meta = CheckpointMeta(config=dataclasses.asdict(cfg), total=16, position=Position(0, step),
                          world_size=world, global_batch=global_batch,
                          sync="ddp", parts=1, wall_s=0.0, stats=done, step=step)
    return dataclasses.replace(meta, **over)


def write(folder: Path, step: int, keep: int = 3) -> Path:
    meta = meta_of(TrainConfig(task="mrpc", output_dir=str(folder)), step=step)
    return checkpoint.write(folder, {"w": torch.arange(1000.0) * step}, [checkpoint.rng_state()]
                            * 2, meta, keep)


def test_write_is_complete_verified_and_pruned(tmp_path: Path) -> None:
    for step in (10, 20, 30, 40):
        write(tmp_path, step)
    assert [p.name for p in ckpt.complete_checkpoints(tmp_path)] == [
        "step-000040", "step-000030", "step-000020"]
    assert all(ckpt.damage(p) is None for p in ckpt.complete_checkpoints(tmp_path))
    assert not list(tmp_path.glob("*.tmp"))


def test_a_half_written_checkpoint_is_never_picked(tmp_path: Path) -> None:
    write(tmp_path, 10)
    crashed = tmp_path / "step-000020.tmp"  # a write that died before its rename
    crashed.mkdir()
    (crashed / "state.pt").write_bytes(b"partial")
    no_marker = tmp_path / "step-000030"  # a folder without COMPLETE (copied by hand, say)
    no_marker.mkdir()
    said: list[str] = []
    assert ckpt.choose(tmp_path, said.append) == tmp_path / "step-000010"
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
    assert ckpt.choose(tmp_path, said.append) == tmp_path / "step-000010"
    assert said and said[0].startswith("resuming from step-000010 instead: step-000020 is damaged "
                                       "(state.pt ")


def test_global_batch_is_kept_or_the_new_world_refused(tmp_path: Path) -> None:
    cfg = TrainConfig(task="mrpc", output_dir="o", batch_size=16)
    meta = meta_of(cfg)
    assert resume.adapt(cfg, meta, 4, "ck").batch_size == 8
    assert resume.adapt(cfg, meta, 1, "ck").batch_size == 32
    with pytest.raises(BadInput, match="global batch of 32 cannot be split over 3 rank"):
        resume.adapt(cfg, meta, 3, "ck")
    with pytest.raises(BadInput, match="random sampler cannot continue it on 4"):
        resume.adapt(TrainConfig(task="mrpc", output_dir="o", sampler="random"),
                     dataclasses.replace(meta, config={**meta.config, "sampler": "random"}), 4,
                     "ck")
    with pytest.raises(BadInput,
                       match=r"another run \(model: 'bert-base-uncased' there, 'tiny' here\)"):
        resume.adapt(TrainConfig(task="mrpc", output_dir="o", model="tiny"), meta, 2, "ck")
    assert json.dumps(meta.to_dict())  # meta stays plain JSON


def test_clipping_bounds_the_gradient_norm_and_reports_the_norm_before() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    before = [p.detach().clone() for p in model.parameters()]
    (model(torch.randn(16, 8)) * 100).sum().backward()
    norm = clip_and_step(model, opt, sched, max_norm=0.5)
    assert norm > 0.5
    moved = torch.sqrt(sum(((p.detach() - b) ** 2).sum() for p,
                           b in zip(model.parameters(), before, strict=True)))
    assert abs(float(moved) - 0.5) < 1e-4  # SGD at lr 1 moves by exactly the clipped gradient
    (model(torch.randn(16, 8)) * 100).sum().backward()
    before = [p.detach().clone() for p in model.parameters()]
    norm = clip_and_step(model, opt, sched, max_norm=0)  # 0: no clipping
    moved = torch.sqrt(sum(((p.detach() - b) ** 2).sum() for p,
                           b in zip(model.parameters(), before, strict=True)))
    assert abs(float(moved) - norm) < 1e-3 * norm and norm > 0.5


def test_every_ranks_own_state_is_written_verified_and_given_back(tmp_path: Path) -> None:
    meta = meta_of(TrainConfig(task="mrpc", output_dir=str(tmp_path)), world=1, step=7)
    mine = {"powersgd": {"error": [torch.arange(5.0), None]}}
    path = checkpoint.write(tmp_path, {"w": torch.ones(3)}, [checkpoint.rng_state()], meta, 3,
                            [mine])
    assert path.name == "step-000007"
    written = json.loads((path / "meta.json").read_text())
    assert written["format"] == ckpt.FORMAT == 3 and written["rank_state"] is True
    assert set(written["files"]) == {"state.pt", "rng.pt", "ranks.pt"}
    restored = checkpoint.load(path, 0, 1)
    assert restored is not None and restored.rank_state is not None
    error = restored.rank_state["powersgd"]["error"]
    assert torch.equal(error[0], torch.arange(5.0)) and error[1] is None
    ranks = path / "ranks.pt"
    size = ranks.stat().st_size
    ranks.write_bytes(ranks.read_bytes()[:-3])
    assert ckpt.damage(path) == f"ranks.pt has {size - 3} bytes, {size} were written"


@pytest.mark.parametrize("old", [1, 2])
def test_a_checkpoint_of_an_older_format_is_refused_in_one_line_before_it_is_read(tmp_path: Path,
                                                                                  old: int) -> None:
    """Formats 1 and 2 pickled numpy's RNG state (an ndarray), which the safe unpickler refuses."""
    path = write(tmp_path, 10)
    meta = json.loads((path / "meta.json").read_text())
    (path / "meta.json").write_text(json.dumps({**meta, "format": old}))
    # the format is refused first: no file of it is unpickled
    (path / "rng.pt").write_bytes(b"not read")
    with pytest.raises(BadInput,
                       match=rf"checkpoint {path} has format {old}, older than this cpudist reads "
                             r"\(3") as e:
        checkpoint.load(path, 0, 1)
    assert "\n" not in str(e.value) and str(e.value).endswith("start over without --resume")
    cfg = TrainConfig(task="mrpc", output_dir=str(tmp_path), resume=str(path))
    # refused before any rank starts too
    with pytest.raises(BadInput, match=f"has format {old}, older"):
        resume.preflight(cfg, 1)


def sgd_meta(**over: Any) -> CheckpointMeta:
    cfg = TrainConfig(task="mrpc", output_dir="o",
                      sync=SyncSpec(strategy="local-sgd", sync_every=4), batch_size=16)
    return meta_of(cfg, **{"sync": "local-sgd:4", "rank_state": True, **over})


def test_per_rank_state_is_refused_on_other_ranks_or_another_sync() -> None:
    cfg = TrainConfig(task="mrpc", output_dir="o",
                      sync=SyncSpec(strategy="local-sgd", sync_every=4), batch_size=16)
    assert resume.adapt(cfg, sgd_meta(), 2, "ck").batch_size == 16
    with pytest.raises(BadInput, match="holds each of 2 ranks' own local-sgd:4 state; 1 rank") as e:
        resume.adapt(cfg, sgd_meta(), 1, "ck")
    assert str(e.value).endswith(". Resume with --np 2")
    with pytest.raises(BadInput,
                       match="holds the ranks' own local-sgd:4 state; this run asks for "
                             "local-sgd:8"):
        resume.adapt(TrainConfig(task="mrpc", output_dir="o",
                                 sync=SyncSpec(strategy="local-sgd", sync_every=8)), sgd_meta(), 2,
                     "ck")
    # No rank has a state of its own (ddp, or PowerSGD before it compressed): another world size
    # goes on.
    assert resume.adapt(cfg, sgd_meta(rank_state=False), 4, "ck").batch_size == 8


def test_a_checkpoint_of_a_newer_format_is_refused_in_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, 10)
    meta = json.loads((path / "meta.json").read_text())
    (path / "meta.json").write_text(json.dumps({**meta, "format": 4}))
    with pytest.raises(BadInput,
                       match=rf"checkpoint {path} has format 4, newer than this cpudist's \(3\)"):
        checkpoint.load(path, 0, 1)
    cfg = TrainConfig(task="mrpc", output_dir=str(tmp_path), resume=str(path))
    with pytest.raises(BadInput, match="has format 4, newer"):  # refused before any rank starts too
        resume.preflight(cfg, 1)


@pytest.mark.parametrize(("meta", "why"), [
    ({"weights": "model.safetensors"}, "meta.json that cpudist did not write"),
    ([1, 2], "meta.json that cpudist did not write"),
    ({"format": "2", "config": {}}, "meta.json that cpudist did not write"),
    ({"format": 3, "config": {}, "total": 16}, "meta.json of format 3 without 'position'"),
    ({"format": 3, "config": {}, "total": 16, "position": [0, 0]},
     "meta.json of format 3 that cannot be read"),
])
def test_a_foreign_or_garbled_meta_is_one_line_not_a_key_error(tmp_path: Path, meta: Any,
                                                               why: str) -> None:
    path = write(tmp_path, 10)
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(BadInput, match=why) as e:
        ckpt.read_meta(path)
    assert "\n" not in str(e.value) and "without --resume" in str(e.value)
    with pytest.raises(BadInput, match=why):
        resume.preflight(TrainConfig(task="mrpc", output_dir="o", checkpoint_dir=str(tmp_path),
                                     resume="auto"), 2)


def test_meta_json_round_trips_in_the_order_it_was_always_written(tmp_path: Path) -> None:
    path = write(tmp_path, 10)
    text = (path / "meta.json").read_text()
    assert list(json.loads(text)) == ["config", "total", "position", "world_size", "global_batch",
                                      "sync", "parts", "wall_s", "stats", "format", "step",
                                      "rank_state", "files", "run_id", "best"]
    meta = ckpt.read_meta(path)
    assert json.dumps(meta.to_dict(), indent=1) == text
    assert meta.position == Position(0,
                                     10) and meta.stats.samples == 320 and set(meta.files) == set(
                                         checkpoint.FILES)


def test_the_preflight_path_imports_no_torch() -> None:
    """`cpudist run` reads checkpoint metas before any rank starts: that must not cost torch's
    import."""
    code = ("import sys; import cpudist.train.resume, cpudist.train.checkpoint_meta, "
            "cpudist.train.durable; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"
