"""What Slurm says of a job, asked so that a busy or restarting slurmctld does not end a run's
follow.

    job_info(id)     `scontrol show job -o` (slurmctld's memory): the live state; None once
                     slurmctld forgot the job
    accounted(id)    `sacct` (slurmdbd's record): the ended job's state, kept after slurmctld
                     forgets it (MinJobAge); Unanswered where sacct errs (no accounting, its
                     database out of reach)
    final_info(...)  how an ended job ended: sacct's record when accounting is there and has the
                     end, else scontrol's, else UNKNOWN

A failed or timed-out scontrol call is retried (the one wait helper, cpudist/waits.py) for
SLURMCTLD_WAIT_S; only then is it one JobFailed line that names slurmctld and says the job itself
may still be running. A failed sacct call is not retried: the job's end is known without it. Only a
record sacct has not got yet is asked for again, for ACCOUNTING_LAG_S, when slurmctld no longer
knows the job either.
"""

from __future__ import annotations

import subprocess

from cpudist.errors import JobFailed
from cpudist.launch.slurm import TERMINAL, JobInfo, parse_job
from cpudist.waits import TimedOut, wait_until

SLURMCTLD_WAIT_S = 30.0  # a slurmctld that answers no call for this long is lost
CALL_TIMEOUT_S = 10.0  # one call; Slurm's own MessageTimeout is 10 s
RETRY_S = 2.0
FORGOTTEN = ("Invalid job id specified",)  # scontrol's words for a job slurmctld no longer knows
# slurmdbd hears of a job's end after slurmctld: how long its record may lag
ACCOUNTING_LAG_S = 30.0
SACCT_FIELDS = "JobID,State,ExitCode,NodeList,Elapsed,Timelimit,Reason"


class _Asked:
    """One Slurm command, retried until it answers; what it said when it failed, for the final
    error."""

    def __init__(self, argv: list[str], settled: tuple[str, ...]) -> None:
        self.argv, self.settled, self.last = argv, settled, ""

    def once(self) -> tuple[int, str, str] | None:
        """(code, stdout, stderr) of a call that answered (or failed in one of the `settled` ways);
        None: retry."""
        try:
            p = subprocess.run(self.argv, capture_output=True, text=True, timeout=CALL_TIMEOUT_S,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            self.last = f"no answer within {CALL_TIMEOUT_S:g}s"
            return None
        except OSError as e:  # not installed: no retry mends that
            raise JobFailed(f"`{' '.join(self.argv[:3])}` did not run: {e}",
                            "Check that Slurm's commands work here (`sinfo`)") from None
        if p.returncode == 0 or any(w in p.stderr for w in self.settled):
            return p.returncode, p.stdout, p.stderr
        self.last = (p.stderr.strip() or p.stdout.strip()
                     or f"exit code {p.returncode}").splitlines()[-1]
        return None

    def answer(self, job_id: str, patience_s: float) -> tuple[int, str, str]:
        try:
            return wait_until(self.once, f"`{' '.join(self.argv[:2])}`", patience_s, RETRY_S)
        except TimedOut:
            raise JobFailed(f"slurmctld did not answer `{' '.join(self.argv[:3])} {job_id}` for "
                            f"{patience_s:g}s "
                            f"({self.last}); Slurm job {job_id} itself may still be running",
                            f"`squeue -j {job_id}` says whether it runs; `cpudist logs -f RUN` "
                            "follows it again once "
                            f"Slurm answers, `scancel {job_id}` stops it") from None


def job_info(job_id: str, patience_s: float = SLURMCTLD_WAIT_S) -> JobInfo | None:
    """The job as slurmctld knows it now; None once it forgot the job (MinJobAge after its end)."""
    asked = _Asked(["scontrol", "show", "job", "-o", job_id], FORGOTTEN)
    code, out, _ = asked.answer(job_id, patience_s)
    return parse_job(out) if code == 0 else None


def parse_sacct(text: str) -> JobInfo | None:
    """The job in `sacct -X -n -P -o SACCT_FIELDS` output (its last line: the newest start of a
    requeued job)."""
    rows = [line.split("|") for line in text.splitlines()
            if line.count("|") == SACCT_FIELDS.count(",")]
    if not rows:
        return None
    job_id, job_state, exit_code, nodes, elapsed, limit, reason = rows[-1]
    # "CANCELLED by 0": the state is its first word
    return JobInfo(job_id=job_id, state=job_state.split()[0] if job_state else "UNKNOWN",
                   reason=reason, exit_code=exit_code,
                   nodes=nodes, run_time=elapsed, time_limit=limit)


class Unanswered:
    """sacct erred ("accounting storage is disabled", a database out of reach, no answer in
    time)."""


UNANSWERED = Unanswered()


def accounted(job_id: str) -> JobInfo | Unanswered | None:
    """The job as the accounting database recorded it; None when it has no record of it (yet);
    UNANSWERED when sacct erred, which asking again at once would not mend."""
    try:
        p = subprocess.run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", SACCT_FIELDS],
                           capture_output=True,
                           text=True, timeout=CALL_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return UNANSWERED
    return parse_sacct(p.stdout) if p.returncode == 0 else UNANSWERED


def final_info(job_id: str, live: JobInfo | None, lag_s: float = ACCOUNTING_LAG_S) -> JobInfo:
    """How an ended job ended. sacct first when the site has accounting (it keeps ended jobs for
    good, where slurmctld forgets them after MinJobAge); scontrol's last word when sacct errs or has
    not got the end yet (slurmdbd hears of it after slurmctld); without that word, sacct's record is
    waited for, at most `lag_s`."""
    known = live or JobInfo(job_id=job_id, state="UNKNOWN",
                            reason="no longer known to slurmctld, and no accounting record")

    def settled() -> JobInfo | None:
        record = accounted(job_id)
        if isinstance(record, JobInfo) and record.state in TERMINAL:
            return record
        return known if live is not None or isinstance(record, Unanswered) else None

    try:
        return wait_until(settled, f"sacct's record of Slurm job {job_id}", lag_s, RETRY_S)
    except TimedOut:
        return known
