"""A run's identity (run/identity.py) and the checkpoint code that honours it: rotation, choice, set-aside and
the fresh-run refusal consider only the run's own checkpoints (issue 22, part 4)."""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
import torch

from cpudist.config import TrainConfig
from cpudist.errors import BadInput
from cpudist.run import identity
from cpudist.train import checkpoint, resume
from cpudist.train import checkpoint_meta as ckpt
from cpudist.train.checkpoint_meta import CheckpointMeta, Done, Position


def cfg_of(out: Path, **over: object) -> TrainConfig:
    return dataclasses.replace(TrainConfig(task="mrpc", output_dir=str(out), model="tiny"), **over)  # type: ignore[arg-type]


def write(folder: Path, step: int, run_id: str, keep: int = 2) -> Path:
    cfg = cfg_of(folder.parent, run_id=run_id)
    meta = CheckpointMeta(dataclasses.asdict(cfg), 16, Position(0, step), 1, 16, "ddp", 1, 0.0,
                          Done(step, step * 16, 0, 0.0, 0.0), step, run_id=run_id)
    return checkpoint.write(folder, {"w": torch.arange(10.0) * step}, [checkpoint.rng_state()], meta, keep)


def names(folder: Path) -> list[str]:
    return [p.name for p in ckpt.complete_checkpoints(folder)]


def test_the_id_sorts_by_start_time_and_is_unique() -> None:
    early, late = (identity.new_run_id(datetime(2026, 11, 26, h, 5, 1, tzinfo=UTC)) for h in (9, 10))
    assert re.fullmatch(r"20261126-090501-[0-9a-f]{6}", early) and early < late
    assert len({identity.new_run_id() for _ in range(200)}) == 200


def test_rotation_keeps_what_it_just_wrote_and_leaves_another_runs_checkpoints(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    write(folder, 4, "A")
    write(folder, 6, "A")
    written = write(folder, 1, "B", keep=1)  # the second run's first checkpoint, below the first run's steps
    assert names(folder) == ["step-000006", "step-000004", "step-000001"]
    assert ckpt.owner(written) == "B" and ckpt.damage(written) is None
    write(folder, 2, "B", keep=1)  # its own older one goes
    assert names(folder) == ["step-000006", "step-000004", "step-000002"]


def test_rotation_after_a_resume_from_an_older_step_keeps_the_new_one(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    for step in (2, 4, 6):
        write(folder, step, "A", keep=3)
    aside = ckpt.set_aside(folder, 2, "A", "20261126-100000")  # resuming from step 2
    assert aside == folder / "abandoned-20261126-100000"
    assert sorted(p.name for p in aside.iterdir()) == ["step-000004", "step-000006"]
    assert all(ckpt.damage(p) is None for p in aside.iterdir())  # moved whole, nothing deleted
    write(folder, 3, "A", keep=1)
    assert names(folder) == ["step-000003"]


def test_choice_and_set_aside_skip_another_runs_checkpoints(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    write(folder, 1, "B")
    write(folder, 6, "A")
    said: list[str] = []
    assert ckpt.choose(folder, said.append, "B") == folder / "step-000001"
    assert ckpt.choose(folder, said.append) == folder / "step-000006"  # no id given: any run's, as before
    assert ckpt.set_aside(folder, 1, "B", "x") is None and names(folder) == ["step-000006", "step-000001"]


def test_a_checkpoint_from_before_run_ids_reads_as_any_runs(tmp_path: Path) -> None:
    path = write(tmp_path / "checkpoints", 3, "")
    data = json.loads((path / "meta.json").read_text())
    del data["run_id"]
    (path / "meta.json").write_text(json.dumps(data))
    assert ckpt.read_meta(path).run_id == "" and ckpt.owner(path) == ""
    assert ckpt.same_run(ckpt.owner(path), "20261126-100000-abcdef")


def test_a_fresh_run_into_another_runs_checkpoints_is_refused_in_one_line(tmp_path: Path) -> None:
    write(tmp_path / "checkpoints", 6, "A")
    with pytest.raises(BadInput) as refused:
        resume.preflight(cfg_of(tmp_path, run_id="B"), 1)  # what `cpudist run` calls before any rank starts
    line = refused.value.message
    assert "holds checkpoints of another run (A, newest step-000006)" in line and "\n" not in line
    assert "Continue that run with --resume auto, or give this run another --output-dir" in line
    resume.check_fresh(cfg_of(tmp_path, run_id="B", resume="auto"))  # going on with it is fine
    resume.check_fresh(cfg_of(tmp_path / "elsewhere", run_id="B"))


def test_a_resume_keeps_the_id_of_the_run_it_continues(tmp_path: Path) -> None:
    write(tmp_path / "checkpoints", 6, "20261126-090000-aaaaaa")
    assert identity.assign(cfg_of(tmp_path, resume="auto")).run_id == "20261126-090000-aaaaaa"
    older = cfg_of(tmp_path, resume=str(tmp_path / "checkpoints" / "step-000006"))  # on purpose, in its folder
    assert identity.assign(older).run_id == "20261126-090000-aaaaaa"
    branch = cfg_of(tmp_path / "other", resume=str(tmp_path / "checkpoints" / "step-000006"))
    assert identity.assign(branch).run_id not in ("", "20261126-090000-aaaaaa")  # another folder: a run of its own
    fresh = identity.assign(cfg_of(tmp_path))
    assert fresh.run_id != "20261126-090000-aaaaaa" and re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", fresh.run_id)
    assert identity.assign(cfg_of(tmp_path, run_id="given", resume="auto")).run_id == "given"  # a recovery's part
    # No checkpoint left (the head's disk went), but run.json says which run this folder is.
    identity.begin(cfg_of(tmp_path / "r", run_id="20261126-080000-bbbbbb"), "here")
    assert identity.assign(cfg_of(tmp_path / "r", resume="auto")).run_id == "20261126-080000-bbbbbb"


def test_run_json_follows_the_states_and_keeps_the_first_start(tmp_path: Path) -> None:
    cfg = cfg_of(tmp_path, run_id="20261126-090000-cccccc")
    first = identity.begin(cfg, "here")
    assert identity.read_run(tmp_path) == first and first.state == "running" and first.ended_at is None
    identity.mark(tmp_path, "preempted", message="the ranks stopped at step 3")
    stopped = identity.read_run(tmp_path)
    assert stopped is not None and stopped.state == "preempted" and stopped.ended_at is not None
    again = identity.begin(cfg, "here")
    assert again.started_at == first.started_at and again.parts == 2 and again.state == "running"
    identity.mark(tmp_path, "finished", metrics={"accuracy": 0.5})
    done = json.loads((tmp_path / "run.json").read_text())
    assert done["state"] == "finished" and done["metrics"] == {"accuracy": 0.5} and done["id"] == cfg.run_id
    assert done["task"] == "mrpc" and done["model"] == "tiny" and done["where"] == "here"
    assert not list(tmp_path.glob(".run.json.*"))  # written whole: no temporary file left behind
