"""A run's identity (run/life/identity.py) and the checkpoint code that honours it: rotation,
choice, set-aside and the fresh-run refusal consider only the run's own checkpoints (issue 22, part
4); a run folder holds one run (run/claim.py); a run id read from a file is never a path."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import torch

from cpudist import state
from cpudist.config import TrainConfig
from cpudist.errors import BadInput
from cpudist.run.claim import claim
from cpudist.run.life import identity
from cpudist.train import checkpoint, resume
from cpudist.train import checkpoint_meta as ckpt
from cpudist.train.checkpoint_meta import CheckpointMeta, Done, Position


def cfg_of(out: Path, **over: object) -> TrainConfig:
    return dataclasses.replace(TrainConfig(task="mrpc", output_dir=str(out), model="tiny"),
                               **over)  # type: ignore[arg-type]


def write(folder: Path, step: int, run_id: str, keep: int = 2) -> Path:
    cfg = cfg_of(folder.parent, run_id=run_id)
    meta = CheckpointMeta(config=dataclasses.asdict(cfg), total=16, position=Position(0, step),
                          world_size=1, global_batch=16, sync="ddp", parts=1, wall_s=0.0,
                          stats=Done(step, step * 16, 0, 0.0, 0.0), step=step, run_id=run_id)
    return checkpoint.write(folder, {"w": torch.arange(10.0) * step}, [checkpoint.rng_state()],
                            meta, keep)


def names(folder: Path) -> list[str]:
    return [p.name for p in ckpt.complete_checkpoints(folder)]


def test_the_id_sorts_by_start_time_and_is_unique() -> None:
    early, late = (identity.new_run_id(datetime(2026, 11, 26, h, 5, 1, tzinfo=UTC))
                   for h in (9, 10))
    assert re.fullmatch(r"20261126-090501-[0-9a-f]{6}", early) and early < late
    assert len({identity.new_run_id() for _ in range(200)}) == 200


def test_rotation_keeps_what_it_just_wrote_and_leaves_another_runs_checkpoints(
    tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    write(folder, 4, "A")
    write(folder, 6, "A")
    # the second run's first checkpoint, below the first run's steps
    written = write(folder, 1, "B", keep=1)
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
    # no id given: any run's, as before
    assert ckpt.choose(folder, said.append) == folder / "step-000006"
    assert ckpt.set_aside(folder, 1, "B", "x") is None
    assert names(folder) == ["step-000006", "step-000001"]


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
        # what `cpudist run` calls before any rank starts
        resume.preflight(cfg_of(tmp_path, run_id="B"), 1)
    line = refused.value.message
    assert "holds checkpoints of another run (A, newest step-000006)" in line and "\n" not in line
    assert "Continue that run with --resume auto, or give this run another --output-dir" in line
    resume.check_fresh(cfg_of(tmp_path, run_id="B", resume="auto"))  # going on with it is fine
    resume.check_fresh(cfg_of(tmp_path / "elsewhere", run_id="B"))


def test_a_resume_keeps_the_id_of_the_run_it_continues(tmp_path: Path) -> None:
    write(tmp_path / "checkpoints", 6, "20261126-090000-aaaaaa")
    assert identity.assign(cfg_of(tmp_path, resume="auto")).run_id == "20261126-090000-aaaaaa"
    # on purpose, in its folder
    older = cfg_of(tmp_path, resume=str(tmp_path / "checkpoints" / "step-000006"))
    assert identity.assign(older).run_id == "20261126-090000-aaaaaa"
    branch = cfg_of(tmp_path / "other", resume=str(tmp_path / "checkpoints" / "step-000006"))
    # another folder: a run of its own
    assert identity.assign(branch).run_id not in ("", "20261126-090000-aaaaaa")
    fresh = identity.assign(cfg_of(tmp_path))
    assert fresh.run_id != "20261126-090000-aaaaaa"
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", fresh.run_id)
    # a recovery's part
    assert identity.assign(cfg_of(tmp_path, run_id="given", resume="auto")).run_id == "given"
    # No checkpoint left (the head's disk went), but run.json says which run this folder is.
    identity.begin(cfg_of(tmp_path / "r", run_id="20261126-080000-bbbbbb"), "here")
    assert identity.assign(cfg_of(tmp_path / "r", resume="auto")).run_id == "20261126-080000-bbbbbb"


def test_run_json_follows_the_states_and_keeps_the_first_start(tmp_path: Path) -> None:
    cfg = cfg_of(tmp_path, run_id="20261126-090000-cccccc")
    first = identity.begin(cfg, "here")
    assert identity.read_run(
        tmp_path) == first and first.state == "running" and first.ended_at is None
    identity.mark(tmp_path, "preempted", message="the ranks stopped at step 3")
    stopped = identity.read_run(tmp_path)
    assert stopped is not None and stopped.state == "preempted" and stopped.ended_at is not None
    again = identity.begin(cfg, "here")
    assert again.started_at == first.started_at and again.parts == 2 and again.state == "running"
    identity.mark(tmp_path, "finished", metrics={"accuracy": 0.5})
    done = json.loads((tmp_path / "run.json").read_text())
    assert (done["state"] == "finished" and done["metrics"] == {"accuracy": 0.5}
            and done["id"] == cfg.run_id)
    assert done["task"] == "mrpc" and done["model"] == "tiny" and done["where"] == "here"
    assert not list(tmp_path.glob(".run.json.*"))  # written whole: no temporary file left behind


def finished_run(out: Path, run_id: str) -> None:
    """A run's folder as a finished run leaves it: run.json, result, log, model, a checkpoint."""
    identity.begin(cfg_of(out, run_id=run_id), "here")
    for name in ("result.json", "cpudist.log", "steps.jsonl"):
        (out / name).write_text(f"{run_id}\n")
    (out / "model").mkdir()
    (out / "model" / "config.json").write_text("{}")
    write(out / "checkpoints", 4, run_id)
    identity.mark(out, "finished", metrics={"accuracy": 0.5})


def test_a_used_folder_is_refused_unless_told_then_only_the_earlier_runs_files_go(
        tmp_path: Path) -> None:
    claim(cfg_of(tmp_path / "new", run_id="B"), False, print)  # a new (or empty) folder: fine
    out = tmp_path / "run"
    finished_run(out, "20261126-090000-aaaaaa")
    (out / "notes.txt").write_text("the user's")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(BadInput) as refused:
        claim(cfg_of(out, run_id="B"), False, print)
    assert refused.value.exit_code == 2 and "\n" not in refused.value.message
    assert "holds run 20261126-090000-aaaaaa (finished)" in refused.value.message
    assert "pass --overwrite-output-dir" in refused.value.message
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    claim(cfg_of(out, run_id="20261126-090000-aaaaaa", resume="auto"), False, print)  # its own

    with pytest.raises(BadInput, match="holds checkpoints of another run"):  # work: never removed
        claim(cfg_of(out, run_id="B"), True, print)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before

    shutil.rmtree(out / "checkpoints" / "step-000004")  # the user lets them go
    said: list[str] = []
    claim(cfg_of(out, run_id="B"), True, said.append)
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints", "notes.txt"]
    assert (out / "notes.txt").read_text() == "the user's"
    assert said == [f"--overwrite-output-dir: run 20261126-090000-aaaaaa's files in {out} make "
                    "way for run B (its ledger line stays)"]


def test_overwrite_never_writes_over_a_file_no_run_made(tmp_path: Path) -> None:
    (tmp_path / "hostfile").write_text("node1 slots=2\n")  # --output-dir . beside the user's
    with pytest.raises(BadInput) as refused:
        claim(cfg_of(tmp_path, run_id="B"), True, print)
    said = refused.value.message
    assert "holds hostfile, which this run would write over and no earlier run made there" in said
    out = tmp_path / "run"
    finished_run(out, "A")
    (out / "hostfile").write_text("node1 slots=2\n")  # put there after the run ended
    later = time.time() + 60
    os.utime(out / "hostfile", (later, later))
    with pytest.raises(BadInput, match="holds hostfile, which"):
        claim(cfg_of(out, run_id="B"), True, print)
    assert (out / "hostfile").read_text() == "node1 slots=2\n" and (out / "result.json").is_file()


def test_overwrite_refuses_a_run_that_is_still_going(tmp_path: Path) -> None:
    identity.begin(cfg_of(tmp_path, run_id="A"), "here")  # this (live) process launches it
    with pytest.raises(BadInput, match="holds run A, which is still running"):
        claim(cfg_of(tmp_path, run_id="B"), True, print)


def test_a_run_id_that_is_a_path_is_refused_where_it_is_read(tmp_path: Path) -> None:
    crafted = "x/../../../escape"
    path = write(tmp_path / "checkpoints", 6, "20261126-090000-aaaaaa")
    meta = json.loads((path / "meta.json").read_text())
    (path / "meta.json").write_text(json.dumps({**meta, "run_id": crafted}))
    with pytest.raises(BadInput) as refused:
        identity.assign(cfg_of(tmp_path, resume="auto"))
    said = refused.value.message
    assert f"{path / 'meta.json'} names run id {crafted!r}, which is not a run id" in said
    identity.begin(cfg_of(tmp_path / "r", run_id="20261126-090000-aaaaaa"), "here")
    info = json.loads((tmp_path / "r" / "run.json").read_text())
    (tmp_path / "r" / "run.json").write_text(json.dumps({**info, "id": crafted}))
    assert identity.read_run(tmp_path / "r") is None  # a crafted run.json names no run
    tried = ("20261126-090000-aaaaaa", "A", "given", "..", "a/b", "", "-x", "x" * 65, "a\nb")
    assert [t for t in tried if state.is_run_id(t)] == ["20261126-090000-aaaaaa", "A", "given"]
