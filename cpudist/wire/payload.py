"""What the ranks run, as a field of the run's request: cpudist's trainer, a user's script, or the
links probe.

One start (run/start.py), one agent on a head (run/agent.py) and one remote route (run/remote.py)
serve every payload; each payload says which module its ranks run (`program`) and the request
carries it across SSH (`to_dict`/`from_dict`). What a payload stages and how its result is read live
with the route (run/payloads.py), so this leaf stays data.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from cpudist.wire import programs


@dataclass(frozen=True)
class Trainer:
    """cpudist's trainer: `python -m cpudist.rank` with the request's TrainConfig."""

    KIND: ClassVar[str] = "trainer"

    def program(self, run_dir: str) -> tuple[str, ...]:
        # the launch's default: the rank module with the config's argv (launch/spec.rank_module)
        return ()


@dataclass(kw_only=True, frozen=True)
class Script:
    """A user's command (`cpudist launch -- COMMAND`) and what cpudist does around it."""

    KIND: ClassVar[str] = "script"

    command: tuple[str, ...]
    workdir: str | None = None  # where every rank runs it [default: the current folder]
    # JSON rank 0 writes: merged into the run's record (run/script_result.py)
    metric_file: str | None = None
    collect: tuple[str, ...] = ()  # outputs (under workdir) copied into the run folder afterwards
    # more files/folders put on every node (from a laptop: run/script_remote.py)
    stage: tuple[str, ...] = ()
    # on a node: the staged folder every node copies into workdir before its ranks start
    copy_of: str | None = None
    # --per-node: one torchrun per node with this many workers (0: the launcher starts every rank)
    per_node: int = 0

    @property
    def folder(self) -> Path:
        return Path(self.workdir or ".").resolve()

    def program(self, run_dir: str) -> tuple[str, ...]:
        """What every rank runs after `python -m`: the wrapper (run/script_rank.py), then the user's
        command."""
        copy: tuple[str, ...] = ("--copy-of", self.copy_of) if self.copy_of else ()
        copy += ("--per-node", str(self.per_node)) if self.per_node else ()
        where = ("--workdir", str(self.folder)) if self.workdir is not None else ()
        return (programs.SCRIPT_RANK, "--run-dir", str(Path(run_dir).resolve()), *copy, *where,
                "--", *self.command)


@dataclass(frozen=True)
class Probe:
    """`cpudist hosts bench`: an all-reduce of each size, timed (hosts/bench_rank.py)."""

    KIND: ClassVar[str] = "probe"

    sizes: tuple[int, ...]
    iters: int = 10
    warmup: int = 2
    dist_timeout_s: int = 120

    def program(self, run_dir: str) -> tuple[str, ...]:
        return (programs.BENCH_RANK, "--sizes", ",".join(map(str, self.sizes)), "--iters",
                str(self.iters),
                "--warmup", str(self.warmup), "--timeout", str(self.dist_timeout_s))


Payload = Trainer | Script | Probe
_KINDS: dict[str, type[Trainer] | type[Script] | type[Probe]] = {
    c.KIND: c for c in (Trainer, Script, Probe)}


def to_dict(payload: Payload) -> dict[str, Any]:
    return {"kind": payload.KIND, **dataclasses.asdict(payload)}


def from_dict(data: dict[str, Any]) -> Payload:
    """The payload of a request read from JSON (lists back to tuples)."""
    given = dict(data)
    cls = _KINDS.get(str(given.pop("kind", Trainer.KIND)))
    if cls is None:
        raise ValueError(f"unknown payload kind {data.get('kind')!r}")
    fields = {f.name for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in given.items()
                              if k in fields}
    return cls(**values)
