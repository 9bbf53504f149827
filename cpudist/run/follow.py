"""Following the agent on the head: its output passed on, heartbeats to it, Ctrl-C and a lost link
turned into one-line errors."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from cpudist.errors import Interrupted, JobFailed
from cpudist.run.agent import ALIVE, HEARTBEAT_S, SILENCE_S, parse_status
from cpudist.run.request import Callbacks, RunRequest
from cpudist.ssh.client import LINK_ERRORS, Remote
from cpudist.wire import events

# the agent's own stop takes up to the runner's SIGTERM grace (10 s) plus teardown
STOP_GRACE_S = 40.0


class _Heartbeat:
    """`alive` lines to the agent every HEARTBEAT_S: without them for SILENCE_S it stops the ranks
    by itself."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.lock = threading.Lock()
        self.done = threading.Event()
        threading.Thread(target=self._beat, daemon=True, name="cpudist-heartbeat").start()

    def _beat(self) -> None:
        while not self.done.wait(HEARTBEAT_S):
            with self.lock:
                if self.done.is_set():
                    return
                try:
                    self.channel.sendall(f"{ALIVE}\n".encode())
                except LINK_ERRORS:
                    return  # the reader sees the connection end

    def last(self, data: bytes) -> None:
        """Send `data`, then end the agent's stdin; no heartbeat after it."""
        # a closed channel: the agent has gone already
        with self.lock, contextlib.suppress(*LINK_ERRORS):
            self.done.set()
            self.channel.sendall(data)
            self.channel.shutdown_write()


def follow(head: Remote, command: str, request: RunRequest, cb: Callbacks) -> dict[str, Any]:
    """Run the agent, pass its output on, stop it on Ctrl-C; the agent's final status."""
    channel = head.stream(command)
    beat = _Heartbeat(channel)
    try:
        with beat.lock:  # whole, before any heartbeat
            channel.sendall(f"{request.to_json()}\n{ALIVE}\n".encode())
        return _read_agent(head, channel, beat, cb)
    except LINK_ERRORS as e:
        if head.lost:
            raise _lost(head, e) from None
        raise
    finally:
        beat.done.set()


def _lost(head: Remote, why: object = None) -> JobFailed:
    return JobFailed(f"{head.lost_error(why).what}: the ranks there stop by themselves within "
                     f"{SILENCE_S:g}s",
                     "Check the network, then re-run the command (with --resume auto after a "
                     "checkpoint)")


def _read_agent(head: Remote, channel: Any, beat: _Heartbeat, cb: Callbacks) -> dict[str, Any]:
    status: dict[str, Any] = {}
    interrupted = False
    lines = channel.makefile("r")
    while True:
        try:
            for raw in lines:  # ends when the agent exits, or the connection is lost
                line = raw.rstrip("\n")
                found = parse_status(line)
                if found is not None:
                    status = found
                    continue
                event = events.parse(line)
                if event is not None:
                    cb.on_event(event)
                else:
                    cb.on_line(line)
            break
        # the agent did not finish stopping within the grace: nothing more to read
        except TimeoutError:
            break
        except KeyboardInterrupt:
            if interrupted:
                continue  # a second Ctrl-C: the ranks are being stopped already
            interrupted = True
            cb.on_line("[cpudist] stopping every rank on every node ...")
            beat.last(b"stop\n")
            channel.settimeout(STOP_GRACE_S)
    code = channel.recv_exit_status() if channel.exit_status_ready() or not interrupted else -1
    channel.close()
    if interrupted:
        raise Interrupted("interrupted: all ranks were stopped on every node",
                          "Re-run the command to start over")
    if not status and head.lost:
        raise _lost(head)
    if not status:
        raise JobFailed(f"the connection to the head ended without a result (exit code {code})",
                        "See the output above; re-run the command")
    return status
