"""A user's own training script as a cpudist run (`cpudist launch -- COMMAND ...`): the launchers, run folder,
identity, output, fail-fast and ledger of `cpudist run`, with the user's command in place of the trainer.

    request (run/request.py: launch options, a TrainConfig naming the run) + Script
      -> script_spec: the RunSpec of run/prepare.resolve, its rank program `python -m cpudist.run.script_rank
         --run-dir DIR [--workdir DIR] -- COMMAND` (run/script_rank.py sets torchrun's variables and threads)
      -> plan (launch/kinds.py) -> local.execute (here, a hostfile's nodes from their head)
      -> collect outputs -> script_result.build -> outcome.record (result.json, ledger)
"""

from __future__ import annotations

import dataclasses
import shlex
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cpudist.config import TrainConfig
from cpudist.cpu import read_cpu
from cpudist.errors import BadInput, CpudistError
from cpudist.hostfile import render_hostfile
from cpudist.launch.kinds import plan
from cpudist.launch.spec import SBATCH_FILE, Launch, RunSpec, redacted
from cpudist.results.launched import Launched, write_report
from cpudist.results.schema import RunResult
from cpudist.run import identity, local, runlog
from cpudist.run.claim import COLLECTED, claim
from cpudist.run.outcome import record
from cpudist.run.prepare import check_env, check_ledger, make_output_dir, resolve
from cpudist.run.request import Callbacks, RunRequest, default_output_dir
from cpudist.run.script_rank import per_node_argv
from cpudist.run.script_result import TASK, Ranks, build, read_metrics, script_label
from cpudist.run.start import tracked, where_name
from cpudist.run.where import Where
from cpudist.train.dist import RankInfo
from cpudist.wire import events, programs


@dataclass(frozen=True)
class Script:
    """The user's command and what cpudist does around it."""

    command: tuple[str, ...]
    workdir: str | None = None  # where every rank runs it [default: the current folder]
    metric_file: str | None = None  # JSON rank 0 writes: merged into the run's record (run/script_result.py)
    collect: tuple[str, ...] = ()  # outputs (under workdir) copied into the run folder afterwards
    stage: tuple[str, ...] = ()  # more files/folders put on every node (from a laptop: run/script_remote.py)
    copy_of: str | None = None  # on a node: the staged folder every node copies into workdir before its ranks start
    per_node: int = 0  # --per-node: one torchrun per node with this many workers (0: the launcher starts every rank)

    @property
    def folder(self) -> Path:
        return Path(self.workdir or ".").resolve()


def script_config(script: Script, output_dir: str | None, np_: int) -> TrainConfig:
    """The TrainConfig that names a script run (task `script`, the command as model) and holds its folder."""
    cfg = TrainConfig(task=TASK, output_dir="", model=script_label(script.command))
    return dataclasses.replace(cfg, output_dir=str(output_dir or default_output_dir(cfg, np_)),
                               model=shlex.join(script.command))


def check_script(script: Script) -> None:
    """Refuse, before anything starts, a working folder or a script file that is not there."""
    base = Path(script.copy_of) if script.copy_of else script.folder
    if (script.workdir is not None or script.copy_of) and not base.is_dir():
        raise BadInput(f"--workdir {script.workdir} is not a folder", "Pass the folder the script runs in")
    first = next((w for w in script.command if w.endswith(".py")), None)
    if first is not None and not (base / first).is_file():
        raise BadInput(f"{first}: no such file in {base}",
                       "Give the script's path from the working folder (--workdir, default the current one)")


def rank_program(script: Script, run_dir: Path) -> tuple[str, ...]:
    """What every rank runs after `python -m`: the wrapper, then the user's command."""
    copy: tuple[str, ...] = ("--copy-of", script.copy_of) if script.copy_of else ()
    copy += ("--per-node", str(script.per_node)) if script.per_node else ()
    where = ("--workdir", str(script.folder)) if script.workdir is not None else ()
    return (programs.SCRIPT_RANK, "--run-dir", str(run_dir.resolve()), *copy, *where, "--", *script.command)


def script_spec(request: RunRequest, script: Script, dry_run: bool = False) -> RunSpec:
    """The launch of the script's ranks: the trainer's launcher, nodes and rank variables, the script's program."""
    check_env(request.launch.env)
    check_script(script)
    spec = resolve(request, dry_run=dry_run)
    # the launcher's folder (Hydra starts the ranks in it on every node): a staged copy's source exists on all
    return dataclasses.replace(spec, program=rank_program(script, Path(request.train.output_dir)),
                               cwd=script.copy_of or str(script.folder), own_tags=True)  # run/rank_lines.py


def describe_script(request: RunRequest, script: Script) -> str:
    """What `launch_script` would do, as text (`--dry-run`): nothing is written or started."""
    spec = redacted(script_spec(request, script, dry_run=True))
    launch = plan(spec)
    if launch.script is not None:  # Slurm outside an allocation: the batch script, which srun's ranks run
        return (f"# {Path(request.train.output_dir) / SBATCH_FILE} (written and submitted with `{launch.shell()}`)\n"
                f"{launch.script}")
    lines = [f"# run folder {request.train.output_dir} (run.json, cpudist.log, ranks.log, result.json)",
             f"# every node: one process, starting {script.per_node} worker(s) of `{' '.join(script.command)}` in "
             f"{script.folder} (below)" if script.per_node else
             f"# every rank: torchrun's variables, then `{' '.join(script.command)}` in {script.folder}",
             "# environment of every rank", *(f"export {k}={v}" for k, v in launch.rank_env.items())]
    if spec.hostfile and not launch.per_host:
        lines += [f"# hostfile {spec.hostfile} (written when the run starts)",
                  render_hostfile(spec.hosts[: request.launch.nodes],
                                  "openmpi" if spec.launcher == "openmpi" else "hydra", spec.ppn).rstrip("\n")]
    for i in range(spec.np if script.per_node else 0):  # what the launcher's one process per node starts there
        node = per_node_argv(list(script.command), spec.python, RankInfo(i, spec.np, 0, 1, "node"), script.per_node,
                             launch.rank_env)
        lines.append(f"# node {i} ({spec.hosts[i].name}) runs {shlex.join(node)}")
    if script.metric_file:
        lines.append(f"# then: metrics from {script.folder / script.metric_file}")
    lines += [f"# then: {script.folder / p} -> {Path(request.train.output_dir) / COLLECTED}/" for p in script.collect]
    return "\n".join([*lines, "# command", launch.shell()]) + "\n"


def launch_script(request: RunRequest, script: Script, where: Where, ledger: Path, cb: Callbacks) -> RunResult:
    """Run the script on every rank as a cpudist run (id, run.json, logs, fail-fast) and record it."""
    check_ledger(ledger)
    out = Path(request.train.output_dir)
    make_output_dir(out)
    request = dataclasses.replace(request, train=identity.assign(request.train))
    claim(request.train, request.overwrite, cb.note)  # empty, its own, or told to replace a run
    cb = runlog.tee(cb, out, request.train.run_id)
    request = dataclasses.replace(request, launched=Launched(command=request.command, cluster=where.cluster,
                                                             usd_per_hour=where.usd_per_hour))
    if where.head is not None:
        from cpudist.run.script_remote import run_remote

        head = where.head
        return tracked(request, where_name(request, where), lambda: run_remote(request, script, head, ledger, cb))
    spec = script_spec(request, script)
    launch = plan(spec)
    return tracked(request, where_name(request, where),
                   lambda: record(out, ledger, run_ranks(request, script, (spec, launch), cb)))


def run_ranks(request: RunRequest, script: Script, job: tuple[RunSpec, Launch], cb: Callbacks) -> Launched:
    """Launch the ranks here (or from this head), collect, write the metric file's rank report; what only the
    launching side knows."""
    spec, launch = job
    out = Path(request.train.output_dir)
    seen: dict[int, dict[str, Any]] = {}

    def on_event(event: dict[str, Any]) -> None:
        if events.kind(event) == events.SCRIPT_RANK:  # each rank's host and threads, before its script starts
            seen[int(event["rank"])] = event
        else:
            cb.on_event(event)

    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    began = time.monotonic()
    launched = local.execute(spec, launch, dataclasses.replace(cb, on_event=on_event), request.launch.timeout_s,
                             request.launched)
    wall = time.monotonic() - began
    collect(script, out, cb.note)
    given = given_metrics(script, cb.note)
    each = script.per_node or 1  # --per-node: every event is a node's torchrun, for `each` ranks
    ranks = Ranks(script.command, spec.np * each, spec.ppn * each,
                  tuple(str(seen[r]["host"]) for r in sorted(seen) for _ in range(each)),
                  tuple(int(seen[r]["threads"]) for r in sorted(seen) for _ in range(each)), wall, started_at,
                  request.train.run_id, str(out.resolve()))
    result = build(ranks, given, read_cpu().summary(), {"launcher": spec.launcher})
    write_report(out, result)
    return launched


def given_metrics(script: Script, note: Callable[[str], None]) -> dict[str, Any]:
    """The metric file's contents; a missing or unreadable one is a note (the run itself went well)."""
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
