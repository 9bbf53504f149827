"""Slurm as a launcher kind: the allocation we are in, the batch script or the step, and the `Slurm`
kind that submits, follows, detaches and judges a job (launch/slurm_follow.py follows it)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cpudist.errors import BadInput
from cpudist.hostfile import Host, Nodes
from cpudist.launch import runner, slurm
from cpudist.launch.batch import SLURM_FLAGS, BatchOptions
from cpudist.launch.kind import Direct, Ended, JobWatch, Placement, Streams
from cpudist.launch.slurm import Allocation, expand_counts
from cpudist.launch.slurm_follow import (
    Follower,
    SlurmOutcome,
    cancel,
    follow,
    slurm_command,
    submit,
    submit_and_follow,
)
from cpudist.launch.slurm_query import job_info
from cpudist.launch.spec import SBATCH_FILE, Launch, RunSpec, filed_env, trainer_argv
from cpudist.launch.watch import NodeWatch


def current_allocation(env: Mapping[str, str]) -> Allocation | None:
    """The allocation this process runs in (SLURM_JOB_ID set by salloc/sbatch), or None."""
    job_id = env.get("SLURM_JOB_ID")
    if not job_id:
        return None
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "")
    nodes = tuple(slurm_command(["scontrol", "show", "hostnames", nodelist]).split())
    try:
        cpus = expand_counts(env.get("SLURM_JOB_CPUS_PER_NODE", "1"))[0]
    except ValueError:
        cpus = 1
    return Allocation(job_id, nodes, cpus)


def batch_or_step(spec: RunSpec, env: dict[str, str]) -> Launch:
    """srun inside an allocation (each rank its node's share of the CPUs); else an sbatch script to
    submit."""
    if spec.allocation is not None:
        alloc = spec.allocation
        if spec.np // spec.ppn > len(alloc.nodes):
            raise BadInput(f"--np {spec.np} with --ppn {spec.ppn} needs {spec.np // spec.ppn} "
                           f"nodes but the allocation (job {alloc.job_id}) has {len(alloc.nodes)}",
                           f"Use at most --nodes {len(alloc.nodes)}, or allocate more (salloc -N "
                           "...)")
        cpus = max(1, alloc.cpus_per_node // spec.ppn)
        return Launch(tuple(slurm.srun_argv(spec.np, spec.ppn, trainer_argv(spec), cpus,
                                            not spec.own_tags)), env)
    # absolute: the script may be submitted from elsewhere
    out = Path(spec.cwd, spec.train.output_dir)
    options = spec.launch.batch or BatchOptions()
    if options.requeue and spec.train.resume is None and not spec.program:
        # a requeued job runs this script again: its ranks go on from the run's newest checkpoint
        # (of this run id only, run/life/identity.py), and the first start, finding none, starts
        # from step 0
        spec = dataclasses.replace(spec, train=dataclasses.replace(spec.train, resume="auto"))
    from_file = tuple(k for k, _ in filed_env(spec))  # --env values: from the secrets file
    job = slurm.BatchJob(name=f"cpudist-{spec.train.task}", np=spec.np, ppn=spec.ppn, cwd=spec.cwd,
                         output=str(out / "slurm-%j.out"), command=tuple(trainer_argv(spec)),
                         env=tuple((k, v) for k, v in env.items() if k not in from_file),
                         options=options, label=not spec.own_tags, from_file=from_file)
    return Launch(("sbatch", "--parsable", str(out / SBATCH_FILE)), env,
                  script=slurm.sbatch_script(job))


@dataclass(frozen=True)
class Slurm:
    """Slurm: srun inside an allocation, else a batch script that sbatch submits (and cpudist
    follows)."""

    name: str = "slurm"
    scheduled = True
    label = "Slurm"  # as the user writes it
    about = "sbatch from a login node (srun inside an allocation)"
    flags = SLURM_FLAGS

    def placed(self, listed: Nodes | None, nodes: int) -> Placement:
        """The allocation's nodes, or placeholders until sbatch picks them (the script then takes
        the first's)."""
        if listed is not None:
            raise BadInput("--launcher slurm takes its nodes from Slurm, not from --hostfile",
                           "Drop --hostfile (ask for --nodes N --ppn P), or use another --launcher")
        allocation = current_allocation(os.environ)
        if allocation is not None:
            return Placement(tuple(Host(n) for n in allocation.nodes), allocation.nodes[0],
                             allocation)
        return Placement(tuple(Host(f"slurm-node-{i}") for i in range(nodes)), "", None)

    def build(self, spec: RunSpec, env: dict[str, str]) -> Launch:
        return batch_or_step(spec, env)

    def execute(self, launch: Launch, out: Path, streams: Streams, timeout_s: float | None,
                watch: NodeWatch | None) -> Ended:
        """srun inside an allocation runs here like any launcher; a batch script is submitted and
        followed, and a job Slurm ended badly (time limit, a node's failure) gets Slurm's
        verdict."""
        if launch.script is None:
            return Direct().execute(launch, out, streams, timeout_s, watch)
        followed = submit_and_follow(launch, out, streams.on_event, streams.on_line, streams.say,
                                     timeout_s, streams.on_stop)
        return _ended(followed, out)

    # A submitted job outlives this process: --detach leaves it, `logs -f`/`stop` come back
    # (run/life/batch_detach)

    def job_name(self, job_id: str) -> str:
        return f"Slurm job {job_id}"

    submit = staticmethod(submit)
    cancel = staticmethod(cancel)

    def watch(self, job_id: str, out: Path, streams: Streams) -> Follower:
        """The job's output and state, one `poll()` at a time (its `events` count the progress lines
        seen)."""
        return Follower(job_id, out / f"slurm-{job_id}.out", streams.on_event, streams.on_line,
                        streams.say)

    def ended_early(self, watch: JobWatch) -> Ended:
        """How a watched job ended (its poll returned its end before any progress line)."""
        assert isinstance(watch, Follower) and watch.info is not None
        return _ended(SlurmOutcome(watch.info, False, tuple(watch.last)), watch.tail.path.parent)

    def follow(self, job_id: str, out: Path, streams: Streams, timeout_s: float | None) -> Ended:
        """Follow the job's output from its start to its last end (across requeues); past
        `timeout_s`, cancel it."""
        followed = follow(job_id, out / f"slurm-{job_id}.out", streams.on_event, streams.on_line,
                          streams.say, timeout_s)
        return _ended(followed, out)

    def signal_ranks(self, job_id: str) -> None:
        """SIGTERM to the job's steps (its ranks), not to the batch script (no requeue): they
        checkpoint and stop. A pending job (queued, or requeued and held) has no ranks to save
        anything: it is cancelled at once."""
        info = job_info(job_id)
        pending = info is not None and info.state == "PENDING"
        argv = ["scancel", job_id] if pending else ["scancel", "--signal=TERM", job_id]
        subprocess.run(argv, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)


def _ended(followed: SlurmOutcome, out: Path) -> Ended:
    """A followed job's end as any launch's: exit 0 when COMPLETED, and Slurm's verdict when it
    ended the job."""
    info = followed.info
    outcome = runner.Outcome(0 if info.state == "COMPLETED" else 1, followed.timed_out,
                             followed.last_lines)
    verdict = None
    if info.state not in ("COMPLETED", "UNKNOWN"):
        detail = runner.rank_error(outcome.last_lines, runner.failed_host(outcome.last_lines))
        verdict = slurm.failure(info, str(out / f"slurm-{info.job_id}.out"), detail)
    return Ended(outcome, "launcher", info.job_id, verdict)
