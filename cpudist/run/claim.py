"""A run folder holds one run: a fresh run starts in an empty folder, a resume in the folder of
the run it goes on with, and --overwrite-output-dir (HF's word) puts a new run in place of an
earlier one. No file that a run did not make is ever written over or removed.

    empty, or new                       the run starts
    this run's (run.json has its id)    the run goes on (--resume, a recovery's next part)
    anything else                       refused, unless --overwrite-output-dir:
      an earlier run still going          refused: stop it first
      a file at a name the run writes     refused, unless the folder's earlier run made it
                                          (a user's ./hostfile with --output-dir .)
      another run's checkpoints           refused (train/resume.py): work is never removed
      else                                the earlier run's files go; every other file stays

The earlier run keeps its ledger line; `cpudist logs`/`stop` of its id say that its folder holds
another run now (run/life/control.py).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from cpudist.config import TrainConfig
from cpudist.errors import BadInput
from cpudist.launch.spec import SBATCH_FILE
from cpudist.results.launched import LAUNCHED, RANK_REPORT
from cpudist.run.life.headlog import HEAD_LOG_MARK
from cpudist.run.life.identity import RunInfo, read_run
from cpudist.run.life.process import Proc, alive, this_host
from cpudist.train import checkpoint_meta as ckpt
from cpudist.train.report_to import RUN_FOLDERS
from cpudist.train.resume import check_fresh, checkpoint_folder
from cpudist.wire import names, stop_marker

COLLECTED = "collected"  # where `cpudist launch --collect` copies the script's outputs
# What a run makes at the top of its folder, on any route.
RUN_NAMES = frozenset({
    names.RUN, names.RESULT, names.aside(names.RESULT), RANK_REPORT, f"{RANK_REPORT}.tmp", LAUNCHED,
    names.STEPS,
    names.COMMAND, names.LOG,
    names.RANKS_LOG, names.HOSTFILE, SBATCH_FILE, stop_marker.NAME, stop_marker.REQUEST,
    names.MODEL, names.aside(names.MODEL), ".from-rank0.tmp", HEAD_LOG_MARK, COLLECTED,
    names.CHECKPOINTS,
    *RUN_FOLDERS})
ENDED_SLACK_S = 5.0  # an earlier run's file is at most this much younger than its end (seconds)


def claim(cfg: TrainConfig, overwrite: bool, say: Callable[[str], None]) -> None:
    """Make cfg.output_dir the run's (its id assigned), or refuse in one line, writing nothing."""
    out = Path(cfg.output_dir)
    entries = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    earlier = read_run(out)
    if not entries or _own(cfg, out, earlier):
        return
    if not overwrite:
        raise _not_empty(out, earlier, entries)
    if earlier is not None and _going_on(earlier):
        raise BadInput(f"--output-dir {out} holds run {earlier.id}, which is still running",
                       f"Stop it first (`cpudist stop {earlier.id}`), or give this run another "
                       "--output-dir")
    theirs = _made_by(earlier, out, entries)
    clash = [n for n in entries if n in RUN_NAMES and n != names.CHECKPOINTS and n not in theirs]
    if clash:
        raise BadInput(f"--output-dir {out} holds {', '.join(clash)}, which this run would write "
                       "over and no earlier run made there",
                       "Give this run a folder of its own (--output-dir runs/NAME)")
    check_fresh(cfg)  # another run's checkpoints: a fresh run beside them is refused
    if earlier is not None:
        say(f"--overwrite-output-dir: run {earlier.id}'s files in {out} make way for run "
            f"{cfg.run_id} (its ledger line stays)")
    for name in theirs:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def _not_empty(out: Path, earlier: RunInfo | None, entries: list[str]) -> BadInput:
    if earlier is None:
        more = f" and {len(entries) - 3} more" if len(entries) > 3 else ""
        shown = ", ".join(entries[:3]) + more
        return BadInput(f"--output-dir {out} is not empty: it holds {shown}",
                        "Give this run another --output-dir, or pass --overwrite-output-dir to "
                        "write it there beside them")
    go_on = "continue it with --resume auto, " if earlier.state != "finished" else ""
    return BadInput(f"--output-dir {out} is not empty: it holds run {earlier.id} ({earlier.state})",
                    f"Give this run another --output-dir, {go_on}or pass --overwrite-output-dir "
                    "to write it there")


def _own(cfg: TrainConfig, out: Path, earlier: RunInfo | None) -> bool:
    """The folder is this run's: its run.json says so, else (gone) its checkpoints do."""
    if earlier is not None:
        return earlier.id == cfg.run_id
    found = ckpt.complete_checkpoints(checkpoint_folder(cfg, out))
    return cfg.resume is not None and any(ckpt.owner(p) == cfg.run_id for p in found)


def _going_on(info: RunInfo) -> bool:
    """Whether the run may still be running: run.json says so and, where this machine can tell,
    its launching process lives."""
    if info.state != "running":
        return False
    if info.detached or not info.pid or info.host != this_host():
        return True  # it goes on on a head, as a batch job or on another machine: cannot tell
    return alive(Proc(info.pid, info.host, info.pid_start))


def _made_by(earlier: RunInfo | None, out: Path, entries: list[str]) -> list[str]:
    """The entries the earlier run made: names a run writes, unchanged since it ended (never
    its checkpoints)."""
    if earlier is None:
        return []
    ended = _timestamp(earlier.ended_at)
    return [n for n in entries if n in RUN_NAMES and n != names.CHECKPOINTS
            and (ended is None or os.lstat(out / n).st_mtime <= ended + ENDED_SLACK_S)]


def _timestamp(text: str | None) -> float | None:
    try:
        return datetime.fromisoformat(text).timestamp() if text else None
    except ValueError:
        return None
