"""`cpudist run --launcher <scheduler> --detach`: a batch job runs on by itself, so detaching is
leaving it; run.json's `detached` keeps its kind and job id (and the ledger and record it lands
with) for the commands that come back. The scheduler's side is its kind's (launch/kind.Batch).

    start(request, ledger, cb)          submit as an attached run does; return once the ranks are up
                                        (the first progress event in the job's output), run.json
                                        saying running
    attach(info, cb)                    `cpudist logs -f RUN`: the job's output from its start,
                                        across requeues, to its last end; then the result checked
                                        and recorded as an attached run's
    attach(info, cb, stop_first=True)   `cpudist stop RUN`: SIGTERM to the ranks (not to the batch
                                        script: no requeue), so that they checkpoint and stop as at
                                        a spot notice; the job cancelled after STOP_GRACE_S if they
                                        have not; then landed
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from cpudist import state
from cpudist.errors import Interrupted, JobFailed
from cpudist.launch import kinds, secret_files
from cpudist.launch.kind import Ended, Streams
from cpudist.results.launched import RANK_REPORT, Launched
from cpudist.results.schema import RunResult
from cpudist.run.life import identity, runlog
from cpudist.run.life.identity import RunInfo
from cpudist.run.local import begin
from cpudist.run.outcome import check, record
from cpudist.run.prepare import prepare
from cpudist.run.request import Callbacks, RunRequest
from cpudist.run.start import settle
from cpudist.run.stopped import StopSeen
from cpudist.waits import TimedOut, wait_until
from cpudist.wire import names, stop_marker

# run.json's `detached`: the job, its secrets file until it ended
JOB_KEY, SECRETS_KEY = "job_id", "secrets_file"
# a job may queue a long time; past this the detached start gives up and cancels it
READY_WAIT_S = 600.0
STOP_GRACE_S = 120.0  # the ranks' checkpoint and exit after SIGTERM, before the job is cancelled
POLL_S = 0.5


def is_batch(info: RunInfo) -> bool:
    """Whether a detached run is a batch job (not an agent on a head)."""
    return JOB_KEY in info.detached


def start(request: RunRequest, ledger: Path, cb: Callbacks,
          ready_wait_s: float = READY_WAIT_S) -> None:
    """Submit the job, record it in run.json and return once its ranks are up; the job goes on by
    itself."""
    # refuses a fresh run into another run's checkpoints before run.json is touched
    spec = prepare(request)
    kind = kinds.batch_of(spec.launcher)
    launch = kinds.plan(spec)
    out, launched = begin(spec, request.launched)
    info = identity.begin(request.train, spec.launcher, request.command)
    job_id, left = "", None
    try:
        # the job outlives this command: so does the file, until its end
        left = secret_files.left_for_job(spec)
        job_id = kind.submit(launch, out, cb.on_line)
        identity.write_run(out, dataclasses.replace(info, detached={
            JOB_KEY: job_id, "launcher": spec.launcher, "ledger": str(ledger),
            "launched": launched.to_dict(),
            SECRETS_KEY: left}))
        watch = kind.watch(job_id, out, Streams(cb.on_event, cb.on_line, cb.on_line, cb.on_line))
        ended = wait_until(lambda: watch.poll() or (True if watch.events else None),
                           f"the ranks of {kind.job_name(job_id)} to start", ready_wait_s, POLL_S)
    except BaseException as e:
        if job_id:
            kind.cancel(job_id)
        secret_files.removed(left)
        stopped = isinstance(e, KeyboardInterrupt | Interrupted)
        identity.mark(out, "interrupted" if stopped else "failed",
                      message=getattr(e, "message", None) or str(e) or type(e).__name__)
        job = kind.job_name(job_id) if job_id else "the job (not submitted)"
        if stopped:
            raise Interrupted(f"interrupted before the ranks were up: {job} was cancelled",
                              "Re-run the command") from None
        if isinstance(e, TimedOut):
            raise JobFailed(f"the ranks of {job} did not start within {ready_wait_s:g}s; it was "
                            "cancelled",
                            "The scheduler's queue says why it waited (busy partition, time limit "
                            "too long)"
                            ) from None
        raise
    # it ended before its ranks said anything: land it now, its error is this one's
    if ended is not True:
        secret_files.removed(left)
        early = kind.ended_early(watch)
        settle(out, lambda: _land(out, ledger, launched, early, False, kind.job_name(job_id)))


def _land(out: Path, ledger: Path, launched: Launched, ended: Ended, stopped: bool,
          job: str) -> RunResult:
    """The ended job's result checked and recorded (the same checks as an attached run's,
    run/outcome.py)."""
    if stopped and not (ended.outcome.returncode == 0 and (out / RANK_REPORT).is_file()):
        raise Interrupted(f"stopped ({job})", "Re-run the command to start over")
    check(ended.outcome, out, None, ended.what, ended.verdict)
    return record(out, ledger, dataclasses.replace(launched, job_id=ended.job_id))


def attach(info: RunInfo, cb: Callbacks, stop_first: bool = False,
           timeout_s: float = STOP_GRACE_S) -> RunResult:
    """Follow the detached job to its end and record it: run.json says finished, failed, interrupted
    or preempted. Ctrl-C or a scheduler out of reach ends the following only (run.json still says
    running)."""
    job_id = str(info.detached[JOB_KEY])
    kind = kinds.batch_of(str(info.detached.get("launcher") or info.where))
    out = Path(info.run_dir)
    cb = runlog.tee(cb, out, info.id)
    # the user's stop leaves no marker: its checkpoint is in rank 0's event
    cb = (seen := StopSeen()).wrap(cb)
    if stop_first:
        # the user's stop: rank 0 leaves no preemption marker (a requeue would follow one)
        stop_marker.ask(out)
        kind.signal_ranks(job_id)
    started = time.monotonic()
    with (out / names.RANKS_LOG).open("w") as log:  # every rank line, as an attached run writes it

        def on_line(line: str) -> None:
            log.write(line + "\n")
            log.flush()
            cb.on_line(line)

        ended = kind.follow(job_id, out, Streams(cb.on_event, on_line, on_line, cb.on_line),
                            # past the grace: cancelled
                            max(1.0, timeout_s) if stop_first else None)
    # the batch script's end removes it, but for a SIGKILL
    secret_files.removed(info.detached.get(SECRETS_KEY))
    if stop_first and ended.outcome.timed_out:
        cb.on_line(f"[cpudist] the ranks did not stop within {time.monotonic() - started:.0f}s of "
                   f"SIGTERM: {kind.job_name(job_id)} was cancelled")
    ledger = Path(str(info.detached.get("ledger") or state.ledger_path()))
    launched = Launched.from_dict(info.detached.get("launched") or {"launcher": kind.name})
    landed = dataclasses.replace(ended, outcome=dataclasses.replace(ended.outcome, timed_out=False))
    return settle(out,
                  lambda: _land(out, ledger, launched, landed, stop_first, kind.job_name(job_id)),
                  seen, out / names.CHECKPOINTS)
