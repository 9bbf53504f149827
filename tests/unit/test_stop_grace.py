"""A stop that lands while rank 0 writes a checkpoint waits for it (bounded), and the ranks' last
lines (the checkpoint, the stop) still reach the callbacks; a real process group, a real SIGINT in
this process."""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cpudist.errors import Interrupted
from cpudist.launch import runner
from cpudist.launch.spec import Launch
from cpudist.wire import stop_marker

# A "rank": says it starts a checkpoint, then takes WRITE_S to write it whatever SIGTERM says, says
# it is saved
RANK = """
import json, signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: None)
say = lambda **e: (sys.stdout.write("@@cpudist " + json.dumps(e) + "\\n"), sys.stdout.flush())
print("ready", flush=True)
say(event="saving", step=4)
time.sleep({write_s})
open({done!r}, "w").write("whole")
say(event="checkpoint", step=4, path="step-000004")
print("after the checkpoint", flush=True)
"""


def test_a_stop_mid_checkpoint_waits_for_it_and_reads_the_last_lines(tmp_path: Path) -> None:
    write_s = runner.GRACE_S + 3  # longer than the plain grace: SIGKILL at GRACE_S would cut it off
    done = tmp_path / "state.pt"
    launch = Launch(argv=(sys.executable, "-c", RANK.format(write_s=write_s, done=str(done))),
                    rank_env={})
    seen: list[dict[str, Any]] = []
    lines: list[str] = []

    def on_line(line: str) -> None:
        lines.append(line)
        if line == "ready":  # the stop lands mid-write, as Ctrl-C or `cpudist stop` would
            threading.Timer(0.5, lambda: signal.pthread_kill(threading.main_thread().ident or 0,
                                                              signal.SIGINT)).start()

    started = time.monotonic()
    with pytest.raises(Interrupted):
        runner.execute(launch, {}, seen.append, on_line, on_stop=lambda: stop_marker.ask(tmp_path))
    assert done.read_text() == "whole"  # the checkpoint was let finish
    assert [e["event"] for e in seen] == ["saving", "checkpoint"]
    assert lines[-1] == "after the checkpoint"
    assert stop_marker.asked(tmp_path)  # rank 0 is told the stop is the user's before the SIGTERM
    assert time.monotonic() - started < runner.CHECKPOINT_GRACE_S


def test_the_checkpoint_grace_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "CHECKPOINT_GRACE_S", 2.0)
    monkeypatch.setattr(runner, "GRACE_S", 1.0)
    done = tmp_path / "state.pt"
    launch = Launch(argv=(sys.executable, "-c", RANK.format(write_s=60, done=str(done))),
                    rank_env={})

    def on_line(line: str) -> None:
        if line == "ready":
            threading.Timer(0.5, lambda: signal.pthread_kill(threading.main_thread().ident or 0,
                                                              signal.SIGINT)).start()

    started = time.monotonic()
    with pytest.raises(Interrupted):
        runner.execute(launch, {}, lambda e: None, on_line)
    assert time.monotonic() - started < 20 and not done.exists()
