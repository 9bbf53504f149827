"""`cpudist run --detach` from outside the cluster: stage as a remote run does, start the agent on
the head in a session of its own (setsid, nohup), wait for the ranks to be up, and leave; run.json
keeps what it takes to come back (`cpudist logs -f`, run/life/attach.py) or stop it (`cpudist
stop`).

    <head run dir>/agent.request.json   the request; the agent leaves it with its --env and secret
                                        values as ***
    <head run dir>/agent.log            the agent's output: rank lines and progress events
    <head run dir>/agent.pid            the agent's PID and start time (the guard of
                                        run/life/process.py)
    <head run dir>/agent.status         its final status line: its presence says the run ended
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cpudist.errors import Interrupted, JobFailed
from cpudist.run.agent import LOG_FILE, PID_FILE, REQUEST_FILE, STATUS_FILE, parse_status
from cpudist.run.life.headlog import HEAD_LOG_MARK, read_mark, write_mark
from cpudist.run.life.identity import read_run, write_run
from cpudist.run.remote import Landing, agent_command, python_words, stage_run
from cpudist.run.request import Callbacks, RunRequest
from cpudist.run.where import Head
from cpudist.ssh.client import Remote, Target
from cpudist.ssh.known_hosts import KnownHosts
from cpudist.waits import TimedOut, wait_until
from cpudist.wire import events

# staging is done by then: this is the launcher's start and the model's load on the nodes
READY_WAIT_S = 600.0


@dataclass(kw_only=True, frozen=True)
class Detached:
    """run.json's `detached`: how to reach the head, where the run is there, and how to land it."""

    host: str
    user: str | None
    port: int
    identity: str | None
    known_hosts: str
    python: str
    pythonpath: str | None
    run_dir: str  # on the head
    agent_pid: int
    agent_start: int  # clock ticks after the head's boot (run/life/process.py)
    fetch_model: bool
    report_to: bool
    ledger: str
    staging: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Detached:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def target(self) -> Target:
        return Target(self.host, self.user, self.port, self.identity)

    def connect(self) -> Remote:
        return Remote(self.target(), KnownHosts(Path(self.known_hosts)))

    def landing(self, local_dir: Path) -> Landing:
        return Landing(self.run_dir, local_dir, self.fetch_model, self.staging, Path(self.ledger))


class HeadLog:
    """The agent's log on the head, read on from where the last read ended, passed to callbacks line
    by line."""

    def __init__(self, head: Remote, run_dir: str, cb: Callbacks, mark: Path | None = None) -> None:
        self.head, self.cb, self.mark, self.path = head, cb, mark, f"{run_dir}/{LOG_FILE}"
        self.log, self.status = shlex.quote(self.path), shlex.quote(f"{run_dir}/{STATUS_FILE}")
        # what cpudist.log holds already
        self.offset = read_mark(mark, self.path) if mark is not None else 0
        self.events = 0

    def poll(self) -> dict[str, Any] | None:
        """Pass on the new whole lines; the agent's final status once it ended (read first: the log
        is whole then)."""
        code, out, _ = self.head.run(f"cat {self.status} 2>/dev/null")
        status = parse_status(out.strip()) if code == 0 and out.strip() else None
        code, out, _ = self.head.run(f"tail -c +{self.offset + 1} {self.log} 2>/dev/null",
                                     timeout=300)
        data = out.encode()
        end = data.rfind(b"\n") + 1
        for line in data[:end].decode(errors="replace").splitlines():
            event = events.parse(line)
            if event is not None:
                self.events += 1
                self.cb.on_event(event)
            elif parse_status(line) is None:
                self.cb.on_line(line)
        self.offset += end
        if end and self.mark is not None:
            write_mark(self.mark, self.path, self.offset)
        return status


def interrupt_agent(head: Remote, d: Detached) -> bool:
    """SIGINT (SIGTERM where it ignores SIGINT) to the agent on the head, only if its PID is still
    that agent (run/life/process.interrupt, run there); False when it is gone."""
    code = ("import sys\nfrom cpudist.run.life.process import Proc, interrupt\n"
            "try:\n    interrupt(Proc(int(sys.argv[1]), '', int(sys.argv[2])))\n"
            "except ProcessLookupError:\n    sys.exit(3)\n")
    rc, _, err = head.run(f"{python_words(d.python, d.pythonpath)} -c {shlex.quote(code)} "
                          f"{d.agent_pid} {d.agent_start}")
    if rc not in (0, 3):
        raise JobFailed(f"signalling the agent (PID {d.agent_pid}) on {d.host} failed: "
                        f"{err.strip()[-300:]}",
                        f"ssh to {d.host} and `kill -INT {d.agent_pid}`")
    return rc == 0


def start(request: RunRequest, head_spec: Head, ledger: Path, cb: Callbacks,
          ready_wait_s: float = READY_WAIT_S) -> Detached:
    """Stage, start the agent detached on the head, record it in run.json, and return once the ranks
    are up (the first progress event in its log)."""
    started = time.monotonic()
    local_dir = Path(request.train.output_dir)
    with Remote(head_spec.target, KnownHosts(head_spec.known_hosts)) as head:
        staged = stage_run(head, request, head_spec, cb.on_line, started)
        rd = shlex.quote(staged.run_dir)
        head.check(f"rm -f {rd}/{STATUS_FILE} {rd}/{PID_FILE} {rd}/{LOG_FILE} && umask 077 && "
                   f"cat > {rd}/{REQUEST_FILE}", stdin=staged.job.to_json().encode())
        # From the home folder (Hydra starts the ranks in the launcher's folder); a session of its
        # own: the SSH session's end sends it nothing, and nohup keeps a hang-up ignored.
        head.check("cd && (setsid nohup "
                   f"{agent_command(staged.python, staged.pythonpath, f' --detached {rd}')} "
                   f"</dev/null >{rd}/{LOG_FILE} 2>&1 &)")

        def pid() -> dict[str, Any] | None:
            code, out, _ = head.run(f"cat {rd}/{PID_FILE} 2>/dev/null")
            return json.loads(out) if code == 0 and out.strip() else None

        try:
            agent = wait_until(pid, f"the agent to start on {head_spec.target.host}", 120, 0.5)
        # no agent took the request (and its values) from its file: nothing else will
        except BaseException:
            head.run(f"rm -f {rd}/{REQUEST_FILE}")
            raise
        target = head_spec.target
        d = Detached(host=target.host, user=target.user, port=target.port, identity=target.identity,
                     known_hosts=str(head_spec.known_hosts), python=staged.python,
                     pythonpath=staged.pythonpath, run_dir=staged.run_dir,
                     agent_pid=int(agent["pid"]), agent_start=int(agent["start"]),
                     fetch_model=head_spec.fetch_model, report_to=bool(request.train.report_to),
                     ledger=str(ledger), staging=staged.staging)
        info = read_run(local_dir)
        if info is not None:
            write_run(local_dir, dataclasses.replace(info, detached=dataclasses.asdict(d)))
        # a new agent.log (a resumed part's too): from its start
        (local_dir / HEAD_LOG_MARK).unlink(missing_ok=True)
        log = HeadLog(head, staged.run_dir, cb, local_dir / HEAD_LOG_MARK)
        try:
            status = wait_until(lambda: log.poll() or (True if log.events else None),
                                "the ranks to start on the head", ready_wait_s, 1.0)
        except KeyboardInterrupt:
            interrupt_agent(head, d)
            raise Interrupted("interrupted before the ranks were up: the agent on the head was "
                              "stopped",
                              "Re-run the command") from None
        except TimedOut:
            interrupt_agent(head, d)
            raise JobFailed(f"the ranks did not start on {target.host} within {ready_wait_s:g}s; "
                            "the agent there was stopped",
                            f"`cpudist logs --head` and {staged.run_dir}/{LOG_FILE} there say why"
                            ) from None
        if isinstance(status, dict) and not log.events:
            raise JobFailed("on the head node: "
                            f"{status.get('message', 'the agent ended before the ranks started')}")
    return d
