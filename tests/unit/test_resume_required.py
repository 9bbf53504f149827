"""A recovery's resume (`--on-preemption resume`, cpudist/run/recovery.py) must find the checkpoint
the stop saved: where none is left (the head went, and its disk with it) it stops in one line naming
--checkpoint-s3, never trains again from step 0. A user's own `--resume auto` still starts over when
there is none."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpudist.config import TrainConfig
from cpudist.errors import BadInput
from cpudist.train import resume
from tests.unit.test_checkpoint import write


def cfg_of(out: Path, **over: object) -> TrainConfig:
    return TrainConfig(task="mrpc", output_dir=str(out), resume="auto",
                       **over)  # type: ignore[arg-type]


def test_a_recovery_with_no_checkpoint_left_stops_naming_checkpoint_s3(tmp_path: Path) -> None:
    cfg = cfg_of(tmp_path, resume_required=True, run_id="r1")
    for check in (lambda: resume.preflight(cfg, 2), lambda: resume.pick(cfg, tmp_path, print)):
        with pytest.raises(BadInput) as e:
            check()
        text = str(e.value)
        assert text.startswith(
            "cannot resume: no checkpoint of run r1 in ") and "not starting over" in text
        assert "--checkpoint-s3" in text and "\n" not in text and e.value.exit_code == 2


def test_a_recovery_goes_on_from_the_checkpoint_it_finds(tmp_path: Path) -> None:
    found = write(tmp_path / "checkpoints", 10)
    cfg = cfg_of(tmp_path, resume_required=True)
    resume.preflight(cfg, 2)
    assert resume.pick(cfg, tmp_path, print) == found


def test_a_users_resume_auto_without_a_checkpoint_starts_over_and_says_so(tmp_path: Path) -> None:
    said: list[str] = []
    resume.preflight(cfg_of(tmp_path), 2)
    assert resume.pick(cfg_of(tmp_path), tmp_path, said.append) is None
    assert said and said[0].endswith("starting from step 0")
