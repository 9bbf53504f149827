"""A run's identity: its id, given once where the run starts, and run.json, the run's state in its
folder.

    20261126-101502-3fa9c1     sortable by start time; unique (6 random hex digits)
    <run folder>/run.json      id, task, model, where, state, start and end time, metric; rewritten
                               whole (atomically) at every change of state by `mark`, its one writer

The id goes to the ranks (TrainConfig.run_id), into every checkpoint's meta and result.json, names
the run's part of a --checkpoint-s3 location and its folder on a remote head. A resume keeps the id
of the run it continues.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cpudist import state
from cpudist.config import TrainConfig
from cpudist.errors import CpudistError
from cpudist.run.life.process import this_process
from cpudist.train import checkpoint_meta as ckpt
from cpudist.train.checkpoint_match import SAME_RUN
from cpudist.train.durable import runs_in
from cpudist.train.resume import checkpoint_folder
from cpudist.wire import names

STATES = ("running", "finished", "failed", "interrupted", "preempted")


def new_run_id(now: datetime | None = None) -> str:
    """YYYYMMDD-HHMMSS-<6 hex>, in UTC: sorts by start time."""
    return f"{(now or datetime.now(UTC)).strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(kw_only=True, frozen=True)
class RunInfo:
    """run.json: what a run is and where it stands."""

    id: str
    task: str
    model: str
    where: str  # here | hostfile:<path> | slurm | cluster:<name> | head:<host>
    state: str  # one of STATES
    started_at: str
    ended_at: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    run_dir: str = ""
    parts: int = 1  # the parts so far (a resume adds one)
    message: str = ""  # how a run that did not finish ended, in one line
    resume: str = ""  # after a stop that left a checkpoint: the exact command that goes on from it
    # the `cpudist run` command line (for the resume command `cpudist stop` prints)
    command: str = ""
    # the launching `cpudist run` process (`cpudist stop` signals it), on host, started at pid_start
    pid: int = 0
    host: str = ""
    # its start in clock ticks after boot (run/life/process.py): a reused PID never matches
    pid_start: int = 0
    # `run --detach`: its head and agent (run/life/detach.py)
    detached: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunInfo:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def read_run(out: Path) -> RunInfo | None:
    """The run.json of run folder `out`, or None when there is none (or it cannot be read, or
    its id is not one)."""
    try:
        info = RunInfo.from_dict(json.loads((out / names.RUN).read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return info if state.is_run_id(info.id) else None


def write_run(out: Path, info: RunInfo) -> None:
    state.write_atomic(out / names.RUN, json.dumps(info.to_dict(), indent=2) + "\n")


def begin(cfg: TrainConfig, where: str, command: str = "") -> RunInfo:
    """run.json as the run (or its next part) starts: running, with the first part's start time, and
    this (the launching) process."""
    out = Path(cfg.output_dir)
    earlier = read_run(out)
    me = this_process()
    if earlier is not None and earlier.id == cfg.run_id:
        info = dataclasses.replace(earlier, state="running", ended_at=None, where=where,
                                   parts=earlier.parts + 1,
                                   message="", command=command or earlier.command)
    else:
        info = RunInfo(id=cfg.run_id, task=cfg.task, model=cfg.model, where=where, state="running",
                       started_at=_now(), run_dir=str(out.resolve()), command=command)
    info = dataclasses.replace(info, pid=me.pid, host=me.host, pid_start=me.start)
    write_run(out, info)
    return info


def mark(out: Path, run_state: str, metrics: dict[str, float] | None = None, message: str = "",
         resume: str = "") -> None:
    """Record a change of state in run.json (the one writer after `begin`): its end time, metric or
    message."""
    assert run_state in STATES, run_state
    info = read_run(out)
    if info is None:
        return
    ended = None if run_state == "running" else _now()
    write_run(out,
              dataclasses.replace(info, state=run_state, ended_at=ended, message=message,
                                  resume=resume,
                                  metrics=metrics if metrics is not None else info.metrics))


def assign(cfg: TrainConfig) -> TrainConfig:
    """The config with the run's id: a fresh id for a new run; a resume keeps the id of the run it
    continues (the checkpoint's, else the run folder's run.json, else the newest matching run in the
    --checkpoint-s3 location); an id already given (a recovery's next part) stays."""
    if cfg.run_id:
        return cfg
    found = _continued(cfg) if cfg.resume is not None else None
    return dataclasses.replace(cfg, run_id=found or new_run_id())


def _continued(cfg: TrainConfig) -> str | None:
    """The id of the run a --resume continues, where this machine can see it."""
    out = Path(cfg.output_dir)
    folder = checkpoint_folder(cfg, out)
    if cfg.resume == "auto":
        candidates = ckpt.complete_checkpoints(folder)[:1]
    else:
        given = Path(cfg.resume or "").expanduser()
        candidates = [given] if ckpt.step_of(given.name) is not None else (
            ckpt.complete_checkpoints(given / names.CHECKPOINTS)
            or ckpt.complete_checkpoints(given))[:1]
        # A checkpoint of another folder starts a run of its own (a branch); one of this folder goes
        # on with it.
        candidates = [p for p in candidates if p.parent.resolve() == folder.resolve()]
    for path in candidates:
        if found := ckpt.owner(path):
            return state.check_run_id(found, str(path / ckpt.META))  # it names folders
    info = read_run(out)
    if info is not None and cfg.resume == "auto":
        return info.id
    return _from_copy(cfg) if cfg.resume == "auto" and cfg.checkpoint_s3 else None


def _from_copy(cfg: TrainConfig) -> str | None:
    """The run folder is gone (the head's disk with it): the newest run in the --checkpoint-s3
    location whose checkpoints this config can continue (same task, model, data and seed)."""
    from cpudist.cloud.connect import open_store  # boto3: only on this path

    store = open_store(cfg.checkpoint_s3 or "")
    mine = dataclasses.asdict(cfg)
    for run_id, steps in sorted(runs_in(store).items(), reverse=True):  # ids sort by start time
        if not state.is_run_id(run_id):
            continue  # not a run's folder
        with tempfile.TemporaryDirectory() as tmp:
            store.get(f"{run_id}/{steps[-1]}/{ckpt.META}", Path(tmp) / ckpt.META)
            try:
                meta = ckpt.read_meta(Path(tmp))
            except (OSError, ValueError, CpudistError):
                continue
        if all(meta.config.get(k) == mine.get(k) for k in SAME_RUN):
            return run_id
    return None
