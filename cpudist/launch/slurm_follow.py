"""Submitting a Slurm job and following it to its end.

The commands (`sbatch`, `scontrol`, `scancel`) run where cpudist runs: a login node, or inside an
allocation. The job's state comes from `scontrol show job -o` while it runs and from `sacct` once it
ended where the site has accounting (launch/slurm_query.py: both retried through a busy slurmctld),
its output from the file the script names (`slurm-<job>.out` in the run folder), read as it grows.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cpudist import state
from cpudist.errors import CpudistError, Interrupted, JobFailed
from cpudist.interrupts import shielded
from cpudist.launch.slurm import JobInfo
from cpudist.launch.slurm_query import final_info, job_info
from cpudist.launch.spec import SBATCH_FILE, Launch
from cpudist.waits import TimedOut, wait_until
from cpudist.wire import events

POLL_S = 2.0  # between `scontrol show job` calls (the output file is read every OUTPUT_POLL_S)
OUTPUT_POLL_S = 0.5
CANCEL_WAIT_S = 60.0  # after scancel: the ranks get SIGTERM, then SIGKILL after Slurm's KillWait


def slurm_command(argv: list[str], timeout_s: float = 60) -> str:
    """A Slurm command's stdout; its failure is a JobFailed that quotes Slurm's own words."""
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise JobFailed(f"`{' '.join(argv[:3])}` did not run: {e}",
                        "Check that Slurm's commands work here (`sinfo`)") from None
    if p.returncode != 0:
        raise JobFailed(f"`{' '.join(argv[:3])}` failed: {p.stderr.strip() or p.stdout.strip()}",
                        "Check the Slurm options (--partition, --time, --account, --sbatch-arg) "
                        "and `sinfo`")
    return p.stdout


class _Tail:
    """The lines appended to a file since the last read (the job's output, as slurmstepd writes
    it)."""

    def __init__(self, path: Path) -> None:
        self.path, self.pos, self.partial = path, 0, ""

    def lines(self, final: bool = False) -> list[str]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.pos)
                data = f.read()
        except FileNotFoundError:
            data = b""
        self.pos += len(data)
        *complete, self.partial = (self.partial + data.decode(errors="replace")).split("\n")
        if final and self.partial:
            complete, self.partial = [*complete, self.partial], ""
        return complete


@dataclass(frozen=True)
class SlurmOutcome:
    """How a submitted job ended, and its last lines of output."""

    info: JobInfo
    timed_out: bool  # cpudist's --timeout cancelled it
    last_lines: tuple[str, ...]


class Follower:
    """A job's output and state changes passed on, one poll at a time, until it ends. Its output
    file is read from the start (`cpudist logs -f` after a detached start shows it all); a requeued
    job appends to it (--open-mode=append), so the follow goes on across restarts until the job's
    last end."""

    def __init__(self, job_id: str, output: Path, on_event: Callable[[dict[str, Any]], None],
                 on_line: Callable[[str], None], say: Callable[[str], None]) -> None:
        self.job_id, self.on_event, self.on_line, self.say = job_id, on_event, on_line, say
        self.tail, self.seen, self.last = _Tail(output), ("", ""), list[str]()
        self.next_poll, self.events = 0.0, 0
        self.info: JobInfo | None = None

    def _state(self) -> JobInfo | None:
        """slurmctld's word every POLL_S (None in between); how the job ended once it ended
        (slurm_query)."""
        if time.monotonic() < self.next_poll:
            return None
        self.next_poll = time.monotonic() + POLL_S
        live = job_info(self.job_id)
        info = live if live is not None and not live.ended else final_info(self.job_id, live)
        if (info.state, info.reason) != self.seen:
            self.seen = (info.state, info.reason)
            where = f" on {info.nodes}" if info.state == "RUNNING" else ""
            why = f" ({info.reason})" if info.reason not in ("", "None") else ""
            self.say(f"[cpudist] Slurm job {self.job_id}: {info.state}{where}{why}")
        return info

    def poll(self) -> JobInfo | None:
        """Pass on the new output; the job's final record once it ended, else None."""
        info = self._state()
        done = info is not None and (info.ended or info.state == "UNKNOWN")
        for line in self.tail.lines(final=done):
            event = events.parse(line)
            if event is not None:
                self.events += 1
                self.on_event(event)
            else:
                self.last = [*self.last, line][-20:]
                self.on_line(line)
        self.info = info or self.info
        return info if done else None


def follow(job_id: str, output: Path, on_event: Callable[[dict[str, Any]], None],
           on_line: Callable[[str], None],
           say: Callable[[str], None], timeout_s: float | None = None,
           follower: Follower | None = None) -> SlurmOutcome:
    """Stream the job's output and state changes until it ends; past `timeout_s`, cancel it."""
    follower = follower or Follower(job_id, output, on_event, on_line, say)
    deadline = time.monotonic() + timeout_s if timeout_s else None
    timed_out = False
    while True:
        info = follower.poll()
        if info is not None:
            return SlurmOutcome(info, timed_out, tuple(follower.last))
        if deadline is not None and time.monotonic() > deadline and not timed_out:
            timed_out = True
            slurm_command(["scancel", job_id])
        time.sleep(OUTPUT_POLL_S)


def submit(launch: Launch, out: Path, say: Callable[[str], None]) -> str:
    """Write the batch script into the run folder and submit it; the job's id."""
    assert launch.script is not None
    script = out / SBATCH_FILE
    # it exports the --env values (tokens): the user's eyes only
    state.write_private(script, launch.script)
    # --parsable: "id" or "id;cluster"
    job_id = slurm_command(list(launch.argv)).strip().split(";")[0]
    say(f"[cpudist] submitted Slurm job {job_id} ({script}); output: {out / f'slurm-{job_id}.out'}")
    return job_id


def cancel(job_id: str) -> None:
    """scancel the job and wait (at most CANCEL_WAIT_S) for its end; a second Ctrl-C meanwhile is
    held back."""
    with shielded(lambda: None):  # a second Ctrl-C must not leave the job running
        subprocess.run(["scancel", job_id], capture_output=True, timeout=60,
                       stdin=subprocess.DEVNULL)
        # the caller's error says it was cancelled either way
        with contextlib.suppress(TimedOut, JobFailed):
            wait_until(lambda: (job_info(job_id)
                                or JobInfo(job_id=job_id, state="COMPLETED")).ended or None,
                       f"Slurm job {job_id} to end", CANCEL_WAIT_S, OUTPUT_POLL_S)


def submit_and_follow(launch: Launch, out: Path, on_event: Callable[[dict[str, Any]], None],
                      on_line: Callable[[str], None], say: Callable[[str], None],
                      timeout_s: float | None = None,
                      on_stop: Callable[[], None] | None = None) -> SlurmOutcome:
    """Write the batch script into the run folder, submit it, follow it to its end; Ctrl-C cancels
    it (after `on_stop`, the user's stop said to the ranks, which then leave no preemption
    marker)."""
    job_id = submit(launch, out, say)
    output = out / f"slurm-{job_id}.out"
    follower = Follower(job_id, output, on_event, on_line, say)
    try:
        return follow(job_id, output, on_event, on_line, say, timeout_s, follower)
    except KeyboardInterrupt:
        if on_stop is not None:
            on_stop()
        cancel(job_id)
        # the ranks' last lines: their stop event
        with shielded(lambda: None), contextlib.suppress(CpudistError):
            follower.next_poll = 0.0
            follower.poll()
        raise Interrupted(f"interrupted: Slurm job {job_id} was cancelled (scancel)",
                          "Re-run the command to start over") from None
