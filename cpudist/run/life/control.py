"""A run found by its id or folder, and stopped from another shell (`cpudist logs`, `cpudist stop`).

    find_run("20261126-1015")   an id, a unique prefix of one, or a run folder -> its row
                                (run/life/listing.py)
    stop(info)                  SIGINT to the launching `cpudist run` (only if it is still that
                                process, on this host): the ranks checkpoint when the run
                                checkpoints, run.json says interrupted
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cpudist.errors import BadInput, JobFailed
from cpudist.results.schema import RunResult
from cpudist.run.life.identity import RunInfo, read_run
from cpudist.run.life.listing import RunRow, list_runs, row_of_info
from cpudist.run.life.process import Proc, alive, interrupt, this_host
from cpudist.run.stopped import resume_command
from cpudist.waits import TimedOut, wait_until
from cpudist.wire import stop_marker
from cpudist.wire.stop_marker import Stop

STOP_WAIT_S = 120.0


def find_run(text: str, folders: Sequence[Path], ledger: Sequence[RunResult]) -> RunRow:
    """The run that `text` names: a run folder (with run.json), else an id or a unique prefix of one
    among the runs `cpudist runs` lists."""
    folder = Path(text).expanduser()
    if folder.is_dir() and (info := read_run(folder)) is not None:
        return row_of_info(info, datetime.now(UTC))
    rows = [r for r in list_runs(folders, ledger) if r.id]
    exact = [r for r in rows if r.id == text]
    found = exact or [r for r in rows if r.id.startswith(text)]
    if not found:
        where = ", ".join(str(f) for f in folders)
        raise BadInput(f"no run {text!r} in {where} or the ledger",
                       "`cpudist runs` lists the runs and their ids; or give the run's folder")
    if len({r.id for r in found}) > 1:
        raise BadInput(f"{text!r} names {len(found)} runs ({', '.join(r.id for r in found[:5])})",
                       "Give more of the id")
    row = found[0]
    now = read_run(Path(row.run_dir)) if row.run_dir else None
    if now is not None and now.id != row.id:  # a later run took the folder (--overwrite-output-dir)
        raise BadInput(f"run {row.id}'s folder {row.run_dir} holds run {now.id} now: a later run "
                       "was written over it", f"The ledger keeps {row.id}'s result (`cpudist "
                       f"report --run {row.id}`); `cpudist logs {now.id}` shows the run there now")
    return row


@dataclass(frozen=True)
class Stopped:
    """How a stopped run ended: run.json after the stop, and the preemption marker it left (None:
    none)."""

    info: RunInfo
    checkpoint: Stop | None

    def resume_command(self) -> str:
        """The command that goes on from the stop's checkpoint ('' when it left none): run.json's,
        as recorded."""
        if self.info.resume:
            return self.info.resume
        return resume_command(self.info.command,
                              self.info.run_dir) if self.checkpoint is not None else ""


def stoppable(row: RunRow) -> RunInfo:
    """run.json of a run this shell may stop, or the BadInput that says why not and what to do."""
    info = read_run(Path(row.run_dir)) if row.run_dir else None
    if info is None or info.state != "running":
        state = info.state if info is not None else row.state
        raise BadInput(f"run {row.id} is not running (it is {state})",
                       "Nothing to stop; `cpudist runs` shows every run's state")
    if not info.pid:
        raise BadInput(f"run {row.id}'s run.json names no process (an older cpudist started it)",
                       "Stop it with Ctrl-C in its terminal, or `kill -INT` its `cpudist run` "
                       "process")
    if info.host != this_host():
        raise BadInput(f"run {row.id} was started on {info.host}, not on this machine "
                       f"({this_host()})",
                       f"Run `cpudist stop {row.id}` on {info.host}")
    return info


def stop(row: RunRow, wait_s: float = STOP_WAIT_S, interval_s: float = 1.0) -> Stopped:
    """Interrupt the run's launching process and wait (at most `wait_s`) for run.json to leave
    running."""
    detached = read_run(Path(row.run_dir)) if row.run_dir else None
    if detached is not None and detached.detached and detached.state == "running":
        return _stop_detached(detached, wait_s)
    info = stoppable(row)
    out = Path(info.run_dir)
    proc = Proc(info.pid, info.host, info.pid_start)
    try:
        interrupt(proc)
    except ProcessLookupError:
        raise BadInput(f"run {row.id}'s process {info.pid} is gone (or the PID is another "
                       "process's now): run.json says running, but the run ended without "
                       "recording it; nothing was signalled",
                       f"`cpudist logs {row.id}` shows its last lines; "
                       f"its checkpoints are in {out}") from None

    def ended() -> RunInfo | None:
        # before run.json: a process that recorded its end, then exited, is not lost
        gone = not alive(proc)
        now = read_run(out) or info
        return now if now.state != "running" or gone else None

    try:
        final = wait_until(ended, f"run {row.id} to stop", wait_s, interval_s)
    except TimedOut as e:
        raise TimedOut(f"run {row.id} still says running {wait_s:g}s after the interrupt",
                       f"`cpudist logs -f {row.id}` shows what it does; stop it again, or kill "
                       f"process {info.pid}"
                       ) from e
    if final.state == "running":
        raise JobFailed(f"run {row.id}'s process {info.pid} ended without recording how (run.json "
                        "says running)",
                        f"`cpudist logs {row.id}` shows its last lines; its checkpoints are in "
                        f"{out}")
    return Stopped(final, stop_marker.read(out))


def _stop_detached(info: RunInfo, wait_s: float) -> Stopped:
    """A `run --detach`'s agent interrupted on its head; its end brought home and recorded as `logs
    -f` does."""
    from cpudist.errors import CpudistError
    from cpudist.run.life.attach import attach
    from cpudist.run.request import Callbacks

    out = Path(info.run_dir)
    try:
        attach(info, Callbacks(lambda event: None, lambda line: None), stop_first=True,
               timeout_s=wait_s)
    except CpudistError:
        now = read_run(out)
        if now is None or now.state == "running":
            raise
    return Stopped(read_run(out) or info, stop_marker.read(out))
