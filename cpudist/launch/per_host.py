"""One launcher per host (a launch's `per_host`: torchrun started over ssh on every node), their
lines in one stream; the first host to fail, or Ctrl-C, stops the rest."""

from __future__ import annotations

import contextlib
import queue
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cpudist.errors import Interrupted
from cpudist.launch.runner import Outcome, stop_launcher
from cpudist.launch.spec import Launch
from cpudist.launch.watch import NodeWatch
from cpudist.wire import events, programs


def host_line(python: str, cwd: str, env: dict[str, str], agent: Sequence[str],
              from_file: Sequence[str] = ()) -> str:
    """The shell line a host runs: in the run's folder, with the rank variables, the agent under the
    tether; those named in `from_file` the tether takes from the run's secrets file instead."""
    variables = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items() if k not in from_file)
    tether = [python, "-m", programs.TETHER]
    if from_file:
        tether += ["--from-secrets", ",".join(from_file)]
    agent_line = shlex.join([*tether, "--", *agent])
    return f"cd {shlex.quote(cwd)} && exec env {variables} {agent_line}"


# after stdin closes, each host's tether stops its tree (SIGTERM, 5 s, SIGKILL)
HOSTS_GRACE_S = 20.0


class Hosts:
    """One process per host (launch.per_host): their lines in one queue, and stopping them all."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = dict(env)
        self.lines: queue.Queue[tuple[str, str | None]] = queue.Queue()
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.stopping_since: float | None = None

    def start(self, host: str, argv: tuple[str, ...]) -> None:
        """Start (or start again) `host`'s command; its lines come as (host, line), then (host,
        None)."""
        self.procs[host] = subprocess.Popen(list(argv), env=self.env, stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                            text=True, bufsize=1, start_new_session=True)
        threading.Thread(target=self._pump, args=(host, self.procs[host]), daemon=True).start()

    def _pump(self, host: str, proc: subprocess.Popen[str]) -> None:
        stdout = proc.stdout
        assert stdout is not None
        for raw in stdout:
            self.lines.put((host, raw.rstrip("\n")))
        self.lines.put((host, None))

    def stop(self) -> None:
        """Close every host's stdin: its tether stops the agent and ranks there, then ssh ends."""
        if self.stopping_since is None:
            self.stopping_since = time.monotonic()
        for proc in self.procs.values():
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()

    def overdue(self) -> None:
        """Past the grace after stop(): kill what still runs here (the far ends see their session
        end)."""
        if (self.stopping_since is not None
                and time.monotonic() - self.stopping_since > HOSTS_GRACE_S):
            for proc in self.procs.values():
                if proc.poll() is None:
                    stop_launcher(proc)

    def follow(self, rules: Rules, on_event: Callable[[dict[str, Any]], None],
               on_line: Callable[[str], None], timeout_s: float | None = None,
               on_late_line: Callable[[str], None] | None = None,
               on_stop: Callable[[], None] | None = None) -> tuple[bool, tuple[str, ...]]:
        """Hand the hosts' lines out while `rules` is busy: events, `[host]`-tagged lines (the last
        20 kept), ends; past `timeout_s` or on Ctrl-C every host is stopped. Returns whether the
        deadline passed and the kept lines; raises Interrupted after Ctrl-C, with nothing left
        running here."""
        tail: list[str] = []
        deadline = time.monotonic() + timeout_s if timeout_s else None
        expired = interrupted = False
        try:
            while rules.busy():
                try:
                    now = time.monotonic()
                    if deadline is not None and now > deadline and not expired:
                        expired = True
                        rules.halt()
                        self.stop()
                    rules.tick(now)
                    self.overdue()
                    try:
                        host, line = self.lines.get(timeout=0.5)
                    except queue.Empty:
                        continue
                    if line is None:
                        rules.ended(host, self.procs[host].wait(), now)
                        continue
                    event = events.parse(line)
                    if event is not None:
                        rules.saw(host, event)
                        if rules.shows(host):
                            on_event(event)
                    elif (self.stopping_since is not None and rules.late(host)
                          and on_late_line is not None):
                        on_late_line(f"[{host}] {line}")
                    else:
                        tail = [*tail, f"[{host}] {line}"][-20:]
                        on_line(tail[-1])
                except KeyboardInterrupt:
                    if on_stop is not None and not interrupted:
                        on_stop()
                    interrupted = True
                    rules.halt()
                    self.stop()
        finally:
            for proc in self.procs.values():
                # any other way out must not leave a host's command running
                if proc.poll() is None:
                    stop_launcher(proc)
        if interrupted:
            raise Interrupted("interrupted: all ranks were stopped on every node",
                              "Re-run the command to start over")
        return expired, tuple(tail)


class Rules:
    """What a launch does as its hosts' commands end (Hosts.follow): by default, each host runs to
    its end."""

    def __init__(self, hosts: Hosts) -> None:
        self.hosts, self.running = hosts, set(hosts.procs)

    def busy(self) -> bool:  # whether to wait for more lines
        return bool(self.running)

    def tick(self, now: float) -> None:  # about every half second
        pass

    def ended(self, host: str, code: int, now: float) -> None:
        self.running.discard(host)

    def shows(self, host: str) -> bool:  # whether `host`'s events drive the progress
        return True

    def saw(self, host: str, event: dict[str, Any]) -> None:  # every host's events, as they come
        pass

    def late(self, host: str) -> bool:  # its lines while the hosts stop go to the log
        return True

    def halt(self) -> None:  # the deadline passed, or Ctrl-C: the hosts stop next
        pass


class _FirstFails(Rules):
    """The first host to fail stops the rest (its lines stay in view)."""

    failed: tuple[str, int] | None = None

    def ended(self, host: str, code: int, now: float) -> None:
        super().ended(host, code, now)
        if code != 0 and self.failed is None and self.hosts.stopping_since is None:
            self.failed = (host, code)  # the cause; the others' ends follow from it
            self.hosts.stop()

    def late(self, host: str) -> bool:
        return self.failed is None or host != self.failed[0]


def execute_hosts(launch: Launch, base_env: Mapping[str, str],
                  on_event: Callable[[dict[str, Any]], None],
                  on_line: Callable[[str], None], timeout_s: float | None = None,
                  on_late_line: Callable[[str], None] | None = None, watch: NodeWatch | None = None,
                  on_stop: Callable[[], None] | None = None) -> Outcome:
    """Run one launcher per host, lines prefixed `[host]`; the first to fail (or Ctrl-C) stops the
    rest.

    What the other hosts print while they stop (torchrun's tracebacks of its SIGTERM) goes to
    `on_late_line` (the run's log) rather than `on_line`, so the failure stays in view.
    """
    hosts = Hosts(base_env)
    for host, argv in launch.per_host:
        hosts.start(host, argv)
    rules = _FirstFails(hosts)
    if watch is not None:
        watch.start(hosts.stop)
    try:
        expired, tail = hosts.follow(rules, on_event, on_line, timeout_s, on_late_line, on_stop)
    finally:
        if watch is not None:
            watch.close()
    failed = rules.failed
    code = failed[1] if failed else max((p.returncode for p in hosts.procs.values()), key=abs,
                                        default=0)
    return Outcome(code, expired, tail, failed[0] if failed else None)
