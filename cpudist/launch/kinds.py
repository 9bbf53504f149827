"""Every launcher kind, dispatched in one place: building a launch from a spec, and running it.

A kind is one object with a `name` and `build(spec, env) -> Launch`. A Launch comes in three shapes,
each run here: one command (`argv`: MPI, srun, torchrun on one machine), one command per host
(`per_host`: torchrun across hosts), or a batch script to submit (`script`: sbatch). A new kind
(Kubernetes, Ray, ...) is one module with a `build` and one row of KINDS.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cpudist.errors import BadInput
from cpudist.launch import runner, slurm_job
from cpudist.launch.mpi import Hydra, OpenMPI
from cpudist.launch.slurm import JobInfo
from cpudist.launch.spec import LAUNCHERS, Launch, RunSpec, check_layout, rank_env
from cpudist.launch.torchrun import Torchrun
from cpudist.launch.watch import NodeWatch


class Kind(Protocol):
    """A launcher: how a run's spec becomes a command (or one per host, or a batch script)."""

    @property
    def name(self) -> str: ...

    def build(self, spec: RunSpec, env: dict[str, str]) -> Launch: ...


KINDS: dict[str, Kind] = {k.name: k for k in (Hydra("mpich"), Hydra("impi"), OpenMPI(), Torchrun(), slurm_job.Slurm())}


def plan(spec: RunSpec) -> Launch:
    """The launch of a spec, after checking that its ranks fit its hosts."""
    check_layout(spec.np, spec.ppn, spec.hosts, spec.oversubscribe)
    kind = KINDS.get(spec.launcher)
    if kind is None:
        raise BadInput(f"unknown launcher '{spec.launcher}'", f"Use one of: {', '.join(LAUNCHERS)}")
    return kind.build(spec, rank_env(spec))


@dataclass(frozen=True)
class Streams:
    """Where a running launch's output goes: progress events, lines to show, lines only for the log."""

    on_event: Callable[[dict[str, Any]], None]
    on_line: Callable[[str], None]  # shown and logged
    to_log: Callable[[str], None]  # logged only (other hosts' noise while they stop)
    say: Callable[[str], None]  # cpudist's own notes (Slurm's job states)
    on_stop: Callable[[], None] | None = None  # the user's stop (Ctrl-C): called before the ranks get SIGTERM


@dataclass(frozen=True)
class Ended:
    """How a launch ended: the launcher's outcome, what it was (for messages) and Slurm's record of the job."""

    outcome: runner.Outcome
    what: str  # "launcher" | "torchrun"
    slurm: JobInfo | None = None


def execute(launch: Launch, out: Path, streams: Streams, timeout_s: float | None,
            watch: NodeWatch | None = None) -> Ended:
    """Run a launch of any shape to its end; `watch` (not for Slurm's) stops it when a node is lost."""
    if launch.script is not None:
        followed = slurm_job.submit_and_follow(launch, out, streams.on_event, streams.on_line, streams.say, timeout_s,
                                               streams.on_stop)
        code = 0 if followed.info.state == "COMPLETED" else 1
        return Ended(runner.Outcome(code, followed.timed_out, followed.last_lines), "launcher", followed.info)
    if launch.per_host:
        return Ended(runner.execute_hosts(launch, os.environ, streams.on_event, streams.on_line, timeout_s,
                                          streams.to_log, watch, streams.on_stop), "torchrun")
    return Ended(runner.execute(launch, os.environ, streams.on_event, streams.on_line, timeout_s, watch,
                                streams.on_stop), "launcher")
