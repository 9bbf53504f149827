"""`cpudist stop` and `cpudist logs` against run folders written here, with a real process standing
in for the launching `cpudist run` (the whole path with real ranks is
tests/integration/test_run_control.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from cpudist.cli.main import cli
from cpudist.errors import BadInput
from cpudist.run.life.control import find_run
from cpudist.run.life.identity import RunInfo, read_run, write_run
from cpudist.run.life.process import start_ticks, this_host
from cpudist.run.life.runlog import show, tee
from cpudist.run.request import Callbacks
from cpudist.wire import names

CPUDIST = [sys.executable, "-m", "cpudist.cli"]


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that SIGINT ends (as it ends a `cpudist run`), to stand for a run's launching
    process."""
    proc = subprocess.Popen(["sleep", "120"])
    yield proc
    proc.kill()
    proc.wait()


def running(folder: Path, run_id: str, pid: int, start: int, host: str | None = None) -> Path:
    folder.mkdir(parents=True)
    write_run(folder,
              RunInfo(id=run_id, task="mrpc", model="tiny", where="here", state="running",
                      started_at="2026-11-26T10:00:00+00:00",
                      run_dir=str(folder), pid=pid, host=host or this_host(), pid_start=start))
    return folder


def stop(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(cli, ["stop", *args])
    return r.exit_code, r.output


def test_a_reused_pid_is_never_signalled(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    """run.json's start time differs from the process's that has the PID now: refused, nothing
    signalled; with the recorded start time the same stop does signal it (so the guard, not a broken
    signal, spared it)."""
    start = start_ticks(sleeper.pid)
    assert start
    stale = running(tmp_path / "stale", "20261126-100000-aaaaaa", sleeper.pid, start - 1)
    code, out = stop(str(stale), "--wait", "5")
    assert code == 2 and "nothing was signalled" in out and len(out.strip().splitlines()) == 1, out
    time.sleep(0.3)
    assert sleeper.poll() is None, "the process of a reused PID was signalled"
    assert read_run(stale).state == "running"  # type: ignore[union-attr]

    same = running(tmp_path / "same", "20261126-100000-bbbbbb", sleeper.pid, start)
    code, out = stop(str(same), "--wait", "20")
    assert sleeper.wait(timeout=10) == -signal.SIGINT
    assert code == 1 and "ended without recording how" in out, out  # sleep never writes run.json


def test_a_run_not_running_or_elsewhere_is_one_line_and_exit_2(
        tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    done = tmp_path / "done"
    done.mkdir()
    write_run(done,
              RunInfo(id="20261126-100000-cccccc", task="mrpc", model="tiny", where="here",
                      state="finished",
                      started_at="2026-11-26T10:00:00+00:00",
                      run_dir=str(done), pid=sleeper.pid, host=this_host(),
                      pid_start=start_ticks(sleeper.pid)
                      or 0))
    code, out = stop(str(done))
    assert code == 2 and out.strip() == ("Error: run 20261126-100000-cccccc is not running (it is "
                                         "finished). Nothing to stop; `cpudist runs` shows every "
                                         "run's state"), out
    away = running(tmp_path / "away", "20261126-100000-dddddd", sleeper.pid,
                   start_ticks(sleeper.pid) or 0, host="other-host")
    code, out = stop(str(away))
    assert (code == 2 and "started on other-host" in out
            and "cpudist stop 20261126-100000-dddddd` on other-host" in out)
    # a run.json from before pid was recorded still reads, and says what to do
    old = tmp_path / "old"
    old.mkdir()
    (old / "run.json").write_text(json.dumps({"id": "20261126-090000-eeeeee", "task": "mrpc",
                                              "model": "tiny", "where": "here", "state": "running",
                                              "started_at": "x", "run_dir": str(old)}))
    code, out = stop(str(old))
    assert code == 2 and "names no process" in out and "Ctrl-C in its terminal" in out, out
    time.sleep(0.3)
    assert sleeper.poll() is None


def test_find_run_by_id_prefix_or_folder(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for name, run_id in (("a", "20261126-101502-3fa9c1"), ("b", "20261126-101502-77aa00"),
                         ("c", "20261127-080000-1")):
        running(runs / name, run_id, 1, 1)
    assert find_run("20261127", [runs], []).id == "20261127-080000-1"
    assert find_run("20261126-101502-3f", [runs], []).run_dir == str(runs / "a")
    assert find_run(str(runs / "b"), [], []).id == "20261126-101502-77aa00"
    with pytest.raises(BadInput, match="names 2 runs"):
        find_run("20261126-101502", [runs], [])
    with pytest.raises(BadInput, match="no run '2025'"):
        find_run("2025", [runs], [])


def test_the_log_tees_lines_and_events_and_a_new_run_starts_it_afresh(tmp_path: Path) -> None:
    shown: list[object] = []
    running(tmp_path / "r", "20261126-100000-ffffff", 1, 1)
    out = tmp_path / "r"
    (out / names.LOG).write_text("an older run's line\n")
    cb = tee(Callbacks(shown.append, shown.append, shown.append), out, "20261126-100000-ffffff")
    cb.on_line("[vm:0] rank 0/1 ready")
    cb.on_event({"event": "progress", "step": 2, "total": 9, "loss": 0.5, "samples_per_s": 10.0})
    cb.on_event({"event": "checkpoint", "step": 2, "path": "ck/step-000002"})
    text = (out / names.LOG).read_text()
    assert text == ("an older run's line\n[vm:0] rank 0/1 ready\n"
                    "[cpudist] step 2/9  loss 0.5000  10.0 samples/s\n"
                    # same id: a resume's part appends
                    "[cpudist] checkpoint at step 2: ck/step-000002\n")
    assert len(shown) == 3  # and the terminal still gets all of it
    fresh = tee(Callbacks(shown.append, shown.append), out, "20261126-110000-000000")
    fresh.note("a new run")
    assert (out / names.LOG).read_text() == "[cpudist] a new run\n"
    got: list[str] = []
    # without -f it returns with the log so far
    assert show(out, got.append, follow=False) == "running"
    assert "".join(got) == "[cpudist] a new run\n"


def test_logs_follow_ends_with_the_run_and_ctrl_c_exits_130_quietly(
        tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    out = running(tmp_path / "r", "20261126-100000-abcdef", sleeper.pid, start_ticks(sleeper.pid)
                  or 0)
    (out / names.LOG).write_text("first\n")
    follow = subprocess.Popen([*CPUDIST, "logs", "-f", str(out)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert follow.stdout is not None and follow.stdout.readline() == "first\n"
        with (out / names.LOG).open("a") as f:
            f.write("second\n")
        assert follow.stdout.readline() == "second\n"
        info = read_run(out)
        assert info is not None
        write_run(out, RunInfo.from_dict({**info.to_dict(), "state": "interrupted"}))
        rest, err = follow.communicate(timeout=30)
        assert (follow.returncode == 0 and rest == ""
                and "run 20261126-100000-abcdef is interrupted" in err)
    finally:
        follow.kill()
    write_run(out, RunInfo.from_dict({**info.to_dict(), "state": "running"}))
    follow = subprocess.Popen([*CPUDIST, "logs", "-f", str(out)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert follow.stdout is not None and follow.stdout.readline() == "first\n"
        follow.send_signal(signal.SIGINT)
        _, err = follow.communicate(timeout=30)
        assert follow.returncode == 130 and err == "", err
    finally:
        follow.kill()


def test_logs_head_of_a_run_without_a_head_says_where_its_output_is(tmp_path: Path) -> None:
    here = tmp_path / "here"
    here.mkdir()
    write_run(here,
              RunInfo(id="20261126-100000-123456", task="mrpc", model="tiny", where="here",
                      state="finished", started_at="2026-11-26T10:00:00+00:00", run_dir=str(here)))
    r = CliRunner().invoke(cli, ["logs", "--head", str(here)])
    assert r.exit_code == 2 and r.output == ("Error: run 20261126-100000-123456 ran here, not on "
                                             "a head over SSH: its "
                                             f"ranks' output is in {here}. `cpudist logs` without "
                                             "--head shows it\n")
