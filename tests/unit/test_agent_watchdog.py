"""The agent's stdin watch (cpudist/run/agent.py): a laptop that sent heartbeats and went silent is
gone."""

from __future__ import annotations

import subprocess
import sys
import time

# A process that watches its stdin as the agent does, with 1 s of silence allowed; exit code 3 when
# interrupted (its stdout and stderr are /dev/null by then: nobody would read them).
WATCHER = """
import sys, threading, time
from cpudist.run import agent
threading.Thread(target=agent._watch_stdin, args=(1.0,), daemon=True).start()
try:
    time.sleep(30)
except KeyboardInterrupt:
    sys.exit(3)
"""


def watch(lines: list[str], keep_open_s: float) -> tuple[int | None, float]:
    """Feed `lines`, keep stdin open for up to `keep_open_s`; (the watcher's exit code or None,
    seconds it took)."""
    proc = subprocess.Popen([sys.executable, "-c", WATCHER], stdin=subprocess.PIPE, text=True)
    assert proc.stdin is not None
    for line in lines:
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
    fed = time.monotonic()
    try:
        code: int | None = proc.wait(timeout=keep_open_s)
    except subprocess.TimeoutExpired:
        code = None
        proc.kill()
        proc.wait()
    took = time.monotonic() - fed
    proc.stdin.close()
    return code, took


def test_silence_after_heartbeats_interrupts_the_job() -> None:
    code, took = watch(["{}", "alive", "alive"], keep_open_s=20)
    assert code == 3 and took < 15, (code, took)


def test_a_laptop_that_sends_no_heartbeats_is_not_timed_out() -> None:
    """An older laptop's cpudist says nothing while it watches: only the end of stdin stops its
    run."""
    code, _ = watch(["{}"], keep_open_s=3)
    assert code is None, code
