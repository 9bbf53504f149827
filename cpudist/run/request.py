"""One run as the user asked for it: what to train and how to launch it. The same request crosses
SSH to the head.

    cpudist run (options) -> RunRequest -> run.start.start() -> RunSpec (run.prepare)
      -> Launch (launch.kinds)
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from cpudist.config import TrainConfig, effective_lr, lr_scaling_on
from cpudist.errors import BadInput
from cpudist.hostfile import Nodes
from cpudist.launch.batch import BatchOptions
from cpudist.launch.spec import LaunchOptions
from cpudist.results.launched import Launched
from cpudist.strategies import SyncSpec
from cpudist.wire import names, payload, stop_marker
from cpudist.wire.payload import Payload, Trainer


@dataclass(kw_only=True, frozen=True)
class RunRequest:
    """A run: its config (the trainer's; for another payload, the run folder and name), the launch,
    the nodes (head first, as read from a hostfile once) or None for this machine, and what the
    ranks run (wire/payload.py).

    Every path in it is a path on the machine that launches the ranks.
    """

    train: TrainConfig
    launch: LaunchOptions
    nodes: Nodes | None = None
    command: str = ""  # the `cpudist run` command line as typed (the model card shows it)
    overwrite: bool = False  # --overwrite-output-dir: in an earlier run's place (run/claim.py)
    # what only the launching side knows (run/start.py)
    launched: Launched = field(default_factory=Launched)
    payload: Payload = field(default_factory=Trainer)

    def to_json(self) -> str:
        return json.dumps({**dataclasses.asdict(self), "payload": payload.to_dict(self.payload)})

    @classmethod
    def from_json(cls, text: str) -> RunRequest:
        data = json.loads(text)
        train = data.pop("train")
        # JSON has lists only: every tuple field (--text-columns,
        for f in dataclasses.fields(TrainConfig):
            # --report-to, --lora-targets ...) back to a tuple
            if isinstance(f.default, tuple) and f.name in train:
                train[f.name] = tuple(train[f.name])
        launch = data.pop("launch")
        launch["env"] = tuple(tuple(p) for p in launch.get("env", ()))
        launch["secrets"] = tuple(tuple(p) for p in launch.get("secrets", ()))
        if launch.get("batch") is not None:
            batch = launch["batch"]
            launch["batch"] = BatchOptions(**{**batch,
                                              "sbatch_args": tuple(batch.get("sbatch_args", ()))})
        launched = Launched.from_dict(data.pop("launched", {}))
        ranks_run = payload.from_dict(data.pop("payload", {}))
        listed = data.pop("nodes", None)
        train["sync"] = SyncSpec(**train.get("sync", {}))
        return cls(train=TrainConfig(**train), launch=LaunchOptions(**launch), launched=launched,
                   payload=ranks_run, nodes=Nodes.from_dict(listed) if listed else None, **data)

    def with_train(self, **changes: Any) -> RunRequest:
        return dataclasses.replace(self, train=dataclasses.replace(self.train, **changes))

    def shown(self) -> RunRequest:
        """The request as it may be shown or kept: --env values (but the thread counts) and secrets
        as ***."""
        return dataclasses.replace(self, launch=self.launch.shown())


@dataclass(frozen=True)
class Callbacks:
    """Where a running job reports: events (progress) and rank output lines."""

    on_event: Callable[[dict[str, Any]], None]
    on_line: Callable[[str], None]
    # cpudist's own advice before the ranks start (not under --quiet)
    note: Callable[[str], None] = lambda line: None


def default_output_dir(cfg: TrainConfig, np: int) -> str:
    """runs/<task>-<model>-np<N>-<time>: one folder per run, never overwritten."""
    model = Path(cfg.model).name or cfg.model.replace("/", "-")
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    return str(Path("runs") / f"{cfg.task}-{model}-np{np}-{stamp}")


def unfinished_run(cfg: TrainConfig) -> Path | None:
    """The newest run folder of this task and model that stopped before its result (for --resume
    auto)."""
    model = Path(cfg.model).name or cfg.model.replace("/", "-")
    found = [p for p in Path("runs").glob(f"{cfg.task}-{model}-np*-*")
             if not (p / names.RESULT).exists()
             and (stop_marker.exists(p) or any(p.glob(f"{names.CHECKPOINTS}/step-*")))]
    return max(found, key=lambda p: p.stat().st_mtime, default=None)


@dataclass(frozen=True)
class Layout:
    """The rank counts as given: --np (and whether it was given), --ppn (a count, `auto`, or none),
    --nodes."""

    np: int
    ppn: int | str | None
    nodes: int | None
    np_given: bool


def resolve_layout(given: Layout, remote: bool, physical_cores: Callable[[], int],
                   say: Callable[[str], None]) -> tuple[int, int | None]:
    """(--np, --ppn) once `--ppn auto` and `--nodes` are worked out."""
    from cpudist.launch.env import auto_ppn, threads_per_rank

    np_, ppn, nodes = given.np, given.ppn, given.nodes
    if ppn == "auto":
        if remote:
            raise BadInput("--ppn auto reads the cores of the machine it runs on, and the nodes "
                           "are elsewhere",
                           "Give --ppn N (ranks per node), or run from the head node")
        cores = physical_cores()
        ppn = auto_ppn(cores)
        say(f"--ppn auto: {ppn} rank(s) per node x {threads_per_rank(cores, ppn)} thread(s) "
            f"({cores} physical cores)")
        if not given.np_given and nodes is None:
            nodes = 1
    if nodes is not None:
        if given.np_given and np_ != nodes * int(ppn or 1):
            raise BadInput(f"--np {np_} disagrees with --nodes {nodes} x --ppn {ppn or 1}",
                           "Give --nodes with --ppn (the rank count follows), or --np alone")
        np_ = nodes * int(ppn or 1)
        ppn = int(ppn or 1)
    return np_, None if ppn is None else int(ppn)


def lr_note(cfg: TrainConfig, np_: int, ranks_run: Payload | None = None) -> str | None:
    """Before a multi-rank run of the trainer: what the global batch did to the learning rate
    (--lr-scaling, auto by default). A script's learning rate is its own."""
    if np_ < 2 or not isinstance(ranks_run or Trainer(), Trainer):
        return None
    batch = cfg.batch_size * cfg.grad_accum
    grew = f"{np_} ranks x batch {batch} = global batch {np_ * batch}"
    scaling = lr_scaling_on(cfg, np_)
    if scaling == "none":
        if cfg.task == "synthetic":
            return None
        return (f"{grew}: 1/{np_} of one rank's optimizer steps per epoch at the same --lr "
                f"{cfg.lr:g}, which can "
                "cost accuracy: --lr-scaling auto scales the lr with the batch")
    how = f"x {np_}" if scaling == "linear" else f"x sqrt({np_})"
    lora = "for LoRA " if cfg.peft == "lora" else ""
    chose = f"auto: {scaling} {lora}on more than one rank" if cfg.lr_scaling == "auto" else scaling
    kept = "; a resume on another rank count keeps its checkpoint's lr" if cfg.resume else ""
    return (f"{grew}: lr {cfg.lr:g} {how} = {effective_lr(cfg, np_):g} (--lr-scaling {chose}; "
            f"--lr-scaling none keeps {cfg.lr:g}){kept}")
