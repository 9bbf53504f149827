"""SIGTERM and SIGHUP stop a command as Ctrl-C does, except a signal it was started ignoring: under
`nohup` a hang-up stays ignored (the user asked the command to outlive the terminal), in a real
process with its own signal dispositions."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

PROGRAM = """
import os, signal
from cpudist.interrupts import shielded, signals_interrupt
try:
    with signals_interrupt() as seen:
        os.kill(os.getpid(), signal.{sig})
        with shielded(lambda: print("shielded", flush=True)):
            os.kill(os.getpid(), signal.{sig})
        print("went on", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def run(sig: str, ignored: bool) -> str:
    def start_ignoring() -> None:
        signal.signal(getattr(signal, sig), signal.SIG_IGN)  # what nohup does for SIGHUP

    r = subprocess.run([sys.executable, "-c", PROGRAM.format(sig=sig)], capture_output=True,
                       text=True, timeout=60, preexec_fn=start_ignoring if ignored else None)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.mark.parametrize("sig", ["SIGHUP", "SIGINT", "SIGTERM"])
def test_a_stop_signal_interrupts_the_command(sig: str) -> None:
    assert run(sig, ignored=False) == "interrupted"


@pytest.mark.parametrize("sig", ["SIGHUP", "SIGINT"])
def test_a_signal_started_ignored_stays_ignored_also_in_a_cleanup(sig: str) -> None:
    # neither raised nor handed to the cleanup's on_interrupt
    assert run(sig, ignored=True) == "went on"
