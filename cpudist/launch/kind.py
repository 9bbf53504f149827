"""What a launcher kind is: one object that places the ranks, builds the launch, runs it and judges
its end.

    placed(listed, nodes)    the nodes a scheduler gives (None: a hostfile's, or this machine's)
    build(spec, env)         the Launch: one command, one per host, or a batch script to submit
    execute(launch, ...)     run it to its end (a scheduler's job: submit and follow it) -> Ended
    scheduled                a scheduler picks the nodes, which see the launching node's files
                             (nothing is staged), and its job outlives this process (--detach
                             leaves it running)
    about                    one line for `--launcher`'s help (empty: its name says it)

run/ reads only this protocol (launch/kinds.KINDS holds one object per name); adding a scheduler is
one module with such an object and one row of KINDS (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cpudist.hostfile import Host, Nodes
from cpudist.launch import elastic, per_host, runner
from cpudist.launch.batch import Flag
from cpudist.launch.spec import Launch, RunSpec
from cpudist.launch.watch import NodeWatch


@dataclass(frozen=True)
class Streams:
    """Where a running launch's output goes: progress events, lines to show, lines only for the
    log."""

    on_event: Callable[[dict[str, Any]], None]
    on_line: Callable[[str], None]  # shown and logged
    to_log: Callable[[str], None]  # logged only (other hosts' noise while they stop)
    say: Callable[[str], None]  # cpudist's own notes (a scheduler's job states)
    # the user's stop (Ctrl-C): called before the ranks get SIGTERM
    on_stop: Callable[[], None] | None = None


@dataclass(frozen=True)
class Ended:
    """How a launch ended: the launcher's outcome, what it was (for messages), and a scheduler's
    word on it."""

    outcome: runner.Outcome
    what: str  # "launcher" | "torchrun"
    job_id: str | None = None  # the scheduler's job
    # (message, hint) when the scheduler failed the job (time limit, node)
    verdict: tuple[str, str] | None = None


@dataclass(frozen=True)
class Placement:
    """The nodes a scheduler gives a run: hosts in rank order, the rendezvous address, its
    allocation (if in one)."""

    hosts: tuple[Host, ...]
    master: str
    allocation: Any = None  # the kind's own record of the allocation the launch runs inside


class Kind(Protocol):
    """A launcher kind (see the module's doc)."""

    @property
    def name(self) -> str: ...

    @property
    def scheduled(self) -> bool: ...

    @property
    def about(self) -> str: ...

    def placed(self, listed: Nodes | None, nodes: int) -> Placement | None: ...

    def build(self, spec: RunSpec, env: dict[str, str]) -> Launch: ...

    def execute(self, launch: Launch, out: Path, streams: Streams, timeout_s: float | None,
                watch: NodeWatch | None) -> Ended: ...


class JobWatch(Protocol):
    """A submitted job's output and state, read one poll at a time."""

    @property
    def events(self) -> int: ...  # progress lines seen so far

    # None while the job runs; once it ended, something that is not None
    def poll(self) -> object | None: ...


class Batch(Kind, Protocol):
    """A scheduled kind whose job outlives this process: submitted, watched, followed, stopped by
    its id."""

    @property
    def label(self) -> str: ...  # its name as people write it (Slurm)

    @property
    # what the CLI offers for BatchOptions (launch/batch.py)
    def flags(self) -> tuple[Flag, ...]: ...

    def job_name(self, job_id: str) -> str: ...

    def submit(self, launch: Launch, out: Path, say: Callable[[str], None]) -> str: ...

    def watch(self, job_id: str, out: Path, streams: Streams) -> JobWatch: ...

    def ended_early(self, watch: JobWatch) -> Ended: ...

    def follow(self, job_id: str, out: Path, streams: Streams,
               timeout_s: float | None) -> Ended: ...

    def cancel(self, job_id: str) -> None: ...

    def signal_ranks(self, job_id: str) -> None: ...


class Direct:
    """A kind that starts the ranks itself (MPI, torchrun): nodes from a hostfile or this machine,
    run here."""

    scheduled = False
    about = ""

    def placed(self, listed: Nodes | None, nodes: int) -> Placement | None:
        return None

    def execute(self, launch: Launch, out: Path, streams: Streams, timeout_s: float | None,
                watch: NodeWatch | None) -> Ended:
        """Run the launch to its end; `watch` stops it when a node is lost."""
        if launch.lighthouse is not None:  # --elastic: a lost node is not the run's end
            return Ended(elastic.execute_elastic(launch, os.environ, streams.on_event,
                                                 streams.on_line, streams.say, timeout_s,
                                                 streams.to_log, streams.on_stop),
                         "elastic launch")
        if launch.per_host:
            return Ended(per_host.execute_hosts(launch, os.environ, streams.on_event,
                                                streams.on_line, timeout_s, streams.to_log, watch,
                                                streams.on_stop), "torchrun")
        return Ended(runner.execute(launch, os.environ, streams.on_event, streams.on_line,
                                    timeout_s, watch, streams.on_stop), "launcher")
