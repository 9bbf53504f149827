"""`cpudist`: the entry point and its command groups."""

from __future__ import annotations

import traceback
from typing import Any

import click

from cpudist import __version__
from cpudist.cli.ami import ami
from cpudist.cli.cluster import cluster
from cpudist.cli.hosts import hosts
from cpudist.cli.plan import plan
from cpudist.cli.report import report
from cpudist.cli.run import run
from cpudist.cli.sweep import sweep
from cpudist.errors import BadInput, CpudistError


class Root(click.Group):
    """Every error is one line: ours (with a traceback first under --debug) and click's own bad-option ones."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CpudistError:
            if ctx.params.get("debug"):
                traceback.print_exc()
            raise
        except click.UsageError as e:
            where = e.ctx.command_path if e.ctx is not None else ctx.command_path
            text = e.format_message().rstrip(".")
            raise BadInput(f"{text}{'' if text.endswith('?') else '.'} See '{where} --help'") from e


@click.group(cls=Root)
@click.version_option(__version__, prog_name="cpudist")
@click.option("--debug", is_flag=True, help="Show tracebacks with errors.")
def cli(debug: bool) -> None:
    """Data-parallel fine-tuning of transformers on clusters of CPU servers."""


cli.add_command(run)
cli.add_command(report)
cli.add_command(plan)
cli.add_command(sweep)
cli.add_command(hosts)
cli.add_command(cluster)
cli.add_command(ami)


def main() -> None:
    cli(auto_envvar_prefix="CPUDIST")
