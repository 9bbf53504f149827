"""The head-node side of a run started elsewhere: `python -m cpudist.run.agent`, spec on stdin, for
every payload (the trainer, a user's script: run/payloads.py).

The laptop sends one JSON line (a RunRequest), keeps stdin open while it watches, and reads rank
output and progress events from stdout. End of stdin (Ctrl-C on the laptop, or a lost connection)
stops every rank, as Ctrl-C does for a local run; so do SIGTERM and SIGHUP. A laptop that sends
`alive` lines is watched: SILENCE_S without one means its link dropped without a word (sshd would
notice only when TCP gives up, some 15 minutes later), and the ranks are stopped too.

`python -m cpudist.run.agent --detached RUN_DIR` (`cpudist run --detach`): no laptop to watch. The
request is RUN_DIR/agent.request.json (left with its --env and secret values as *** once read), the
output goes (by the shell that starts it) to RUN_DIR/agent.log, the agent's PID and start time to
RUN_DIR/agent.pid (`cpudist stop` checks both before it signals), its final status line to
RUN_DIR/agent.status. SIGINT and SIGTERM stop every rank; a hang-up stays ignored (nohup).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from cpudist.errors import CpudistError
from cpudist.run.request import Callbacks, RunRequest
from cpudist.state import write_atomic
from cpudist.wire import events, exits

STATUS = "@@cpudist-agent "
ALIVE = "alive"  # the laptop's heartbeat line, sent every HEARTBEAT_S
HEARTBEAT_S = 5.0
SILENCE_S = 30.0  # no line from a laptop that sends heartbeats for this long: it is gone
REQUEST_FILE, LOG_FILE, PID_FILE, STATUS_FILE = ("agent.request.json", "agent.log", "agent.pid",
                                                 "agent.status")


def status_line(**fields: Any) -> str:
    return STATUS + json.dumps(fields)


def parse_status(line: str) -> dict[str, Any] | None:
    if not line.startswith(STATUS):
        return None
    value: dict[str, Any] = json.loads(line[len(STATUS):])
    return value


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _read_stdin(lines: queue.Queue[str | None]) -> None:
    for line in sys.stdin:
        lines.put(line.strip())
    lines.put(None)


def _watch_stdin(silence_s: float = SILENCE_S) -> None:
    """End of stdin, a `stop` line, or silence once heartbeats began: the laptop wants out or is
    gone, so interrupt the job."""
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_read_stdin, args=(lines,), daemon=True).start()
    beating = False
    while True:
        try:
            line = lines.get(timeout=silence_s if beating else None)
        except queue.Empty:
            # Nobody reads our output any more: writes to it must not block the stop (the channel's
            # window fills).
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            break
        if line is None or line == "stop":
            break
        beating = beating or line == ALIVE
    os.kill(os.getpid(), signal.SIGINT)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def execute(req: RunRequest) -> int:
    """Run the request like `cpudist run --hostfile` on this node, say its status line; the exit
    code to leave with.

    The result is recorded by the laptop (run/outcome.record), with what only this side knows from
    the status.
    """
    status = outcome_of(req)
    _say(status_line(**status))
    return int(status["exit_code"])


def outcome_of(req: RunRequest) -> dict[str, Any]:
    """The run's status (the fields of the agent's status line)."""
    from cpudist.launch.kinds import plan
    from cpudist.run.payloads import run_here, spec_of

    try:
        spec = spec_of(req)
        launched = run_here(req, spec, plan(spec),
                            Callbacks(lambda e: _say(events.relay(e)), _say, _say))
    except CpudistError as e:
        return {"status": "error", "exit_code": e.exit_code, "message": e.message}
    except KeyboardInterrupt:
        return {"status": "error", "exit_code": exits.FAILED,
                "message": "interrupted before the ranks started"}
    return {"status": "ok", "exit_code": exits.OK, "output_dir": req.train.output_dir,
            "launched": launched.to_dict()}


def take_request(path: Path) -> RunRequest:
    """The request of a detached run, its file left holding the shown request: the --env and secret
    values live on in this process only (and in the nodes' secrets files while the ranks run)."""
    try:
        req = RunRequest.from_json(path.read_text())
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    write_atomic(path, req.shown().to_json() + "\n", mode=0o600)
    return req


def detached(run_dir: str) -> int:
    """The agent of a detached run: request from, pid and status to files in `run_dir` (see the
    module's doc)."""
    from cpudist.run.life.process import this_process

    folder = Path(run_dir)
    # a background job of sh starts with SIGINT ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    me = this_process()
    write_atomic(folder / PID_FILE, json.dumps({"pid": me.pid, "start": me.start, "host": me.host})
                 + "\n")
    status: dict[str, Any] = {"status": "error", "exit_code": exits.FAILED,
                              "message": "the agent ended without a status"}
    try:
        status = outcome_of(take_request(folder / REQUEST_FILE))
    finally:
        write_atomic(folder / STATUS_FILE, status_line(**status) + "\n")
    return int(status["exit_code"])


def main() -> None:
    if sys.argv[1:2] == ["--detached"]:
        sys.exit(detached(sys.argv[2]))
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    req = RunRequest.from_json(sys.stdin.readline())
    threading.Thread(target=_watch_stdin, daemon=True).start()
    sys.exit(execute(req))


if __name__ == "__main__":
    main()
