"""Slurm as a launcher, as pure data: the sbatch script, the srun line, and what `scontrol` says of
a job.

    # prints the script
    cpudist run mrpc --launcher slurm --nodes 2 --ppn 1 --time 00:30:00 --dry-run

Outside an allocation cpudist writes the script into the run folder and submits it
(launch/slurm_job.py follows it); inside one (`salloc`, or a batch script of yours: SLURM_JOB_ID is
set) it runs `srun` directly. Either way every rank gets the mpirun path's environment
(launch/env.py: node_env), rank 0 runs on the first node of the allocation, and ranks find their
rank in SLURM_PROCID/SLURM_NTASKS.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from cpudist.launch.batch import BatchOptions
from cpudist.secrets import SECRETS_ENV, remove_command
from cpudist.slurm_counts import expand_counts as expand_counts  # parsed where the ranks read it
from cpudist.wire import stop_marker

# the batch script's own variable: 1 once it asked Slurm to requeue the job
REQUEUED_VAR = "requeued"
# States after which a job runs no more (man squeue, JOB STATE CODES).
TERMINAL = frozenset({"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
                      "OUT_OF_MEMORY", "PREEMPTED", "REVOKED", "SPECIAL_EXIT", "TIMEOUT"})
HINTS = {
    "TIMEOUT": "Raise --time (Slurm counts whole minutes), or lower --max-steps/--epochs; with "
               "--checkpoint-every, `--resume auto --output-dir RUN` goes on from the last "
               "checkpoint",
    "NODE_FAIL": "A node of the job failed: `sinfo -R` says why. Re-run (with checkpoints: "
                 "--resume auto)",
    "CANCELLED": "Something cancelled the job (scancel, an administrator, a reservation's end): "
                 "re-run it",
    "OUT_OF_MEMORY": "Ask for more memory (--sbatch-arg=--mem=0 takes a node's all) or lower "
                     "--batch-size",
    "PREEMPTED": "A higher-priority job took the nodes: re-run (with checkpoints: --resume auto)",
}


@dataclass(frozen=True)
class Allocation:
    """The Slurm allocation this process runs in (salloc, sbatch): its job, nodes and CPUs per
    node."""

    job_id: str
    nodes: tuple[str, ...]
    cpus_per_node: int


@dataclass(kw_only=True, frozen=True)
class JobInfo:
    """One job as `scontrol show job -o` describes it."""

    job_id: str
    state: str
    reason: str = ""
    exit_code: str = ""  # "code:signal"
    nodes: str = ""
    run_time: str = ""
    time_limit: str = ""

    @property
    def ended(self) -> bool:
        return self.state in TERMINAL


def parse_job(text: str) -> JobInfo | None:
    """The JobInfo in `scontrol show job -o ID` output; None when Slurm no longer knows the job."""
    fields = dict(re.findall(r"(?:^|\s)(\w+)=(\S*)", text))
    if "JobId" not in fields or "JobState" not in fields:
        return None
    return JobInfo(job_id=fields["JobId"], state=fields["JobState"],
                   reason=fields.get("Reason", ""),
                   exit_code=fields.get("ExitCode", ""), nodes=fields.get("NodeList", ""),
                   run_time=fields.get("RunTime", ""), time_limit=fields.get("TimeLimit", ""))


def failure(info: JobInfo, output: str, detail: str | None) -> tuple[str, str]:
    """(message, hint) for a job that ended other than COMPLETED: its state first, on one line."""
    code = f", exit code {info.exit_code}" if info.exit_code and info.exit_code != "0:0" else ""
    limit = f", time limit {info.time_limit}" if info.state == "TIMEOUT" and info.time_limit else ""
    nodes = f" on {info.nodes}" if info.nodes and info.nodes != "(null)" else ""
    message = (f"Slurm job {info.job_id} ended {info.state}{nodes} after "
               f"{info.run_time or '?'}{limit}{code}"
               + (f": {detail}" if detail else ""))
    return message, HINTS.get(info.state, f"See the rank output above and {output}")


def srun_argv(np: int, ppn: int, command: list[str], cpus_per_task: int | None,
              label: bool = True) -> list[str]:
    """srun starting `ppn` ranks on each of the job's nodes; one rank failing stops the others;
    `label`: each line with its task's number."""
    argv = ["srun", f"--nodes={np // ppn}", f"--ntasks={np}", f"--ntasks-per-node={ppn}",
            "--kill-on-bad-exit=1", *(["--label"] if label else [])]
    if cpus_per_task is not None:
        argv.append(f"--cpus-per-task={cpus_per_task}")
    return argv + command


@dataclass(kw_only=True, frozen=True)
class BatchJob:
    """What the batch script holds: the job's shape, where it runs and writes, and the ranks'
    command."""

    name: str
    np: int
    ppn: int
    cwd: str
    output: str  # Slurm's --output pattern (%j: the job id)
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    options: BatchOptions = field(default_factory=BatchOptions)
    label: bool = True  # srun --label (off where the ranks' program tags its own lines)
    # variables exported from the run's secrets file (launch/spec.py: filed_env)
    from_file: tuple[str, ...] = ()


def _directives(job: BatchJob) -> list[str]:
    opts = job.options
    lines = [f"--job-name={job.name}", f"--nodes={job.np // job.ppn}",
             f"--ntasks-per-node={job.ppn}", f"--output={job.output}", f"--chdir={job.cwd}"]
    lines += [f"--{k}={v}" for k, v in (("partition", opts.partition), ("time", opts.time),
                                        ("account", opts.account)) if v]
    lines += ["--exclusive"] if opts.exclusive else []
    # --requeue: the next start appends to the same output file, which `cpudist logs -f` follows
    # across restarts
    lines += ["--requeue", f"--signal=B:USR1@{opts.signal_s}",
              "--open-mode=append"] if opts.requeue else []
    return [f"#SBATCH {shlex.quote(d)}" for d in (*lines, *opts.sbatch_args)]


def sbatch_script(job: BatchJob) -> str:
    """The batch script: Slurm directives, every rank variable, the rendezvous on the first node,
    srun."""
    exports = [f"export {k}={shlex.quote(v)}" for k, v in job.env
               if k not in ("MASTER_ADDR", "MASTER_PORT")]
    return "\n".join([
        "#!/bin/bash",
        f"# {job.name}: {job.np // job.ppn} node(s) x {job.ppn} rank(s), written and submitted by "
        "`cpudist run --launcher slurm`,",
        "# which follows the job and records its result; to run it again by hand: sbatch THIS_FILE",
        "# (the ranks write result.json into the run folder: keep it on a filesystem the nodes "
        "share).",
        *_directives(job),
        "set -eu",
        *_secrets_lines(job),
        "",
        "# The environment of every rank, as the mpirun path sets it (cpudist/launch/env.py: "
        "node_env).",
        *exports,
        *_from_file_lines(job),
        "# Rendezvous: rank 0 runs on the first node of the allocation; the port differs between "
        "jobs.",
        'nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))',
        'export MASTER_ADDR="${nodes[0]}"',
        "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))",
        "# Each rank gets its share of its node's CPUs in the job (srun does not inherit sbatch's "
        "-c). Without",
        "# --exclusive Slurm grants one CPU per rank, and each rank then runs one thread.",
        "cpus=${SLURM_JOB_CPUS_PER_NODE%%[(,]*}  # this node's CPUs in the job: the first of e.g. "
        "2(x3),1",
        f"export SRUN_CPUS_PER_TASK=$(( cpus / {job.ppn} ))",
        *(_requeue_lines(job) if job.options.requeue else
          [("" if _secrets_file(job) else "exec ")
           + shlex.join(srun_argv(job.np, job.ppn, list(job.command), None, job.label))]),
        "",
    ])


# Prints `export NAME=value` for the named variables of the secrets file: the values never enter
# this script's text.
_EXPORTS = ("import json, os, shlex, sys; values = "
            "json.load(open(os.path.expanduser(sys.argv[1]))); "
            'print("\\n".join("export %s=%s" % (k, shlex.quote(values[k])) for k in sys.argv[2:]))')


def _from_file_lines(job: BatchJob) -> list[str]:
    if not job.from_file:
        return []
    python = shlex.join([job.command[0], "-c", _EXPORTS])
    return ["# --env values: from the run's secrets file (0600, removed at the job's end), never "
            "written here.",
            f'exports=$({python} "$CPUDIST_SECRETS" {shlex.join(job.from_file)})',
            'eval "$exports"']


def _secrets_file(job: BatchJob) -> str | None:
    return dict(job.env).get(SECRETS_ENV)


# True once Slurm has requeued the job since this start began: its restart count is past this
# start's. A slurmctld out of reach says nothing: the file goes (a Slurm requeue is slurmctld's own
# doing).
_REQUEUED_BY_SLURM = [
    "requeued_by_slurm() {",
    '  restarts=$(scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null | grep -o " Restarts=[0-9]*")',
    '  [ "${restarts#*=}" -gt "${SLURM_RESTART_COUNT:-0}" ] 2>/dev/null',
    "}",
]


def _secrets_lines(job: BatchJob) -> list[str]:
    """The run's secrets file (cpudist/secrets.py, written before sbatch) removed when the job ends,
    however it ends but requeued (its next start reads it again); `cpudist` removes it too when it
    lands the job."""
    where = _secrets_file(job)
    if where is None:
        return []
    remove = f'[ "${{{REQUEUED_VAR}:-0}}" = 1 ] || requeued_by_slurm || {remove_command(where)}'
    lines = ["# --secret/--env-file: the ranks read the values from the file CPUDIST_SECRETS "
             "names; it goes at the",
             "# job's end, and stays for the next start of a job requeued by this script or by "
             "Slurm",
             "# (scontrol requeue, a node failure): slurmctld counts the restart before it stops "
             "this start.",
             *_REQUEUED_BY_SLURM, f"trap {shlex.quote(remove)} EXIT"]
    # scancel and the time limit send TERM to this script too: its end, once srun has ended, runs
    # the trap above
    return lines if job.options.requeue else [*lines, "trap 'exit 143' TERM"]


def _requeue_lines(job: BatchJob) -> list[str]:
    """srun in the background; Slurm's USR1 ahead of the time limit is passed on as the SIGTERM that
    makes the ranks checkpoint and stop (train/preempt.py), and a stop after a checkpoint requeues
    the job, whose ranks resume."""
    marker = shlex.quote(f"{Path(job.output).parent}/{stop_marker.NAME}")
    return [
        "# --requeue: Slurm sends this script USR1 before the time limit (--signal=B:...); the "
        "ranks get SIGTERM",
        "# (scancel without --full signals the job's steps, not this script), checkpoint and stop; "
        "then the job",
        "# is requeued, and its next start resumes from that checkpoint (the ranks run with "
        "--resume auto).",
        f"rm -f {marker}",
        "stop=0",
        "trap 'stop=1; scancel --signal=TERM \"$SLURM_JOB_ID\"' USR1",
        "set +e",
        shlex.join(srun_argv(job.np, job.ppn, list(job.command), None, job.label)) + " &",
        "ranks=$!",
        'wait "$ranks"; code=$?',
        '# wait returns early (128+10) when the trap runs: wait again for the ranks\' own end',
        'while [ "$stop" = 1 ] && [ "$code" -gt 128 ]; do stop=2; wait "$ranks"; code=$?; done',
        "# Preempted (a higher-priority job takes the nodes): Slurm sends the ranks SIGTERM "
        "itself, sets PreemptTime,",
        "# and cancels the job at the end of its GraceTime; the stop the ranks saved requeues it "
        "as a time limit does.",
        f'if [ "$stop" = 0 ] && [ -e {marker} ] && scontrol show job -o "$SLURM_JOB_ID" | grep -q '
        '" PreemptTime=[0-9]"',
        'then stop=preempted; fi',
        f'if [ "$stop" != 0 ] && [ -e {marker} ]; then',
        '  echo "[cpudist] requeueing Slurm job $SLURM_JOB_ID: the ranks saved a checkpoint '
        'before its $([ "$stop" = preempted ] && echo preemption || echo time limit)"',
        f"  {REQUEUED_VAR}=1",
        '  scontrol requeue "$SLURM_JOB_ID"',
        "fi",
        'exit "$code"',
    ]
