"""After the ranks: how the job ended (in one line when it failed), and its result recorded."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
from pathlib import Path
from typing import Any

from cpudist import state
from cpudist.config import TrainConfig
from cpudist.errors import JobFailed, Preempted
from cpudist.hostfile import Host
from cpudist.launch.runner import FAILED_GRACE_S, Outcome, failed_host, rank_error
from cpudist.results import ledger
from cpudist.results.launched import RANK_REPORT, Launched, read_report
from cpudist.results.schema import RunResult
from cpudist.wire import names, stop_marker
from cpudist.wire.stop_marker import Stop


def keep_stop(out: Path, event: dict[str, Any]) -> None:
    """The stop marker from rank 0's `preempted` event, where rank 0 wrote none (it ran on another
    host, as torchrun's rendezvous may place it): the stop is read where the outcome is decided, not
    taken for a failure."""
    if not stop_marker.exists(out):
        stop_marker.write(out, Stop.from_dict(event))


def check(outcome: Outcome, out: Path, timeout_s: float | None, what: str,
          verdict: tuple[str, str] | None = None) -> None:
    """Raise the one-line error of a job that did not end well: --timeout, a scheduler's verdict
    (launch/kind.Ended), a stop, a failure."""
    if outcome.timed_out:
        raise JobFailed(f"the job ran past --timeout {timeout_s:g}s and was stopped",
                        "Raise --timeout, or lower --max-steps/--epochs")
    stop = stop_marker.read(out)
    saved = stop.said() if stop else ""
    resume = f"--resume auto --output-dir {out}"
    host = outcome.failed_host or failed_host(outcome.last_lines)
    last = rank_error(outcome.last_lines, host)  # the trainer's own line
    # the scheduler's first (a time limit, a node's failure): the ranks' stop follows it
    if verdict is not None:
        message, hint = verdict
        raise JobFailed(message, f"{hint}. {saved[0].upper()}{saved[1:]}: {resume} goes on" if stop
                        else hint)
    # A host's launcher died of a signal (128 + its number); 255 is ssh's own code for a connection
    # that failed.
    killed = outcome.failed_host is not None and 128 < outcome.returncode < 128 + signal.NSIG
    if outcome.returncode != 0 and stop and not killed:
        raise Preempted(saved, f"Resume: the same command with {resume}")
    if outcome.returncode != 0:
        # Given up on: the rank that lost its peer is not where it began (the silent one said
        # nothing), so no host is named but in the rank's own line.
        where = f" on {host}" if host and not outcome.gave_up else ""
        signal_name = (f", {_signal_name(outcome.returncode - 128)}" if killed
                       else ", ssh lost the host" if outcome.failed_host
                       and outcome.returncode == SSH_FAILED else "")
        ended = (f"{what} stopped {FAILED_GRACE_S:g} s after a rank lost its peer"
                 if outcome.gave_up
                 else f"{what} exit code {outcome.returncode}{signal_name}")
        detail = f": {last}" if last else ""
        hint = (TEARDOWN_HINT if any(TEARDOWN_ABORT in line for line in outcome.last_lines)
                else "See the rank output above; the first failing rank is named in it")
        raise JobFailed(f"the job failed{where} ({ended}){detail}",
                        f"{hint}. {saved[0].upper()}{saved[1:]}: {resume} goes on" if stop
                        else hint)


SSH_FAILED = 255  # ssh's exit code when the connection itself failed (not the remote command's)
# What a rank prints when torch's gloo threads abort it in the interpreter's finalization, after its
# script's work (a script that ended without destroy_process_group, or one whose peer still closed
# its side): the work may be done, yet the launcher reports a failed job. cpudist's trainer leaves
# by train.dist.exit_rank, which skips that.
TEARDOWN_ABORT = "terminate called without an active exception"
TEARDOWN_HINT = ("A rank aborted as torch tore down its gloo threads at exit, likely after its "
                 "work: end the script with dist.barrier(), dist.destroy_process_group() and then "
                 "os._exit(0) after flushing its output")


def _signal_name(number: int) -> str:
    try:
        return f"killed by {signal.Signals(number).name}"
    except ValueError:
        return f"signal {number}"


def given_data(cfg: TrainConfig) -> dict[str, str]:
    """The record's `data` paths as the user gave them: the ranks name the copies they read (a
    head's stage folder), and the card should name the user's own."""
    paths = {"dir": cfg.data_dir, "train": cfg.train_file, "validation": cfg.validation_file}
    return {k: v for k, v in paths.items() if v}


def record(out: Path, ledger_path: Path | None, launched: Launched) -> RunResult:
    """The one writer of a finished run's result.json: rank 0's report with what only the launching
    side knows, written once (atomically) and appended to the ledger (none on a head that runs for a
    laptop)."""
    report = read_report(out)
    if report is None:
        raise JobFailed(f"the job ended without writing {out / RANK_REPORT}",
                        "See the rank output above")
    result = launched.apply(report)
    state.write_atomic(out / names.RESULT, json.dumps(result.to_dict(), indent=2) + "\n")
    if ledger_path is not None:
        ledger.append(ledger_path, result)
    return result


def fetch_from_rank0(out: Path, hosts: tuple[Host, ...], ssh: str) -> None:
    """torchrun's rendezvous may put rank 0 on another host than the head: when the run folder is
    not shared, bring rank 0's report and steps.jsonl from the host that has them, and its model and
    --report-to folders (run/fetch_model.from_host)."""
    from cpudist.run.fetch_model import from_host

    if (out / RANK_REPORT).is_file():
        return
    for host in hosts[1:]:
        files = {}
        for name in (RANK_REPORT, names.STEPS):
            p = subprocess.run([ssh, host.name, f"cat {shlex.quote(str(out.resolve() / name))}"],
                               capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
            if p.returncode == 0:
                files[name] = p.stdout
        if RANK_REPORT in files:
            for name, data in files.items():
                (out / name).write_bytes(data)
            from_host(ssh, host.name, out)
            return
