"""The suite's own guards against hangs: read_until and wait_for give up at their deadline, and
pytest-timeout (pyproject's pytest options) fails a stuck test while its fixtures still tear
down."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.helpers import descendants, output_of, read_until, wait_for

REPO = Path(__file__).resolve().parents[2]
SILENT = "import time; print('started', flush=True); time.sleep(3600)"


def popen(code: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def test_a_hung_command_fails_at_the_deadline_with_what_it_printed() -> None:
    proc = popen(SILENT)
    started = time.monotonic()
    with pytest.raises(pytest.fail.Exception,
                       match=r"waited 2 s for a line with 'step 3/', then killed it") as failed:
        read_until(proc, "step 3/", timeout=2)
    assert time.monotonic() - started < 30  # 2 s and the kill, not the hour the command would sleep
    assert "started" in str(failed.value)
    assert proc.poll() is not None  # killed, not left behind


def test_a_command_that_ends_without_the_marker_fails_at_once() -> None:
    proc = popen("print('done: nothing'); raise SystemExit(3)")
    with pytest.raises(pytest.fail.Exception,
                       match=r"ended \(exit code 3\) without a line with 'step 3/'"):
        read_until(proc, "step 3/", timeout=60)


def test_the_lines_up_to_the_marker_then_the_rest() -> None:
    proc = popen("print('a'); print('step 3/9'); print('b'); print('c')")
    assert read_until(proc, "step 3/", timeout=60) == ["a\n", "step 3/9\n"]
    assert read_until(proc, None, timeout=60) == ["b\n", "c\n"]
    assert proc.wait(timeout=60) == 0


def test_output_of_kills_the_command_and_what_it_started() -> None:
    """A failed wait's message: the command's output, once it and its children (which hold its
    pipes) are gone."""
    proc = popen("import subprocess, sys, time; print('parent up', flush=True); "
                 "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)']); "
                 "time.sleep(3600)")
    (child,) = wait_for(lambda: descendants(proc.pid), 60, "the child to start")
    note = output_of(proc)
    assert note.startswith("exit code -9") and "parent up" in note, note
    wait_for(lambda: not Path(f"/proc/{child}").exists()
             or "Z" in Path(f"/proc/{child}/stat").read_text(), 30,
             "the child to be killed")


def test_wait_for_returns_the_value_or_fails_saying_what_and_why() -> None:
    calls = iter(range(10))
    assert wait_for(lambda: next(calls) >= 2 and "third", 10, "the third call",
                    interval=0) == "third"
    with pytest.raises(pytest.fail.Exception, match=r"waited 0\.2 s for a ready flag: flag is off"):
        wait_for(lambda: False, 0.2, "a ready flag", lambda: "flag is off")


STUCK = """
import time
from pathlib import Path

import pytest


@pytest.fixture
def held(tmp_path):
    yield
    Path(r"{marker}").write_text("torn down")


def test_stuck(held):
    time.sleep(3600)
"""


def test_a_stuck_test_times_out_and_its_fixtures_still_tear_down(tmp_path: Path) -> None:
    """The repository's pytest options (only the limit lowered): the timeout fires, and by SIGALRM,
    so the fixture's teardown runs (the thread method would end the whole run with os._exit, leaking
    what it held)."""
    marker = tmp_path / "teardown"
    (tmp_path / "test_stuck.py").write_text(STUCK.format(marker=marker))
    r = subprocess.run([sys.executable, "-m", "pytest", "-c", str(REPO / "pyproject.toml"),
                        "--rootdir", str(tmp_path), "-p", "no:cacheprovider", "-o", "timeout=3",
                        str(tmp_path / "test_stuck.py")],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 1, r.stdout[-3000:]
    assert ("Timeout (>3.0s) from pytest-timeout" in r.stdout
            and "1 failed" in r.stdout), r.stdout[-3000:]
    assert marker.read_text() == "torn down"
