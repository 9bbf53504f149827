"""A user's own training script as a cpudist run (`cpudist launch -- COMMAND ...`): the launchers,
run folder, identity, output, fail-fast and ledger of `cpudist run`, with the user's command in
place of the trainer.

    request (run/request.py: launch options, a TrainConfig naming the run, the Script payload)
      -> run/start.py
      -> script_spec: the RunSpec of run/prepare.resolve, its rank program
         `python -m cpudist.run.script_rank --run-dir DIR [--workdir DIR] -- COMMAND`
         (run/script_rank.py sets torchrun's variables and threads)
      -> plan (launch/kinds.py)
      -> run_ranks: local.execute (here, a hostfile's nodes from their head)
      -> collect outputs -> script_result.build -> the rank report
      -> outcome.record (result.json, ledger)
"""

from __future__ import annotations

import dataclasses
import shlex
import shutil
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cpudist.config import TrainConfig
from cpudist.cpu import read_cpu
from cpudist.errors import BadInput, CpudistError
from cpudist.launch.spec import Launch, RunSpec
from cpudist.results.launched import Launched, write_report
from cpudist.run import local
from cpudist.run.claim import COLLECTED
from cpudist.run.prepare import check_env, resolve
from cpudist.run.request import Callbacks, RunRequest, default_output_dir
from cpudist.run.script_rank import per_node_argv
from cpudist.run.script_result import TASK, Ranks, build, read_metrics, script_label
from cpudist.train.dist import RankInfo
from cpudist.wire import events
from cpudist.wire.payload import Script


def script_config(script: Script, output_dir: str | None, np_: int) -> TrainConfig:
    """The TrainConfig that names a script run (task `script`, the command as model) and holds its
    folder."""
    cfg = TrainConfig(task=TASK, output_dir="", model=script_label(script.command))
    return dataclasses.replace(cfg, output_dir=str(output_dir or default_output_dir(cfg, np_)),
                               model=shlex.join(script.command))


def check_script(script: Script) -> None:
    """Refuse, before anything starts, a working folder or a script file that is not there."""
    base = Path(script.copy_of) if script.copy_of else script.folder
    if (script.workdir is not None or script.copy_of) and not base.is_dir():
        raise BadInput(f"--workdir {script.workdir} is not a folder",
                       "Pass the folder the script runs in")
    first = next((w for w in script.command if w.endswith(".py")), None)
    if first is not None and not (base / first).is_file():
        raise BadInput(f"{first}: no such file in {base}",
                       "Give the script's path from the working folder (--workdir, default the "
                       "current one)")


def script_spec(request: RunRequest, script: Script, dry_run: bool = False) -> RunSpec:
    """The launch of the script's ranks: the trainer's launcher, nodes and rank variables, the
    script's program."""
    check_env(request.launch.env)
    check_script(script)
    spec = resolve(request, dry_run=dry_run)
    # the launcher's folder (Hydra starts the ranks in it on every node): a staged copy's source
    # exists on all
    return dataclasses.replace(spec, program=script.program(request.train.output_dir),
                               # run/rank_lines.py
                               cwd=script.copy_of or str(script.folder), own_tags=True)


def plan_lines(request: RunRequest, script: Script, spec: RunSpec,
               launch: Launch) -> tuple[list[str], list[str]]:
    """A script run's own --dry-run lines: before the ranks' environment, and after the hostfile."""
    first = [f"# run folder {request.train.output_dir} (run.json, cpudist.log, ranks.log, "
             "result.json)",
             f"# every node: one process, starting {script.per_node} worker(s) of "
             f"`{' '.join(script.command)}` in {script.folder} (below)" if script.per_node else
             f"# every rank: torchrun's variables, then `{' '.join(script.command)}` in "
             f"{script.folder}"]
    then = []
    # what the launcher's one process per node starts there
    for i in range(spec.np if script.per_node else 0):
        node = per_node_argv(list(script.command), spec.python, RankInfo(i, spec.np, 0, 1, "node"),
                             script.per_node, launch.rank_env)
        then.append(f"# node {i} ({spec.hosts[i].name}) runs {shlex.join(node)}")
    if script.metric_file:
        then.append(f"# then: metrics from {script.folder / script.metric_file}")
    then += [f"# then: {script.folder / p} -> {Path(request.train.output_dir) / COLLECTED}/"
             for p in script.collect]
    return first, then


def run_ranks(request: RunRequest, script: Script, job: tuple[RunSpec, Launch],
              cb: Callbacks) -> Launched:
    """Launch the ranks here (or from this head), collect, write the metric file's rank report; what
    only the launching side knows."""
    spec, launch = job
    out = Path(request.train.output_dir)
    seen: dict[int, dict[str, Any]] = {}

    def on_event(event: dict[str, Any]) -> None:
        # each rank's host and threads, before its script starts
        if events.kind(event) == events.SCRIPT_RANK:
            seen[int(event["rank"])] = event
        else:
            cb.on_event(event)

    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    began = time.monotonic()
    launched = local.execute(spec, launch, dataclasses.replace(cb, on_event=on_event),
                             request.launch.timeout_s, request.launched)
    wall = time.monotonic() - began
    collect(script, out, cb.note)
    given = given_metrics(script, cb.note)
    each = script.per_node or 1  # --per-node: every event is a node's torchrun, for `each` ranks
    ranks = Ranks(command=script.command, world_size=spec.np * each, ppn=spec.ppn * each,
                  rank_hosts=tuple(str(seen[r]["host"]) for r in sorted(seen) for _ in range(each)),
                  rank_threads=tuple(int(seen[r]["threads"]) for r in sorted(seen)
                                     for _ in range(each)), wall_time_s=wall,
                  started_at=started_at, run_id=request.train.run_id, run_dir=str(out.resolve()))
    result = build(ranks, given, read_cpu().summary(), {"launcher": spec.launcher})
    write_report(out, result)
    return launched


def given_metrics(script: Script, note: Callable[[str], None]) -> dict[str, Any]:
    """The metric file's contents; a missing or unreadable one is a note (the run itself went
    well)."""
    if script.metric_file is None:
        return {}
    try:
        return read_metrics(script.folder / script.metric_file)
    except CpudistError as e:
        note(f"{e.message}: the run is recorded without its metrics")
        return {}


def collect(script: Script, out: Path, note: Callable[[str], None]) -> None:
    """Copy each --collect path (under the working folder) into <run folder>/collected/."""
    for path in script.collect:
        src = script.folder / path
        dst = out / COLLECTED / Path(path).name
        if not src.exists():
            note(f"--collect {path}: {src} does not exist after the run; nothing copied")
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, dirs_exist_ok=True)
        else:
            shutil.copy2(src, dst)
        note(f"collected {src} -> {dst}")
