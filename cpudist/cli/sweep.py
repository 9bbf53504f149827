"""`cpudist sweep TASK --nodes 1,2,4`: the same run at each node count, then its speedup report."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from cpudist.cli.options import SectionedCommand
from cpudist.cli.report import format_option, plot_option, show_report
from cpudist.cli.run import run
from cpudist.cli.run_sections import SECTIONS
from cpudist.errors import BadInput, CpudistError, JobFailed, Preempted
from cpudist.results.ledger import read_result
from cpudist.results.schema import RunResult
from cpudist.run.sweep import check_series, default_sweep_dir, parse_counts, run_dirs, series_hosts
from cpudist.wire import names

# run's options that a series sets itself for each count, and as what run sees them: --np left to
# follow --nodes x --ppn (run's own rule, --ppn auto included); --output-dir of the sweep holds the
# runs'
SET_PER_RUN = {"np_": ParameterSource.DEFAULT, "nodes": ParameterSource.COMMANDLINE,
               "output_dir": ParameterSource.COMMANDLINE, "fmt": ParameterSource.DEFAULT}


class _Counts(click.ParamType):
    """Node counts: 1,2,4."""

    name = "N,N,..."

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> tuple[int, ...]:
        return value if isinstance(value, tuple) else parse_counts(str(value))


def _invoke_run(ctx: click.Context, opts: dict[str, Any], per_run: dict[str, Any]) -> None:
    """run's own code, in a context that knows which options the user gave (run reads that, as for
    --np)."""
    sub = click.Context(run, info_name=run.name, parent=ctx)
    values = dict(opts)
    for p in run.params:
        assert p.name is not None
        source = SET_PER_RUN.get(p.name) or ctx.get_parameter_source(
            p.name) or ParameterSource.DEFAULT
        sub.set_parameter_source(p.name, source)
        if p.name in SET_PER_RUN:
            values[p.name] = (per_run[p.name] if p.name in per_run
                              else p.type_cast_value(sub, p.get_default(sub)))
    sub.params.update(values)
    sub.invoke(run.callback, **values)  # type: ignore[arg-type]  # run always has its callback


def _same_kind(e: CpudistError) -> type[CpudistError]:
    """The error class that exits as `e` does (the series ends with its failed run's exit code)."""
    return next((c for c in (BadInput, Preempted, JobFailed) if c.exit_code == e.exit_code),
                JobFailed)


@click.command(cls=SectionedCommand, params=[p for p in run.params if p.name not in SET_PER_RUN],
               sections={"Sweep": ("counts", "output_dir", "fmt", "plot"), **SECTIONS})
@click.option("--nodes", "counts", type=_Counts(), required=True,
              help="Node counts to run, e.g. 1,2,4 (smallest first: the baseline of the others).")
@click.option("--output-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Folder of this sweep's run folders (nodes1, nodes2, ...) [default: "
                   "runs/<task>-<model>-sweep-...].")
@format_option
@plot_option
@click.pass_context
def sweep(ctx: click.Context, counts: tuple[int, ...], output_dir: Path | None, fmt: str,
          plot: Path | None, **opts: Any) -> None:
    """Run TASK on each node count in turn, then print the speedup report of exactly these runs.

    Every option of `cpudist run` applies to each run (--ppn is per node; --np follows). Each run
    gets its own folder and goes to the ledger as usual. A failed run stops the series; the report
    still shows the runs that finished.

    Example: cpudist sweep mrpc --nodes 1,2,4 --ppn 1 --hostfile hosts --data-dir glue/MRPC --model
    tiny

    Your own training script instead of TASK: cpudist launch --sweep 1,2,4 --ppn 1 --cluster c --
    train.py
    """
    check_series(counts, opts["ppn"],
                 series_hosts(opts["hostfile"], opts["cluster_name"], opts["launcher"]))
    if counts[0] != 1:
        click.echo(f"[cpudist] no 1-node run in --nodes: speedup is against {counts[0]} nodes",
                   err=True)
    dirs = run_dirs(output_dir or default_sweep_dir(opts["task"], opts["model"]), counts)
    dry_run = opts["dry_run"]
    done: list[RunResult] = []
    for i, n in enumerate(counts, 1):
        say = f"sweep {i}/{len(counts)}: {n} node(s), --ppn {opts['ppn'] or 1} -> {dirs[n]}"
        click.echo(f"# {say}" if dry_run else f"[cpudist] {say}", err=not dry_run)
        # in a series each run's summary is progress (stderr); stdout keeps the report (or, dry, the
        # commands)
        quiet_stdout = contextlib.nullcontext() if dry_run else contextlib.redirect_stdout(
            sys.stderr)
        try:
            with quiet_stdout:
                _invoke_run(ctx, opts, {"nodes": n, "output_dir": dirs[n]})
        except CpudistError as e:
            if done:
                show_report(done, fmt, plot)
            raise _same_kind(e)(f"sweep stopped: the run on {n} node(s) failed: {e.message}") from e
        if not dry_run:
            done.append(read_result(dirs[n] / names.RESULT))
    if done:
        show_report(done, fmt, plot)

