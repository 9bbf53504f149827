"""Coming back to a detached run (run/life/detach.py) from any shell on the machine that started it.

    attach(info, cb)   `cpudist logs -f RUN`: the run's cpudist.log so far, then the head's agent
                       log from where that ends (run/life/headlog's mark) until the agent's status
                       file appears, then the run's files and model home and the run recorded, as a
                       remote run's end
    stop(info)         `cpudist stop RUN`: the agent on the head interrupted (its PID and start time
                       checked there), which stops every rank (after a checkpoint when the run
                       checkpoints); then attach, quietly
"""

from __future__ import annotations

import math
from pathlib import Path

from cpudist.errors import BadInput
from cpudist.results.schema import RunResult
from cpudist.run.life import runlog
from cpudist.run.life.detach import Detached, HeadLog, interrupt_agent
from cpudist.run.life.headlog import HEAD_LOG_MARK
from cpudist.run.life.identity import RunInfo
from cpudist.run.remote import conclude, fetch_files
from cpudist.run.request import Callbacks
from cpudist.run.start import settle
from cpudist.train.report_to import RUN_FOLDERS
from cpudist.waits import wait_until
from cpudist.wire import names


def _detached(info: RunInfo) -> Detached:
    if not info.detached:
        raise BadInput(f"run {info.id} was not started with --detach",
                       "`cpudist logs` shows its log")
    return Detached.from_dict(info.detached)


def _held(out: Path) -> list[str]:
    """The lines of the run's cpudist.log as they are now."""
    try:
        return (out / names.LOG).read_text(errors="replace").splitlines()
    except OSError:
        return []


def attach(info: RunInfo, cb: Callbacks, interval_s: float = 1.0, stop_first: bool = False,
           timeout_s: float = math.inf) -> RunResult:
    """Follow the detached run to its end (the agent's status file), bring it home and record it:
    run.json says finished, failed, interrupted or preempted, the ledger has it when it finished.
    With `stop_first`, interrupt the agent before following."""
    from cpudist.run.life import batch_detach

    if batch_detach.is_batch(info):  # a scheduler's batch job, not an agent on a head
        return batch_detach.attach(info, cb, stop_first, min(timeout_s, batch_detach.STOP_GRACE_S))
    d = _detached(info)
    out = Path(info.run_dir)
    shown = cb
    cb = runlog.tee(cb, out, info.id)

    with d.connect() as head:
        log = HeadLog(head, d.run_dir, cb, out / HEAD_LOG_MARK)
        # cpudist.log holds the head's log up to there: show it, then read on (nothing written
        # twice)
        if log.offset:
            for line in _held(out):
                shown.on_line(line)
        if stop_first and not interrupt_agent(head, d):
            cb.note(f"the agent (PID {d.agent_pid}) on {d.host} is gone already: bringing home "
                    "what it left")
        # Ctrl-C while following ends the following only: run.json still says running
        status = wait_until(log.poll, f"the end of run {info.id} on {d.host}", timeout_s,
                            interval_s)

        def land() -> RunResult:
            fetch_files(head, d.run_dir, out, RUN_FOLDERS if d.report_to else ())
            return conclude(head, d.landing(out), status, cb.on_line)

        return settle(out, land)
