"""The one-line error of a failed launch names how the failing host's launcher ended: a signal as
its name, and ssh's own 255 as a lost connection, not as "signal 127" (255 - 128)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpudist.errors import JobFailed
from cpudist.launch.runner import Outcome
from cpudist.run.outcome import check


def failure(tmp_path: Path, code: int) -> str:
    with pytest.raises(JobFailed) as failed:
        check(Outcome(code, False, (), failed_host="n3"), tmp_path, None, "torchrun")
    return failed.value.what


def test_a_launcher_killed_by_a_signal_is_named_by_it(tmp_path: Path) -> None:
    assert failure(tmp_path,
                   137) == "the job failed on n3 (torchrun exit code 137, killed by SIGKILL)"


def test_ssh_losing_the_host_is_not_read_as_a_signal(tmp_path: Path) -> None:
    assert failure(tmp_path,
                   255) == "the job failed on n3 (torchrun exit code 255, ssh lost the host)"


def test_a_plain_exit_code_is_just_that(tmp_path: Path) -> None:
    assert failure(tmp_path, 1) == "the job failed on n3 (torchrun exit code 1)"


def test_a_rank_aborted_in_torchs_gloo_teardown_gets_the_way_out_as_its_hint(
    tmp_path: Path) -> None:
    lines = ("step 3 loss 0.75494266", "terminate called without an active exception")
    with pytest.raises(JobFailed) as failed:
        check(Outcome(1, False, lines), tmp_path, None, "torchrun")
    assert "os._exit(0)" in failed.value.message and "destroy_process_group" in failed.value.message
    with pytest.raises(JobFailed) as other:
        check(Outcome(1, False, ("step 3 loss 0.75494266",)), tmp_path, None, "torchrun")
    assert other.value.message.endswith(". See the rank output above; the first failing rank is "
                                        "named in it")


def test_a_launcher_given_up_on_names_no_host_but_the_ranks_own_line(tmp_path: Path) -> None:
    noticed = ("[n0:0] error: lost a peer rank: no answer within --dist-timeout 10s "
               "(a rank that hangs, ...)")
    with pytest.raises(JobFailed) as failed:
        check(Outcome(-9, False, ("step 3/200", noticed), gave_up=True), tmp_path, None, "launcher")
    assert failed.value.what == ("the job failed (launcher stopped 20 s after a rank lost its "
                                 f"peer): {noticed}")
