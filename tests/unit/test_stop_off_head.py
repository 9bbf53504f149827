"""#23, torchrun with rank 0 off the head: its stop marker is written on rank 0's host, while the
outcome is decided on the head; a stop there (spot notice, SIGTERM) must read as a stop (exit 75,
resumable), not a failure (run/local.py keeps the marker from rank 0's `preempted` event,
run/outcome.keep_stop)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from cpudist.config import TrainConfig
from cpudist.errors import JobFailed, Preempted
from cpudist.launch.spec import Launch
from cpudist.results.launched import Launched
from cpudist.run import local
from cpudist.run.prepare import prepare
from cpudist.run.request import Callbacks, LaunchOptions, RunRequest
from cpudist.wire.events import MARKER as EVENT
from cpudist.wire.exits import PREEMPTED as EXIT_PREEMPTED
from cpudist.wire.stop_marker import NAME as MARKER


def _launch(second: str) -> Launch:
    """One launcher per host as torchrun across hosts runs them: the head's ranks stop and leave
    (exit 75) without a marker; the other host's launcher runs `second`."""
    return Launch(argv=(), rank_env={},
                  per_host=(("head", ("sh", "-c", f"sleep 1; exit {EXIT_PREEMPTED}")),
                            ("node1", ("sh", "-c", second))))


def _run(tmp_path: Path, launch: Launch) -> list[dict[str, object]]:
    out = tmp_path / "out"
    spec = prepare(RunRequest(train=TrainConfig(task="synthetic", output_dir=str(out),
                                                model="tiny"),
                              launch=LaunchOptions(np=1)))
    seen: list[dict[str, object]] = []
    local.execute(spec, launch, Callbacks(seen.append, lambda line: None), 60, Launched())
    return seen


def test_a_stop_with_rank_0_on_another_host_is_a_stop(tmp_path: Path) -> None:
    marker = {"step": 8, "checkpoint": "/elsewhere/out/checkpoints/step-000008",
              "reason": "SIGTERM", "host": "node1"}
    line = EVENT + json.dumps({"event": "preempted", **marker})
    with pytest.raises(Preempted) as stopped:
        _run(tmp_path, _launch(f"echo {shlex.quote(line)}; exit {EXIT_PREEMPTED}"))
    assert stopped.value.exit_code == EXIT_PREEMPTED
    assert stopped.value.what == ("the ranks stopped at step 8 (SIGTERM on node1) after saving "
                                  "step-000008")
    # --on-preemption resume reads it here
    assert json.loads((tmp_path / "out" / MARKER).read_text()) == marker


def test_a_failure_without_a_stop_event_stays_a_failure(tmp_path: Path) -> None:
    with pytest.raises(JobFailed) as failed:
        _run(tmp_path, _launch(f"exit {EXIT_PREEMPTED}"))
    assert not isinstance(failed.value, Preempted) and not (tmp_path / "out" / MARKER).exists()
