"""The head-node side of a script run started from a laptop: `python -m cpudist.run.script_agent`, job on stdin.

    {"train": ..., "launch": ..., "hostfile": ..., "script": {"command": [...], "workdir": ..., ...}}

As run/agent.py for the trainer (the same stdin watch: end of stdin, `stop` or a silent laptop stops every rank;
so do SIGTERM and SIGHUP; the same status line last), with run/script.py's ranks: started from this head on the
hostfile's nodes, result.json, --collect and the metric file in the head's run folder for the laptop to fetch.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

from cpudist.errors import CpudistError
from cpudist.run import agent
from cpudist.run.request import Callbacks, RunRequest
from cpudist.run.script import Script
from cpudist.wire import events, exits


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def outcome_of(request: RunRequest, script: Script) -> dict[str, Any]:
    """The run's status (the fields of the agent's status line)."""
    from cpudist.launch.kinds import plan
    from cpudist.run.script import run_ranks, script_spec

    try:
        spec = script_spec(request, script)
        cb = Callbacks(lambda e: _say(events.relay(e)), _say, _say)
        launched = run_ranks(request, script, (spec, plan(spec)), cb)
    except CpudistError as e:
        return {"status": "error", "exit_code": e.exit_code, "message": e.message}
    except KeyboardInterrupt:
        return {"status": "error", "exit_code": exits.FAILED, "message": "interrupted before the ranks started"}
    return {"status": "ok", "exit_code": exits.OK, "output_dir": request.train.output_dir,
            "launched": launched.to_dict()}


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    from cpudist.run.script_remote import ScriptJob

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    request, script = ScriptJob.parse(sys.stdin.readline())
    # the trainer agent's watch of the laptop (private there: only the two agents use it)
    threading.Thread(target=agent._watch_stdin, daemon=True).start()
    status = outcome_of(request, script)
    _say(agent.status_line(**status))
    sys.exit(int(status["exit_code"]))


if __name__ == "__main__":
    main()
