"""`cpudist run --launcher slurm --detach`: a batch job runs on by itself, so detaching is leaving it; run.json's
`detached` keeps its job id (and the ledger and record it lands with) for the commands that come back to it.

    start(request, ledger, cb)          submit as an attached run does; return once the ranks are up (the first
                                        progress event in the job's output), run.json saying running
    attach(info, cb)                    `cpudist logs -f RUN`: the job's output from its start, across requeues, to
                                        its last end; then the result checked and recorded as an attached run's
    attach(info, cb, stop_first=True)   `cpudist stop RUN`: SIGTERM to the ranks (`scancel --signal=TERM`, which
                                        spares the batch script: no requeue), so that they checkpoint and stop as at
                                        a spot notice; `scancel` after STOP_GRACE_S if they have not; then landed
"""

from __future__ import annotations

import dataclasses
import subprocess
import time
from pathlib import Path

from cpudist import state
from cpudist.errors import Interrupted, JobFailed
from cpudist.launch import kinds, secret_files
from cpudist.launch.runner import Outcome
from cpudist.launch.slurm import JobInfo
from cpudist.launch.slurm_job import OUTPUT_POLL_S, Follower, SlurmOutcome, cancel, follow, submit
from cpudist.launch.slurm_query import job_info
from cpudist.launch.spec import redacted
from cpudist.results.launched import RANK_REPORT, Launched, write_card_part
from cpudist.results.schema import RunResult
from cpudist.run import identity, runlog
from cpudist.run.identity import RunInfo
from cpudist.run.outcome import check, record
from cpudist.run.prepare import prepare
from cpudist.run.request import Callbacks, RunRequest
from cpudist.run.start import settle
from cpudist.run.stopped import StopSeen
from cpudist.waits import TimedOut, wait_until
from cpudist.wire import names, stop_marker

SECRETS_KEY = "secrets_file"  # run.json's `detached`: the job's secrets file on this machine, until it ended
READY_WAIT_S = 600.0  # a job may queue a long time; past this the detached start gives up and cancels it
STOP_GRACE_S = 120.0  # the ranks' checkpoint and exit after SIGTERM, before scancel


def start(request: RunRequest, ledger: Path, cb: Callbacks, ready_wait_s: float = READY_WAIT_S) -> None:
    """Submit the job, record it in run.json and return once its ranks are up; the job goes on by itself."""
    spec = prepare(request)  # refuses a fresh run into another run's checkpoints before run.json is touched
    launch = kinds.plan(spec)
    out = Path(request.train.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    state.write_private(out / names.COMMAND, kinds.plan(redacted(spec)).shell() + "\n")
    stop_marker.clear(out)
    launched = dataclasses.replace(request.launched, launcher=spec.launcher)
    write_card_part(out, launched)
    info = identity.begin(request.train, "slurm", request.command)
    job_id, left = "", None
    try:
        left = secret_files.left_for_job(spec)  # the job outlives this command: so does the file, until its end
        job_id = submit(launch, out, cb.on_line)
        identity.write_run(out, dataclasses.replace(info, detached={
            "slurm_job_id": job_id, "ledger": str(ledger), "launched": launched.to_dict(), SECRETS_KEY: left}))
        follower = Follower(job_id, out / f"slurm-{job_id}.out", cb.on_event, cb.on_line, cb.on_line)
        ended = wait_until(lambda: follower.poll() or (True if follower.events else None),
                           f"the ranks of Slurm job {job_id} to start", ready_wait_s, OUTPUT_POLL_S)
    except BaseException as e:
        if job_id:
            cancel(job_id)
        secret_files.removed(left)
        stopped = isinstance(e, KeyboardInterrupt | Interrupted)
        identity.mark(out, "interrupted" if stopped else "failed",
                      message=getattr(e, "message", None) or str(e) or type(e).__name__)
        if stopped:
            raise Interrupted(f"interrupted before the ranks were up: Slurm job {job_id or '(none)'} was cancelled",
                              "Re-run the command") from None
        if isinstance(e, TimedOut):
            raise JobFailed(f"the ranks of Slurm job {job_id} did not start within {ready_wait_s:g}s; it was "
                            "cancelled", "`squeue`/`sinfo` say why it waited (busy partition, --time too long)"
                            ) from None
        raise
    if isinstance(ended, JobInfo):  # it ended before its ranks said anything: land it now, its error is this one's
        last = tuple(follower.last)
        secret_files.removed(left)
        settle(out, lambda: _land(out, ledger, launched, SlurmOutcome(ended, False, last), False))


def _land(out: Path, ledger: Path, launched: Launched, followed: SlurmOutcome, stopped: bool) -> RunResult:
    """The ended job's result checked and recorded (the same checks as an attached run's, run/outcome.py)."""
    job_id = followed.info.job_id
    if stopped and not (followed.info.state == "COMPLETED" and (out / RANK_REPORT).is_file()):
        raise Interrupted(f"stopped (Slurm job {job_id})", "Re-run the command to start over")
    code = 0 if followed.info.state == "COMPLETED" else 1
    check(Outcome(code, followed.timed_out, followed.last_lines), out, None, "launcher", followed.info)
    return record(out, ledger, dataclasses.replace(launched, slurm_job_id=job_id))


def signal_ranks(job_id: str) -> None:
    """SIGTERM to the job's steps (its ranks), not to the batch script: they checkpoint and stop. A pending job
    (queued, or requeued and held) has no ranks to save anything: it is cancelled at once."""
    info = job_info(job_id)
    pending = info is not None and info.state == "PENDING"
    argv = ["scancel", job_id] if pending else ["scancel", "--signal=TERM", job_id]
    subprocess.run(argv, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)


def attach(info: RunInfo, cb: Callbacks, stop_first: bool = False, timeout_s: float = STOP_GRACE_S) -> RunResult:
    """Follow the detached job to its end and record it: run.json says finished, failed, interrupted or preempted.
    Ctrl-C or a slurmctld out of reach ends the following only (run.json still says running)."""
    job_id = str(info.detached["slurm_job_id"])
    out = Path(info.run_dir)
    cb = runlog.tee(cb, out, info.id)
    cb = (seen := StopSeen()).wrap(cb)  # the user's stop leaves no marker: its checkpoint is in rank 0's event
    if stop_first:
        stop_marker.ask(out)  # the user's stop: rank 0 leaves no preemption marker (Slurm would requeue on one)
        signal_ranks(job_id)
    started = time.monotonic()
    with (out / names.RANKS_LOG).open("w") as log:  # every rank line, as an attached run writes it

        def on_line(line: str) -> None:
            log.write(line + "\n")
            log.flush()
            cb.on_line(line)

        followed = follow(job_id, out / f"slurm-{job_id}.out", cb.on_event, on_line, cb.on_line,
                          max(1.0, timeout_s) if stop_first else None)  # past the grace: scancel
    secret_files.removed(info.detached.get(SECRETS_KEY))  # the batch script's end removes it, but for a SIGKILL
    if stop_first and followed.timed_out:
        cb.on_line(f"[cpudist] the ranks did not stop within {time.monotonic() - started:.0f}s of SIGTERM: "
                   f"Slurm job {job_id} was cancelled")
    ledger = Path(str(info.detached.get("ledger") or state.ledger_path()))
    launched = Launched.from_dict(info.detached.get("launched") or {"launcher": "slurm"})
    return settle(out, lambda: _land(out, ledger, launched, dataclasses.replace(followed, timed_out=False),
                                     stop_first), seen, out / names.CHECKPOINTS)
