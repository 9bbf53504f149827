"""`cpudist launch [options] -- COMMAND ARGS...`: a user's own training script on --np ranks, as a
cpudist run.

    # this machine, like torchrun's form
    cpudist launch --np 2 train.py --epochs 1
    # a hostfile's nodes, from the head
    cpudist launch --np 4 --ppn 1 --hostfile hosts -- python train.py
    # from a laptop: staged, brought home
    cpudist launch --np 4 --ppn 1 --cluster c --collect out -- python train.py
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from cpudist import state
from cpudist.cli.batch_options import batch_sections
from cpudist.cli.launch_options import launch_options, route_options, to_launch, to_route
from cpudist.cli.options import SectionedCommand, output_options
from cpudist.cli.overwrite_option import overwrite_option
from cpudist.errors import BadInput, CpudistError, JobFailed
from cpudist.interrupts import signals_interrupt
from cpudist.launch.env import redact_env_args
from cpudist.results.schema import RunResult
from cpudist.wire import names

if TYPE_CHECKING:
    from cpudist.run.request import RunRequest
    from cpudist.run.where import Where


class _Counts(click.ParamType):
    """Node counts: 1,2,4."""

    name = "N,N,..."

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> tuple[int, ...]:
        from cpudist.run.sweep import parse_counts

        return value if isinstance(value, tuple) else parse_counts(str(value))


def summary(r: RunResult) -> str:
    """The final line: ranks, nodes, time, what the script handed back."""
    metrics = " ".join(f"{k}={v:.4f}" for k, v in r.metrics.items()) or "no metrics"
    speed = f", {r.train_samples_per_s:.1f} samples/s" if r.train_samples_per_s else ""
    return (f"done: {r.model} on {r.world_size} rank(s), {len(r.nodes)} node(s), "
            f"{r.threads_per_rank} thread(s) each: wall {r.wall_time_s:.1f}s{speed}, {metrics}  "
            f"-> {r.run_dir}/{names.RESULT}")


SECTIONS = {
    "Where and how many ranks": ("np_", "ppn", "nodes", "hostfile", "launcher", "oversubscribe",
                                 "per_node"),
    "From outside the cluster (AWS cluster or on-prem head)": (
        "cluster_name", "head_addr", "user", "identity", "remote_python", "stage_code", "stage"),
    "The script": ("workdir", "metric_file", "collect"),
    "Launch": ("mpirun", "ssh", "iface", "allocator", "openmp", "env_pairs", "secret_names",
               "env_files", "timeout"),
    **batch_sections(trainer=False),
    "Output": ("output_dir", "overwrite_output_dir", "sweep", "ledger", "fmt", "quiet", "dry_run"),
}


@click.command(cls=SectionedCommand, sections=SECTIONS,
               context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@launch_options
@click.option("--per-node", is_flag=True,
              help="One process per node, `python -m torch.distributed.run` (torchrun) "
              "with --ppn workers of the script, for scripts that expect to be started that way; "
              "with a command `accelerate launch [its options] train.py`, accelerate launch per "
              "node, its --num_machines, --machine_rank, --main_process_ip/port and "
              "--num_processes set by cpudist.")
@route_options
@click.option("--stage", multiple=True,
              help="With --cluster/--head: a file or folder (relative to --workdir) put "
              "on every node too; the command's words naming it become its path there "
              "(repeatable).")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path),
              help="Folder every rank runs the command in [default: the current one]; with "
                   "--cluster/--head it "
              "is staged on the nodes.")
@click.option("--metric-file",
              help="JSON object the script writes (rank 0; relative to --workdir; the run folder "
              "is $CPUDIST_RUN_DIR): numbers merged into result.json and the ledger "
              "(train_samples, or HF Trainer's all_results.json, give `report` its samples/s).")
@click.option("--collect", multiple=True,
              help="Output (relative to --workdir) copied into <run folder>/collected/ "
              "after the run (repeatable).")
@click.option("--output-dir", type=click.Path(path_type=Path),
              help="Run folder [default: runs/script-<name>-...].")
@overwrite_option
@click.option("--ledger", type=click.Path(path_type=Path),
              help="Results ledger [default: ~/.cpudist/results.jsonl].")
@click.option("--dry-run", is_flag=True,
              help="Print the command and every rank variable; run nothing.")
@click.option("--sweep", type=_Counts(),
              help="Node counts to run in turn (1,2,4; --ppn per node), then the speedup "
              "report of these runs, as `cpudist sweep` for the trainer [folders: "
              "<--output-dir>/nodesN].")
@output_options()
@click.option("--quiet", is_flag=True,
              help="Only errors and the final line (rank output: ranks.log).")
@click.pass_context
def launch(ctx: click.Context, command: tuple[str, ...], **opts: Any) -> None:
    """Run COMMAND (your torch.distributed, HF Trainer or Accelerate script) on --np ranks, as
    torchrun would.

    Every rank gets torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
    GROUP_RANK, MASTER_ADDR, MASTER_PORT: what Accelerate and HF Trainer read too) and its share of
    the node's cores as OMP_NUM_THREADS; the run gets an id, a run folder, `cpudist logs`/`stop`,
    and a ledger entry for `report`.

    Example: cpudist launch --np 2 train.py --epochs 1
    """
    command = command[1:] if command[:1] == ("--",) else command
    # an option cpudist lacks would start the command on every rank
    if command[:1] and command[0].startswith("-"):
        raise BadInput(f"{command[0]}: not an option of cpudist launch" + (
            " (not yet: keep the launching shell open, e.g. in tmux)" if command[0] == "--detach"
            else ""),
            "`cpudist launch --help` lists them; the command comes after them, or after --")
    if not command:
        raise BadInput("no command to launch",
                       "Give it after --: cpudist launch --np 2 -- python train.py")
    np_given = ctx.get_parameter_source("np_") is not ParameterSource.DEFAULT
    with signals_interrupt():
        if opts["sweep"]:
            _sweep(command, opts, np_given)
            return
        request, where = _request(command, opts, np_given, opts["nodes"], opts["output_dir"])
        if opts["dry_run"]:
            click.echo(_describe(request, where), nl=False)
            return
        result = _launch_one(request, where, opts)
    click.echo(json.dumps(result.to_dict(), indent=2) if opts["fmt"] == "json" else summary(result))


def _request(command: tuple[str, ...], opts: dict[str, Any], np_given: bool, nodes: int | None,
             output_dir: Path | None) -> tuple[RunRequest, Where]:
    """The options as one run's request (the script its payload) and route (a sweep's run: its node
    count and folder)."""
    from cpudist.cpu import read_cpu
    from cpudist.run.request import Layout, RunRequest, resolve_layout
    from cpudist.run.script import script_config
    from cpudist.run.where import where_for
    from cpudist.wire.payload import Script

    route = to_route(opts)
    remote = route.cluster is not None or route.head_addr is not None
    given = Layout(opts["np_"], opts["ppn"], nodes, np_given)
    np_, ppn = resolve_layout(given, remote, lambda: read_cpu().physical_cores, _say)
    if opts["hostfile"] is not None and ppn is None:
        raise BadInput("--hostfile needs --ppn (ranks per node)",
                       "e.g. --np 4 --ppn 1 for one rank on 4 nodes")
    if opts["stage"] and not remote:
        raise BadInput("--stage puts files on the nodes from outside the cluster (--cluster or "
                       "--head)",
                       "Here or from the head, give the path itself (the nodes must see it: NFS, "
                       "or a copy)")
    _check_accelerate(command, opts["per_node"])
    # the launcher starts one torchrun per node instead
    per_node = (ppn or np_) if opts["per_node"] else 0
    script = Script(command=command, workdir=str(opts["workdir"]) if opts["workdir"] else None,
                    metric_file=opts["metric_file"],
                    collect=tuple(opts["collect"]), stage=tuple(opts["stage"]), per_node=per_node)
    # processes the launcher starts
    launched, each = (np_ // per_node, 1) if per_node else (np_, ppn or np_)
    launch_opts = to_launch(opts, launched, each)
    cfg = script_config(script, str(output_dir) if output_dir else None, np_)
    where = where_for(route, launch_opts.nodes, ppn is not None, launch_opts.launcher)
    command_line = shlex.join(["cpudist", *redact_env_args(sys.argv[1:])])
    return (RunRequest(train=cfg, launch=launch_opts, nodes=where.nodes, command=command_line,
                       overwrite=opts["overwrite_output_dir"], payload=script), where)


def _check_accelerate(command: tuple[str, ...], per_node: bool) -> None:
    """`accelerate launch` starts a node's processes itself: once per node (--per-node), with
    cpudist's layout."""
    from cpudist.run.script_rank import accelerate_words, check_accelerate

    if accelerate_words(command) is None:
        return
    if not per_node:
        raise BadInput(
            "`accelerate launch` starts a node's processes itself: it runs once per node",
            "Add --per-node: cpudist launch --np 4 --ppn 2 --per-node -- accelerate "
            "launch train.py")
    check_accelerate(command)


def _describe(request: RunRequest, where: Where) -> str:
    from cpudist.run.start import describe

    return describe(request, where)


def _launch_one(request: RunRequest, where: Where, opts: dict[str, Any]) -> RunResult:
    from cpudist.cli.progress import JobView
    from cpudist.run.request import Callbacks
    from cpudist.run.start import start

    view = JobView(quiet=opts["quiet"])
    cb = Callbacks(view.on_event, view.on_line, (lambda line: None) if opts["quiet"] else _say)
    try:
        result = start(request, where, opts["ledger"] or state.ledger_path(), cb)
        assert result is not None  # `cpudist launch` has no --detach
        return result
    except JobFailed:
        view.show_held()  # --quiet: the rank lines the error points at
        raise
    finally:
        view.close()


def _sweep(command: tuple[str, ...], opts: dict[str, Any], np_given: bool) -> None:
    """--sweep 1,2,4: the launch on each node count in turn (run folders nodes1, nodes2, ... of one
    sweep folder), then the speedup report of exactly these runs, as `cpudist sweep` does for the
    trainer."""
    from cpudist.cli.report import show_report
    from cpudist.run.script_result import TASK, script_label
    from cpudist.run.sweep import check_series, default_sweep_dir, run_dirs, series_hosts

    counts = opts["sweep"]
    if np_given or opts["nodes"] is not None:
        raise BadInput(
            "--sweep sets the node count of each run: --np and --nodes do not go with it",
            "Give --ppn (ranks per node) and --sweep 1,2,4")
    check_series(counts, opts["ppn"],
                 series_hosts(opts["hostfile"], opts["cluster_name"], opts["launcher"]))
    dirs = run_dirs(opts["output_dir"] or default_sweep_dir(TASK, script_label(command)), counts)
    done: list[RunResult] = []
    for i, n in enumerate(counts, 1):
        request, where = _request(command, opts, False, n, dirs[n])
        say = f"sweep {i}/{len(counts)}: {n} node(s), --ppn {request.launch.ppn} -> {dirs[n]}"
        if opts["dry_run"]:
            click.echo(f"# {say}\n{_describe(request, where)}", nl=False)
            continue
        _say(say)
        try:
            done.append(_launch_one(request, where, opts))
        except CpudistError as e:
            if done:
                show_report(done, "json" if opts["fmt"] == "json" else "table", None)
            raise type(e)(f"sweep stopped: the run on {n} node(s) failed: {e.message}") from e
        _say(summary(done[-1]))
    if done:
        show_report(done, "json" if opts["fmt"] == "json" else "table", None)


def _say(line: str) -> None:
    click.echo(f"[cpudist] {line}", err=True)
