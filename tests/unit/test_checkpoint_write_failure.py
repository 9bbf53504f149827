"""A checkpoint that cannot be written (a full disk, a file-size limit) is one line naming the
folder and the cause, leaves no half-written folder, and keeps the complete older ones: the chaos
test (test_chaos.py, fill-head-disk) fills a real head's disk; here the kernel refuses the write
through RLIMIT_FSIZE, in this process."""

from __future__ import annotations

import errno
import resource
import signal
from pathlib import Path

import pytest
import torch

from cpudist.config import TrainConfig
from cpudist.errors import JobFailed
from cpudist.train import checkpoint
from cpudist.train import checkpoint_meta as ckpt
from tests.unit.test_checkpoint import meta_of


def test_a_refused_write_is_one_line_and_the_older_checkpoint_stays(tmp_path: Path) -> None:
    cfg = TrainConfig(task="mrpc", output_dir=str(tmp_path))
    checkpoint.write(tmp_path, {"w": torch.zeros(10)}, [checkpoint.rng_state()],
                     meta_of(cfg, step=4), keep=2)
    big = {"w": torch.zeros(1 << 20)}  # 4 MiB: over the limit below
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    # EFBIG instead of the signal's kill
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))
    try:
        with pytest.raises(JobFailed) as failed:
            checkpoint.write(tmp_path, big, [checkpoint.rng_state()], meta_of(cfg, step=8), keep=2)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)
    message = failed.value.message
    assert message.startswith(
        f"could not write checkpoint step-000008 in {tmp_path}: ") and "\n" not in message
    assert "--resume auto" in message
    assert [p.name for p in ckpt.complete_checkpoints(tmp_path)] == ["step-000004"]
    # no half-written folder left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000004"]


def test_a_full_disk_is_named_whatever_layer_reported_it(tmp_path: Path) -> None:
    why = checkpoint._write_failure(OSError(errno.ENOSPC, "No space left on device"), tmp_path)
    assert why.startswith("no space left on the device (") and why.endswith(" MiB free)")
    # torch.save's own words for a failed stream name no cause; with space free they are what there
    # is to say
    assert checkpoint._write_failure(RuntimeError("basic_ios::clear: iostream error\nmore"),
                                     tmp_path) == (
        "basic_ios::clear: iostream error")
