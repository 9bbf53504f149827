"""cpudist.log: what the launching `cpudist run` showed, in its run folder, for `cpudist logs` in
another shell.

    <run folder>/cpudist.log   rank output and cpudist's own lines (progress, checkpoints, notes) as
                               plain text, written by `tee` (the one writer) on every route: here, a
                               hostfile, Slurm, a head over SSH; a resume's part appends to its
                               run's log, a new run starts it afresh
    <run folder>/ranks.log     rank output only (a run from before cpudist.log has only this)

`show` prints a run's log so far; with `follow` it goes on until run.json leaves `running`.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cpudist.run.life.identity import read_run
from cpudist.run.request import Callbacks
from cpudist.waits import wait_until
from cpudist.wire import events, names


def event_text(event: dict[str, Any]) -> str | None:
    """An event of rank 0 as the line a terminal without a progress bar shows (None: nothing to
    show)."""
    kind = events.kind(event)
    if kind == events.START:
        done = int(event.get("step", 0))
        return f"training: {int(event['total'])} steps" + (f", from step {done}" if done else "")
    if kind == events.PROGRESS:
        return f"step {event['step']}/{event['total']}  {events.progress_text(event)}"
    if kind == events.NODES:
        return events.nodes_text(event)
    if kind == events.WAITING:
        return events.waiting_text(event)
    if kind == events.CHECKPOINT:
        return f"checkpoint at step {event['step']}: {event['path']}"
    if kind == events.PREEMPTED:
        return f"stopping at step {event['step']}: {event['reason']} on {event['host']}"
    if kind == events.EVALUATED:
        return (f"evaluation at step {event['step']}: "
                + " ".join(f"{k}={v:.4f}" for k, v in event["metrics"].items()))
    if kind == events.MODEL:
        return f"model saved: {event['path']} (step {event['step']})"
    if kind == events.MODEL_S3:
        return (f"WARNING: the model was not copied to {event['url']}: {event['error']}"
                if "error" in event
                else f"model copied to {event['url']}")
    if kind == events.EVAL:
        return f"evaluating on {event['rows']} rows"
    return None


class _Writer:
    """Appends lines to the log; the first write of a new run (another id in run.json, or none)
    empties it."""

    def __init__(self, path: Path, fresh: bool) -> None:
        self.path, self.fresh = path, fresh
        self.lock = threading.Lock()  # torchrun's per-host readers call from threads

    def write(self, line: str) -> None:
        with self.lock:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("w" if self.fresh else "a") as f:
                    f.write(line.rstrip("\n") + "\n")
                self.fresh = False
            except OSError:
                # the log is a convenience: a full disk must not stop the run (ranks.log still has
                # it)
                pass


def tee(cb: Callbacks, out: Path, run_id: str) -> Callbacks:
    """Callbacks that also write every line and event (as text) to <out>/cpudist.log."""
    earlier = read_run(out)
    log = _Writer(out / names.LOG, fresh=earlier is None or earlier.id != run_id)

    def on_event(event: dict[str, Any]) -> None:
        text = event_text(event)
        if text is not None:
            log.write(f"[cpudist] {text}")
        cb.on_event(event)

    def on_line(line: str) -> None:
        log.write(line)
        cb.on_line(line)

    def note(line: str) -> None:
        log.write(f"[cpudist] {line}")
        cb.note(line)

    return dataclasses.replace(cb, on_event=on_event, on_line=on_line, note=note)


def append(out: Path, line: str) -> None:
    """One more line at the end of the run's log (how the run ended, written once the ranks are
    gone)."""
    _Writer(out / names.LOG, fresh=False).write(line)


def log_of(run_dir: Path) -> Path:
    """The file `cpudist logs` shows: cpudist.log, else (a run from before it) ranks.log."""
    ours = run_dir / names.LOG
    return ours if ours.is_file() or not (
        run_dir / names.RANKS_LOG).is_file() else run_dir / names.RANKS_LOG


def show(run_dir: Path, emit: Callable[[str], None], follow: bool = False,
         interval_s: float = 0.5) -> str:
    """Emit the run's log so far; with `follow`, go on while run.json says running (no deadline:
    Ctrl-C ends it). Returns the run's state as run.json says at the end ('' without run.json)."""
    offset = 0

    def more() -> None:
        nonlocal offset
        path = log_of(run_dir)
        try:
            with path.open("rb") as f:
                f.seek(offset)
                data = f.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1  # whole lines only: the writer may be mid-line
        if end:
            emit(data[:end].decode(errors="replace"))
            offset += end

    def ended() -> str | None:
        info = read_run(run_dir)
        now = info.state if info is not None else ""
        more()
        if follow and now == "running":
            return None
        more()  # what was written between the read of run.json and its end
        return now

    return wait_until(ended, f"the end of {run_dir}", math.inf, interval_s)
