"""What Slurm says of a job, asked so that a busy or restarting slurmctld does not end a run's follow.

    job_info(id)     `scontrol show job -o` (slurmctld's memory): the live state; None once slurmctld forgot the job
    accounted(id)    `sacct` (slurmdbd's record): the ended job's state, kept after slurmctld forgets it
                     (MinJobAge); None where the site runs no accounting ("accounting storage is disabled")
    final_info(...)  how an ended job ended: sacct's record when accounting is there and has the end, else
                     scontrol's, else UNKNOWN

A failed or timed-out call is retried (the one wait helper, cpudist/waits.py) for SLURMCTLD_WAIT_S; only then is
it one JobFailed line that names slurmctld and says the job itself may still be running.
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
NO_ACCOUNTING = ("accounting storage is disabled", "AccountingStorageType")
SACCT_FIELDS = "JobID,State,ExitCode,NodeList,Elapsed,Timelimit,Reason"


class _Asked:
    """One Slurm command, retried until it answers; what it said when it failed, for the final error."""

    def __init__(self, argv: list[str], settled: tuple[str, ...]) -> None:
        self.argv, self.settled, self.last = argv, settled, ""

    def once(self) -> tuple[int, str, str] | None:
        """(code, stdout, stderr) of a call that answered (or failed in one of the `settled` ways); None: retry."""
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
        self.last = (p.stderr.strip() or p.stdout.strip() or f"exit code {p.returncode}").splitlines()[-1]
        return None

    def answer(self, job_id: str, patience_s: float) -> tuple[int, str, str]:
        try:
            return wait_until(self.once, f"`{' '.join(self.argv[:2])}`", patience_s, RETRY_S)
        except TimedOut:
            raise JobFailed(f"slurmctld did not answer `{' '.join(self.argv[:3])} {job_id}` for {patience_s:g}s "
                            f"({self.last}); Slurm job {job_id} itself may still be running",
                            f"`squeue -j {job_id}` says whether it runs; `cpudist logs -f RUN` follows it again once "
                            f"Slurm answers, `scancel {job_id}` stops it") from None


def job_info(job_id: str, patience_s: float = SLURMCTLD_WAIT_S) -> JobInfo | None:
    """The job as slurmctld knows it now; None once it forgot the job (MinJobAge after its end)."""
    code, out, _ = _Asked(["scontrol", "show", "job", "-o", job_id], FORGOTTEN).answer(job_id, patience_s)
    return parse_job(out) if code == 0 else None


def parse_sacct(text: str) -> JobInfo | None:
    """The job in `sacct -X -n -P -o SACCT_FIELDS` output (its last line: the newest start of a requeued job)."""
    rows = [line.split("|") for line in text.splitlines() if line.count("|") == SACCT_FIELDS.count(",")]
    if not rows:
        return None
    job_id, job_state, exit_code, nodes, elapsed, limit, reason = rows[-1]
    # "CANCELLED by 0": the state is its first word
    return JobInfo(job_id, job_state.split()[0] if job_state else "UNKNOWN", reason, exit_code, nodes, elapsed,
                   limit)


def accounted(job_id: str, patience_s: float = SLURMCTLD_WAIT_S) -> JobInfo | None:
    """The job as the accounting database recorded it; None where there is no accounting (or no record yet)."""
    code, out, _ = _Asked(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", SACCT_FIELDS],
                          NO_ACCOUNTING).answer(job_id, patience_s)
    return parse_sacct(out) if code == 0 else None


def final_info(job_id: str, live: JobInfo | None) -> JobInfo:
    """How an ended job ended. sacct first when the site has accounting (it keeps ended jobs for good, where
    slurmctld forgets them after MinJobAge); scontrol's last word otherwise, or while sacct has not got the end yet
    (slurmdbd hears of it after slurmctld)."""
    try:
        record = accounted(job_id)
    except JobFailed:
        record = None  # the database is out of reach: slurmctld's word is the next best
    if record is not None and record.state in TERMINAL:
        return record
    if live is not None:
        return live
    return JobInfo(job_id, "UNKNOWN", "no longer known to slurmctld, and no accounting record")
