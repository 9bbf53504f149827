"""Slurm's side of a run: the allocation we are in, submitting the batch script, following the job.

The commands (`sbatch`, `scontrol`, `scancel`) run where cpudist runs: a login node, or inside an
allocation. The job's state comes from `scontrol show job -o` while it runs and from `sacct` once it
ended where the site has accounting (launch/slurm_query.py: both retried through a busy slurmctld),
its output from the file the script names (`slurm-<job>.out` in the run folder), read as it grows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cpudist import state
from cpudist.errors import BadInput, CpudistError, Interrupted, JobFailed
from cpudist.hostfile import Host, Nodes
from cpudist.interrupts import shielded
from cpudist.launch import runner, slurm
from cpudist.launch.batch import SLURM_FLAGS, BatchOptions
from cpudist.launch.kind import Direct, Ended, JobWatch, Placement, Streams
from cpudist.launch.slurm import Allocation, JobInfo, expand_counts
from cpudist.launch.slurm_query import final_info, job_info
from cpudist.launch.spec import SBATCH_FILE, Launch, RunSpec, filed_env, trainer_argv
from cpudist.launch.watch import NodeWatch
from cpudist.waits import TimedOut, wait_until
from cpudist.wire import events

POLL_S = 2.0  # between `scontrol show job` calls (the output file is read every OUTPUT_POLL_S)
OUTPUT_POLL_S = 0.5
CANCEL_WAIT_S = 60.0  # after scancel: the ranks get SIGTERM, then SIGKILL after Slurm's KillWait


def _run(argv: list[str], timeout_s: float = 60) -> str:
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


def current_allocation(env: Mapping[str, str]) -> Allocation | None:
    """The allocation this process runs in (SLURM_JOB_ID set by salloc/sbatch), or None."""
    job_id = env.get("SLURM_JOB_ID")
    if not job_id:
        return None
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "")
    nodes = tuple(_run(["scontrol", "show", "hostnames", nodelist]).split())
    try:
        cpus = expand_counts(env.get("SLURM_JOB_CPUS_PER_NODE", "1"))[0]
    except ValueError:
        cpus = 1
    return Allocation(job_id, nodes, cpus)


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
            _run(["scancel", job_id])
        time.sleep(OUTPUT_POLL_S)


def submit(launch: Launch, out: Path, say: Callable[[str], None]) -> str:
    """Write the batch script into the run folder and submit it; the job's id."""
    assert launch.script is not None
    script = out / SBATCH_FILE
    # it exports the --env values (tokens): the user's eyes only
    state.write_private(script, launch.script)
    job_id = _run(list(launch.argv)).strip().split(";")[0]  # --parsable: "id" or "id;cluster"
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
            wait_until(lambda: (job_info(job_id) or JobInfo(job_id, "COMPLETED")).ended or None,
                       f"Slurm job {job_id} to end", CANCEL_WAIT_S, OUTPUT_POLL_S)


def submit_and_follow(launch: Launch, out: Path, on_event: Callable[[dict[str, Any]], None],
                      on_line: Callable[[str], None], say: Callable[[str], None],
                      timeout_s: float | None = None, on_stop: Callable[[], None]
                      | None = None) -> SlurmOutcome:
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
    job = slurm.BatchJob(f"cpudist-{spec.train.task}", spec.np, spec.ppn, spec.cwd,
                         str(out / "slurm-%j.out"),
                         tuple(trainer_argv(spec)),
                         tuple((k, v) for k, v in env.items() if k not in from_file),
                         options, label=not spec.own_tags, from_file=from_file)
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
                                     timeout_s,
                                     streams.on_stop)
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
                          streams.say,
                          timeout_s)
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
