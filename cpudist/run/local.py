"""A run whose ranks start from this machine: launch, follow, and how it ended.

This machine is the cluster, the head of a hostfile's nodes, a scheduler's login node, or the head
that a laptop's agent (run/agent.py) runs on. Recording the result is the caller's
(run/outcome.record).
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any

from cpudist import state
from cpudist.launch import kinds
from cpudist.launch.kind import Streams
from cpudist.launch.secret_files import hider, placed
from cpudist.launch.spec import Launch, RunSpec, redacted
from cpudist.launch.watch import lost_error, node_watch
from cpudist.results.launched import Launched, write_card_part
from cpudist.run.outcome import check, fetch_from_rank0, keep_stop
from cpudist.run.request import Callbacks
from cpudist.train.checkpoint_meta import clear_partial
from cpudist.train.resume import checkpoint_folder
from cpudist.wire import events, names, stop_marker


def begin(spec: RunSpec, launched: Launched) -> tuple[Path, Launched]:
    """The run folder readied for a launch (a submitted job's too): its command, no stale stop, the
    card's part."""
    out = Path(spec.train.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    # the launch as it may be shown (--env values hidden), 0600 all the same: it comes home to a
    # laptop
    state.write_private(out / names.COMMAND, kinds.plan(redacted(spec)).shell() + "\n")
    stop_marker.clear(out)  # a stop of an earlier part, already resumed
    launched = dataclasses.replace(launched, launcher=spec.launcher,
                                   job_id=spec.allocation.job_id if spec.allocation else None)
    if spec.train.elastic:
        nodes = [h.name for h in spec.hosts[:spec.launch.nodes]]
        launched = dataclasses.replace(launched, nodes=nodes, world_size=len(nodes))
    write_card_part(out, launched)  # rank 0 renders the final card with it
    return out, launched


def execute(spec: RunSpec, launch: Launch, cb: Callbacks, timeout_s: float | None,
            launched: Launched) -> Launched:
    """Launch the ranks (or submit them to a scheduler), wait; raise the one-line error of a run
    that did not end well.

    Returns `launched` with what the launch learnt (the launcher, the scheduler's job id), for the
    run's record.
    """
    out, launched = begin(spec, launched)
    kind = kinds.kind_of(spec.launcher)
    log = (out / names.RANKS_LOG).open("w")  # every rank line, also when a run elsewhere fetches it
    try:
        hide = hider(spec)  # a --secret value a rank prints shows as *** in ranks.log and here
        unwritten: list[OSError] = []

        def to_log(line: str) -> None:
            if unwritten:
                return
            try:
                log.write(hide(line) + "\n")
                log.flush()
            # a full disk: the ranks' lines still reach the screen, and the run its end
            except OSError as e:
                unwritten.append(e)
                cb.on_line(f"[cpudist] warning: {out / names.RANKS_LOG} is no longer written: "
                           f"{e.strerror or e}")

        def on_line(line: str) -> None:
            to_log(line)
            cb.on_line(hide(line))

        # a submitted job's nodes: not ours
        watch = None if launch.script is not None else node_watch(spec)
        stops: list[dict[str, Any]] = []

        def on_event(event: dict[str, Any]) -> None:
            if events.kind(event) == events.PREEMPTED:
                stops.append(event)
            cb.on_event(event)

        with placed(spec):  # --secret/--env-file: the 0600 file on every node while the ranks run
            streams = Streams(on_event, on_line, to_log, lambda line: cb.on_line(hide(line)),
                              on_stop=lambda: stop_marker.ask(out))  # rank 0 then leaves no marker
            ended = kind.execute(launch, out, streams, timeout_s, watch)
    finally:
        # what a full disk kept in the buffer is lost, not the run's end
        with contextlib.suppress(OSError):
            log.close()
        # its process group, rank 0's included, is gone
        if launch.script is None and not launch.per_host:
            folder = checkpoint_folder(spec.train, out)
            for name in clear_partial(folder):
                cb.on_line(f"[cpudist] removed {folder / name}: a checkpoint the stopped ranks "
                           "left half-written")
    # rank 0 off this host (torchrun across hosts): its stop marker is there, the outcome decided
    # here
    if stops:
        keep_stop(out, stops[-1])
    if watch is not None and ended.outcome.returncode != 0 and stop_marker.read(out) is None:
        # A lost node is the cause whatever the launcher said (it may have seen its ssh end first);
        # a stop after a checkpoint stays a stop (resumable, --on-preemption resume), whatever
        # happened to a node since.
        lost = watch.lost or watch.check_now()
        if lost is not None:
            raise lost_error(lost)
    if ended.job_id is not None:
        launched = dataclasses.replace(launched, job_id=ended.job_id)
    check(ended.outcome, out, timeout_s, ended.what, ended.verdict)
    if launch.per_host:
        fetch_from_rank0(out, spec.hosts, spec.ssh)
    return launched
