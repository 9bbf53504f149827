"""A checkpoint's names and its meta.json, in one place and without torch (the CLI reads them before
any rank starts; cpudist/train/checkpoint.py writes and loads the tensors).

    <checkpoint dir>/step-000040/        a complete checkpoint: its COMPLETE marker is written last
                     step-000040.tmp/    one being written, renamed when complete (never picked)
                     step-000040.part/   one being downloaded from the durable copy, renamed
                                         when complete

meta.json is a CheckpointMeta: the run's options, where the data stream stands, the batch layout,
the time and work so far, and each file's size and sha256. Its `format` is checked first on load: a
checkpoint of an older format (1, 2: numpy RNG state pickled, which the safe unpickler will not
read), a newer or a foreign one is refused in one line.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from cpudist.errors import BadInput

COMPLETE = "COMPLETE"  # the marker a checkpoint folder gets last, locally and in its durable copy
NAME = re.compile(r"step-(\d+)")
TMP = ".tmp"  # suffix of a folder being written
PART = ".part"  # suffix of a folder being downloaded
META = "meta.json"
# 2: ranks.pt added; 3: only tensors and plain data in the .pt files, which are read with
# weights_only=True
FORMAT = 3
# formats 1 and 2 pickled numpy's RNG state (an ndarray): the safe unpickler refuses them
OLDEST = 3
FIX = "Resume with the cpudist version that wrote it, or start over without --resume"


def folder_name(step: int) -> str:
    """The folder of the checkpoint after optimizer step `step`: step-000040."""
    return f"step-{step:06d}"


def step_of(name: str) -> int | None:
    """The step number of a checkpoint folder name (step-000040 -> 40), or None for another name."""
    m = NAME.fullmatch(name)
    return int(m.group(1)) if m else None


def complete_checkpoints(folder: Path) -> list[Path]:
    """Complete checkpoints in `folder`, newest first."""
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if step_of(p.name) is not None
             and (p / COMPLETE).is_file()]
    return sorted(found, key=lambda p: step_of(p.name) or 0, reverse=True)


def clear_partial(folder: Path) -> list[str]:
    """Remove the half-written checkpoints (`step-N.tmp/`) in `folder`, when no rank writes there
    any more: at a part's start, and on the launching side once its ranks are gone. The names
    removed."""
    if not folder.is_dir():
        return []
    partial = [p for p in folder.iterdir() if p.name.endswith(TMP)
               and step_of(p.name[: -len(TMP)]) is not None]
    for path in partial:
        shutil.rmtree(path, ignore_errors=True)
    return sorted(p.name for p in partial)


@dataclass(frozen=True)
class Position:
    """Where the data stream stands: the next micro-batch is batch `index` of `epoch`."""

    epoch: int
    index: int


START = Position(0, 0)


@dataclass(frozen=True)
class Done:
    """The work of every part of the run up to the checkpoint (global counts)."""

    steps: int
    samples: int
    tokens: int
    flops: float
    train_time_s: float


@dataclass(frozen=True)
class FileSum:
    """What a checkpoint file held when it was written."""

    bytes: int
    sha256: str


@dataclass(kw_only=True, frozen=True)
class CheckpointMeta:
    """meta.json: everything but the tensors. `step`, `rank_state`, `files` and `format` are set on
    write."""

    config: dict[str, Any]  # the TrainConfig of the part that wrote it, as a dict
    total: int  # the run's optimizer steps
    position: Position
    world_size: int
    global_batch: int
    sync: str  # the sync's label (ddp, local-sgd:8, ...)
    parts: int  # parts of the run so far, this one included
    wall_s: float  # wall time of all parts so far
    stats: Done
    step: int
    rank_state: bool = False  # whether ranks.pt holds some rank's own sync state (format 2 on)
    files: dict[str, FileSum] = field(default_factory=dict)
    format: int = FORMAT
    run_id: str = ""  # the run that wrote it ("" before runs had ids: any run may continue it)
    # the best evaluation so far ({"step", "metrics", "seconds"}): --save-model best
    best: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object, keys in the order cpudist always wrote them."""
        return {"config": self.config, "total": self.total, "position": asdict(self.position),
                "world_size": self.world_size, "global_batch": self.global_batch, "sync": self.sync,
                "parts": self.parts, "wall_s": self.wall_s, "stats": asdict(self.stats),
                "format": self.format, "step": self.step, "rank_state": self.rank_state,
                "files": {name: asdict(f) for name, f in self.files.items()}, "run_id": self.run_id,
                "best": self.best}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> CheckpointMeta:
        """The meta of a checkpoint of this cpudist's format or an older one; BadInput for any
        other."""
        version = data.get("format", 1) if isinstance(data, dict) else None
        if not isinstance(version, int) or version < 1 or "config" not in data:
            raise BadInput(f"checkpoint {where} has a {META} that cpudist did not write",
                           "Pass a checkpoint folder (step-N) that cpudist wrote, or start over "
                           "without --resume")
        if version > FORMAT:
            raise BadInput(f"checkpoint {where} has format {version}, newer than this cpudist's "
                           f"({FORMAT})", FIX)
        if version < OLDEST:
            raise BadInput(f"checkpoint {where} has format {version}, older than this cpudist "
                           f"reads ({OLDEST}: checkpoints read without running pickled code)", FIX)
        try:
            return cls(config=dict(data["config"]), total=int(data["total"]),
                       position=Position(**data["position"]), world_size=int(data["world_size"]),
                       global_batch=int(data["global_batch"]), sync=str(data["sync"]),
                       parts=int(data.get("parts", 1)), wall_s=float(data.get("wall_s", 0.0)),
                       stats=Done(**data["stats"]), step=int(data["step"]),
                       rank_state=bool(data.get("rank_state", False)),
                       files={name: FileSum(**f) for name, f in data.get("files", {}).items()},
                       format=version, run_id=str(data.get("run_id", "")),
                       best=_best(data.get("best")))
        except KeyError as e:
            raise BadInput(f"checkpoint {where} has a {META} of format {version} without "
                           f"{e.args[0]!r}", FIX) from None
        except (TypeError, ValueError, AttributeError) as e:
            raise BadInput(f"checkpoint {where} has a {META} of format {version} that cannot be "
                           f"read ({e})",
                           FIX) from None

    def written(self, files: dict[str, FileSum], rank_state: bool) -> CheckpointMeta:
        """This meta as the writer completes it."""
        return replace(self, files=files, rank_state=rank_state, format=FORMAT)


def raw_meta(path: Path) -> Any:
    """meta.json of the checkpoint folder `path` as JSON (OSError or ValueError when it cannot be
    read)."""
    return json.loads((path / META).read_text())


def read_meta(path: Path) -> CheckpointMeta:
    """The meta of the checkpoint folder `path`: OSError or ValueError when meta.json cannot be read
    (damage), BadInput when it is of a newer or foreign format."""
    return CheckpointMeta.from_dict(raw_meta(path), str(path))


def write_meta(path: Path, meta: CheckpointMeta) -> None:
    """meta.json into the checkpoint folder `path` (still .tmp: the rename makes it visible)."""
    (path / META).write_text(json.dumps(meta.to_dict(), indent=1))


def file_sum(path: Path) -> FileSum:
    """The size and sha256 of a file."""
    with path.open("rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    return FileSum(path.stat().st_size, digest)


def damage(path: Path) -> str | None:
    """What is wrong with a checkpoint folder, or None when every file is as written (BadInput: not
    ours)."""
    try:
        meta = read_meta(path)
    except (OSError, ValueError) as e:
        return f"{META} is unreadable ({e})"
    for name, want in meta.files.items():
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != want.bytes:
            return f"{name} has {f.stat().st_size} bytes, {want.bytes} were written"
        if file_sum(f).sha256 != want.sha256:
            return f"{name} does not match its sha256"
    return None


def owner(path: Path) -> str | None:
    """The id of the run that wrote the checkpoint at `path` ("" before runs had ids; None: meta
    unreadable)."""
    try:
        data = raw_meta(path)
    except (OSError, ValueError):
        return None
    return str(data.get("run_id", "")) if isinstance(data, dict) else None


def _best(data: Any) -> dict[str, Any] | None:
    """The meta's best evaluation; None when absent (older checkpoints) and TypeError when
    malformed."""
    if data is None:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("metrics"), dict):
        raise TypeError(f"best is {data!r}, not an evaluation")
    return {"step": int(data["step"]),
            "metrics": {str(k): float(v) for k, v in data["metrics"].items()},
            "seconds": float(data.get("seconds", 0.0))}


def same_run(found: str | None, run_id: str) -> bool:
    """Whether a checkpoint written by run `found` belongs to run `run_id` (one without an id
    belongs to any)."""
    return found is not None and found in ("", run_id)


def set_aside(folder: Path, step: int, run_id: str, stamp: str) -> Path | None:
    """Move the run's checkpoints newer than `step` (the timeline a resume from `step` abandons)
    into `folder/abandoned-<stamp>/`, never deleting them; the folder they went to, or None when
    there were none."""
    newer = [p for p in complete_checkpoints(folder) if (step_of(p.name) or 0) > step
             and same_run(owner(p), run_id)]
    if not newer:
        return None
    aside = folder / f"abandoned-{stamp}"
    aside.mkdir(parents=True, exist_ok=True)
    for path in newer:
        path.rename(aside / path.name)
    return aside


def choose(folder: Path, say: Callable[[str], None], run_id: str | None = None) -> Path | None:
    """The newest undamaged checkpoint in `folder` (of run `run_id` when given); each damaged newer
    one is named and skipped."""
    skipped: list[str] = []
    for path in complete_checkpoints(folder):
        if run_id is not None and not same_run(owner(path), run_id) and owner(path) is not None:
            continue  # another run's
        problem = damage(path)
        if problem is None:
            if skipped:
                say(f"resuming from {path.name} instead: {'; '.join(skipped)}")
            return path
        skipped.append(f"{path.name} is damaged ({problem})")
    if skipped:
        say(f"no usable checkpoint in {folder}: {'; '.join(skipped)}")
    return None
