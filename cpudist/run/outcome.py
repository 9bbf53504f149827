"""After the ranks: how the job ended (in one line when it failed), and its result recorded."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
from pathlib import Path
from typing import Any

from cpudist.errors import JobFailed, Preempted
from cpudist.hostfile import Host
from cpudist.launch import slurm
from cpudist.launch.plan import RunSpec
from cpudist.launch.runner import Outcome
from cpudist.launch.slurm import JobInfo
from cpudist.results import ledger
from cpudist.results.schema import RunResult
from cpudist.train.preempt import MARKER

_HOST_PATTERNS = (re.compile(r"RUNNING AT (\S+)"), re.compile(r"on node (\S+?)[ ,.]"),
                  re.compile(r"\[([^\]:\s]+):\d+\] error: "))


def failed_host(lines: tuple[str, ...]) -> str | None:
    """The host a launcher blamed for a failure (Hydra: RUNNING AT h; Open MPI: on node h)."""
    for line in lines:
        for pattern in _HOST_PATTERNS:
            m = pattern.search(line)
            if m:
                return m.group(1)
    return None


def check(outcome: Outcome, out: Path, timeout_s: float | None, what: str, slurm_info: JobInfo | None = None) -> None:
    """Raise the one-line error of a job that did not end well: --timeout, Slurm's state, a stop, a failure."""
    if outcome.timed_out:
        raise JobFailed(f"the job ran past --timeout {timeout_s:g}s and was stopped",
                        "Raise --timeout, or lower --max-steps/--epochs")
    stop = json.loads((out / MARKER).read_text()) if (out / MARKER).is_file() else None
    saved = (f"the ranks stopped at step {stop['step']} ({stop['reason']} on {stop['host']}) after saving "
             f"{Path(stop['checkpoint']).name}") if stop else ""
    resume = f"--resume auto --output-dir {out}"
    last = next((line.strip() for line in outcome.last_lines if "] error: " in line), None)  # the trainer's own
    if slurm_info is not None and slurm_info.state not in ("COMPLETED", "UNKNOWN"):
        # Slurm's verdict first (TIMEOUT, NODE_FAIL, ...): the ranks' own stop is a consequence of it.
        message, hint = slurm.failure(slurm_info, str(out / f"slurm-{slurm_info.job_id}.out"), last)
        raise JobFailed(message, f"{hint}. {saved[0].upper()}{saved[1:]}: {resume} goes on" if stop else hint)
    killed = outcome.failed_host is not None and outcome.returncode > 128  # a host's launcher died of a signal
    if outcome.returncode != 0 and stop and not killed:
        raise Preempted(saved, f"Resume: the same command with {resume}")
    if outcome.returncode != 0:
        host = outcome.failed_host or failed_host(outcome.last_lines)
        where = f" on {host}" if host else ""
        signal_name = f", {_signal_name(outcome.returncode - 128)}" if killed else ""
        detail = f": {last}" if last else ""
        hint = "See the rank output above; the first failing rank is named in it"
        raise JobFailed(f"the job failed{where} ({what} exit code {outcome.returncode}{signal_name}){detail}",
                        f"{hint}. {saved[0].upper()}{saved[1:]}: {resume} goes on" if stop else hint)


def _signal_name(number: int) -> str:
    try:
        return f"killed by {signal.Signals(number).name}"
    except ValueError:
        return f"signal {number}"


def record(spec: RunSpec, out: Path, ledger_path: Path, extra: dict[str, Any]) -> RunResult:
    """Read the ranks' result.json, add what only the launcher knows, and append it to the ledger."""
    result_file = out / "result.json"
    if not result_file.is_file():
        raise JobFailed(f"the job ended without writing {result_file}", "See the rank output above")
    result = ledger.read_result(result_file).with_updates(launcher=spec.launcher, **extra)
    result_file.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    ledger.append(ledger_path, result)
    return result


def fetch_from_rank0(out: Path, hosts: tuple[Host, ...], ssh: str) -> None:
    """torchrun's rendezvous may put rank 0 on another host than the head: when the run folder is not shared,
    bring rank 0's result.json and steps.jsonl from the host that has them."""
    if (out / "result.json").is_file():
        return
    for host in hosts[1:]:
        files = {}
        for name in ("result.json", "steps.jsonl"):
            p = subprocess.run([ssh, host.name, f"cat {shlex.quote(str(out.resolve() / name))}"], capture_output=True,
                               timeout=120, stdin=subprocess.DEVNULL)
            if p.returncode == 0:
                files[name] = p.stdout
        if "result.json" in files:
            for name, data in files.items():
                (out / name).write_bytes(data)
            return
