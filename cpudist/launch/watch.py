"""Watching a launch's nodes: one that vanishes mid-run (powered off, reclaimed, cut off) ends the
run in one line.

No launcher notices a node that went silent (no FIN, no RST): the other ranks wait in their
collectives until --dist-timeout, then Hydra waits for the dead node's proxy for ever. So while a
launch runs across nodes, the head holds one idle ssh session to every other node over the
launcher's own ssh, with OpenSSH's keepalives (ServerAlive*: each waits for a reply, unlike TCP's).
A session that ends is checked with one fresh connection: a node that answers it gets a new session
(a slow moment is not a loss); one that does not is lost, and the launch is stopped. Cost: one idle
ssh per node and a keepalive each way every KEEPALIVE_S.

Bound: a node that goes silent is reported within DETECTION_BOUND_S (its session gives up after
KEEPALIVE_MISSES unanswered keepalives, within KEEPALIVE_S * (KEEPALIVE_MISSES + 1), then the fresh
connection within CONFIRM_S).
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from cpudist.errors import JobFailed
from cpudist.launch.spec import RunSpec
from cpudist.launch.tools import is_this_machine

KEEPALIVE_S = 5  # ssh's ServerAliveInterval on the watching session
KEEPALIVE_MISSES = 2  # ssh's ServerAliveCountMax: unanswered keepalives before the session gives up
CONNECT_S = 5  # ConnectTimeout of the checking connection (TCP and banner)
CONFIRM_S = 10  # the whole checking `ssh NODE true`, login included
# 25 s from silence to the report
DETECTION_BOUND_S = KEEPALIVE_S * (KEEPALIVE_MISSES + 1) + CONFIRM_S
STOP_S = 5.0  # for a watching session to end once the watch closes


@dataclass(frozen=True)
class Lost:
    """A node that stopped answering, and ssh's last words about it."""

    node: str
    why: str


def _ssh_argv(ssh: str, node: str, *command: str) -> list[str]:
    return [ssh, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_S}", "-o",
            f"ServerAliveInterval={KEEPALIVE_S}",
            "-o", f"ServerAliveCountMax={KEEPALIVE_MISSES}", node, *command]


def _answers(ssh: str, node: str) -> str | None:
    """None when `node` takes a fresh ssh login now; else why not."""
    try:
        p = subprocess.run(_ssh_argv(ssh, node, "true"), capture_output=True, text=True,
                           timeout=CONFIRM_S, stdin=subprocess.DEVNULL, start_new_session=True)
    except subprocess.TimeoutExpired:
        return f"no ssh login within {CONFIRM_S}s"
    except OSError as e:
        return str(e)
    return None if p.returncode == 0 else (p.stderr.strip().splitlines()
                                           or [f"ssh exit code {p.returncode}"])[-1]


class NodeWatch:
    """An idle ssh session to each node while a launch runs; `stop` is called once, at the first
    node lost."""

    def __init__(self, nodes: Sequence[str], ssh: str) -> None:
        self.nodes = tuple(nodes)
        self.ssh = ssh
        self.lost: Lost | None = None
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._sessions: dict[str, subprocess.Popen[str]] = {}
        self._stop: Callable[[], None] = lambda: None

    def start(self, stop: Callable[[], None]) -> None:
        """Watch every node from now on; `stop` (the launch's) runs in the watch's thread when one
        is lost."""
        self._stop = stop
        for node in self.nodes:
            threading.Thread(target=self._watch, args=(node,), daemon=True,
                             name=f"cpudist-watch-{node}").start()

    def _open(self, node: str) -> subprocess.Popen[str] | None:
        with self._lock:
            if self._closed.is_set():
                return None
            # `cat` waits on a stdin never written to: the session idles until we close it (or we
            # die)
            try:
                session = subprocess.Popen(_ssh_argv(self.ssh, node, "cat"), stdin=subprocess.PIPE,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                           text=True,
                                           # a terminal's Ctrl-C is the launch's, not ours
                                           start_new_session=True)
            # no ssh program (the node check before the launch used it): this node goes unwatched
            except OSError:
                return None
            self._sessions[node] = session
            return session

    def _watch(self, node: str) -> None:
        while (session := self._open(node)) is not None:
            session.wait()
            if self._closed.is_set():
                return
            # ssh's own words (the session's are hidden by LogLevel ERROR)
            why = _answers(self.ssh, node)
            if why is None:  # it answers: a hiccup, or the session ended for its own reasons
                if self._closed.wait(KEEPALIVE_S):
                    return
                continue
            self._report(Lost(node, why))
            return

    def _report(self, lost: Lost) -> None:
        with self._lock:
            if self.lost is not None or self._closed.is_set():
                return
            self.lost = lost
        self._stop()

    def check_now(self) -> Lost | None:
        """After a launch failed unwatched-for: the first node that does not take a fresh login now
        (or the lost)."""
        if self.lost is None and self.nodes:
            with ThreadPoolExecutor(max_workers=min(32, len(self.nodes))) as pool:
                for node, why in zip(self.nodes,
                                     pool.map(lambda n: _answers(self.ssh, n), self.nodes),
                                     strict=True):
                    if why is not None:
                        self.lost = Lost(node, why)
                        break
        return self.lost

    def close(self) -> None:
        """End every watching session (their far ends see stdin close); no report after this."""
        with self._lock:
            self._closed.set()
            sessions = list(self._sessions.values())
        for session in sessions:
            with contextlib.suppress(OSError):
                assert session.stdin is not None
                session.stdin.close()
        for session in sessions:
            try:
                session.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                session.kill()
                session.wait()


def node_watch(spec: RunSpec) -> NodeWatch | None:
    """The watch of a launch across nodes (every used node but this one); None on one machine or
    under Slurm, which watches its nodes itself (NODE_FAIL)."""
    if spec.hostfile is None or spec.launcher == "slurm":
        return None
    others = [h.name for h in spec.hosts[: max(1, spec.np // spec.ppn)]
              if not is_this_machine(h.name)]
    return NodeWatch(others, spec.ssh) if others else None


def lost_error(lost: Lost) -> JobFailed:
    """The run's one line when a node was lost."""
    return JobFailed(f"node {lost.node} stopped answering ({lost.why}); the run was stopped on "
                     "every other node",
                     "Check it (`cpudist cluster status` for a cluster, whose `cluster up` "
                     "replaces a reclaimed node; `cpudist hosts doctor` for a hostfile), then "
                     "re-run the command (with --resume auto after a checkpoint)")
