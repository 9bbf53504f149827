"""Bad input to `cpudist run` refused on the launching side before any rank starts (issue 23): one
line, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpudist.config import TrainConfig
from cpudist.errors import BadInput
from cpudist.run.prepare import check_env, check_ledger, make_output_dir
from cpudist.train.resume import pick


def test_output_dir_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(BadInput, match="is a file") as e:
        make_output_dir(tmp_path / "f")
    assert e.value.exit_code == 2
    with pytest.raises(BadInput, match="is a file, not a folder"):
        make_output_dir(tmp_path / "f" / "run")


def test_output_dir_that_cannot_be_made() -> None:
    with pytest.raises(BadInput, match="cannot be created"):
        make_output_dir(Path("/proc/cpudist-nosuch"))


def test_output_dir_new_or_existing_is_made(tmp_path: Path) -> None:
    make_output_dir(tmp_path / "a" / "b")
    make_output_dir(tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b").is_dir()


def test_ledger_checked_before_training(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="is a folder"):
        check_ledger(tmp_path)
    (tmp_path / "f").write_text("x")
    with pytest.raises(BadInput, match="is a file, not a folder"):
        check_ledger(tmp_path / "f" / "results.jsonl")
    # its folder is made when the result is appended
    check_ledger(tmp_path / "new" / "results.jsonl")
    check_ledger(tmp_path / "f")  # an existing file: appended to
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("pair",
                         [("OMP_NUM_THREADS", "zero"), ("OMP_NUM_THREADS", "0"),
                          ("OMP_NUM_THREADS", "-2"), ("OMP_NUM_THREADS", ""),
                          ("CPUDIST_THREADS", "1.5"), ("OMP_NUM_THREADS", "auto")])
def test_thread_variables_must_be_positive_counts(pair: tuple[str, str]) -> None:
    with pytest.raises(BadInput, match=f"--env {pair[0]}="):
        check_env((("HF_TOKEN", "x"), pair))


def test_good_env_passes() -> None:
    check_env((("OMP_NUM_THREADS", "4"), ("CPUDIST_THREADS", "auto"), ("HF_TOKEN", "zero"),
               ("FOO", "")))


@pytest.mark.parametrize("name", ["nosuch", "nosuch/checkpoints/step-4"])
def test_resume_path_that_does_not_exist(tmp_path: Path, name: str) -> None:
    cfg = TrainConfig(task="mrpc", output_dir=str(tmp_path / "run"), resume=str(tmp_path / name))
    with pytest.raises(BadInput, match="does not exist") as e:
        pick(cfg, tmp_path / "run", lambda line: None)
    assert "incomplete" not in e.value.message
