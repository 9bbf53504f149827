"""The one wait helper: an answer as soon as the check gives one, a TimedOut naming the wait at the
deadline and not an interval later, the check's own errors untouched; and two waits built on it,
with real sockets and processes: sshd's banner (ssh/client.wait_banner) and the tether's stop of a
process tree."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from cpudist.errors import CpudistError
from cpudist.ssh.client import Unreachable, wait_banner
from cpudist.waits import TimedOut, wait_until


def answers(*values: int | None) -> Iterator[int | None]:
    yield from values


def test_the_first_answer_is_returned_and_nothing_is_checked_after_it() -> None:
    calls = answers(None, None, 7, 8)
    assert wait_until(lambda: next(calls), "seven", timeout_s=60, interval_s=0.01) == 7
    assert next(calls) == 8  # not called again once answered


def test_falsy_answers_count_only_none_means_not_yet() -> None:
    assert wait_until(lambda: 0, "zero", timeout_s=1) == 0
    assert wait_until(lambda: [], "an empty list", timeout_s=1) == []


def test_a_wait_that_never_ends_is_one_error_naming_it_at_its_deadline() -> None:
    checks: list[float] = []

    def never() -> None:
        checks.append(time.monotonic())

    start = time.monotonic()
    with pytest.raises(TimedOut) as failed:
        wait_until(never, "the banner of n1", timeout_s=0.3, interval_s=0.05,
                   hint="Check n1's sshd")
    took = time.monotonic() - start
    assert isinstance(failed.value, CpudistError) and failed.value.exit_code == 1
    assert failed.value.message == ("timed out after 0.3s waiting for the banner of n1. "
                                    "Check n1's sshd")
    # the last check is at the deadline, not before it
    assert took >= 0.3 and checks[-1] - start >= 0.3
    assert len(checks) >= 2


def test_a_long_interval_does_not_sleep_past_the_deadline() -> None:
    """An interval longer than the time left: the wait ends at its deadline, not an interval later
    (a 600 s boot wait polled every 5 s must not report 605 s)."""
    start = time.monotonic()
    with pytest.raises(TimedOut):
        wait_until(lambda: None, "nothing", timeout_s=0.2, interval_s=30)
    # 30 s if it slept a whole interval; generous for a busy machine
    assert time.monotonic() - start < 15


def test_the_checks_own_error_is_not_swallowed() -> None:
    def broken() -> None:
        raise ValueError("describe failed")

    with pytest.raises(ValueError, match="describe failed"):
        wait_until(broken, "anything", timeout_s=10)


def test_wait_banner_returns_once_sshd_answers_and_names_the_last_error_when_it_never_does(
) -> None:
    """A node that accepts connections but says nothing yet (booting), then sends its banner; and a
    port nobody listens on, which fails in one Unreachable line carrying the connection's last
    error."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port, accepted = server.getsockname()[1], []

        def serve() -> None:
            for n in range(3):
                conn, _ = server.accept()
                accepted.append(conn)
                if n == 2:
                    conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
                # the first two: closed without a word, as sshd before its keys are made
                conn.close()

        threading.Thread(target=serve, daemon=True).start()
        wait_banner("127.0.0.1", port, timeout_s=60, interval_s=0.05)
        assert len(accepted) == 3
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, never listening: connections are refused
        with pytest.raises(Unreachable,
                           match=rf"no SSH banner from 127.0.0.1:{port} after 0.3s \(.*refused"):
            wait_banner("127.0.0.1", port, timeout_s=0.3, interval_s=0.05)


STOP_TREE = """
import subprocess, sys, time
from cpudist.launch import tether
ignore = sys.argv[1] == "ignores-term"
code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);\
 print('up', flush=True); time.sleep(60)"
child = subprocess.Popen([sys.executable, "-c",\
 code if ignore else code.replace("signal.SIG_IGN", "signal.SIG_DFL")],
                         stdout=subprocess.PIPE, text=True)
assert child.stdout.readline() == "up\\n"
start = time.monotonic()
tether.stop_tree(grace_s=float(sys.argv[2]))
print(round(time.monotonic() - start, 2), len(tether.descendants(tether.os.getpid())))
"""


@pytest.mark.parametrize(("child", "grace_s", "at_least", "at_most"),
                         [("ends-on-term", 30.0, 0.0, 10.0),
                           ("ignores-term", 0.5, 0.5, 20.0)])
def test_the_tether_stops_a_tree_as_soon_as_it_is_gone(child: str, grace_s: float, at_least: float,
                                                       at_most: float) -> None:
    """A tree that ends on SIGTERM is done long before a 30 s grace; one that ignores it is killed
    after the grace."""
    r = subprocess.run([sys.executable, "-c", STOP_TREE, child, str(grace_s)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    took, left = r.stdout.split()
    assert at_least <= float(took) < at_most and left == "0", r.stdout
