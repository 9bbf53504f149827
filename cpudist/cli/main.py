"""`cpudist`: the entry point and its command groups.

Commands are imported when they are used, not when `cpudist` starts: `cpudist --help` and shell
completion stay fast because nothing imports torch, boto3 or paramiko until a command needs them.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from typing import Any

import click
from click.shell_completion import CompletionItem

from cpudist import __version__
from cpudist.cli.defaults import apply_user_defaults, user_defaults
from cpudist.errors import BadInput, CpudistError

# name -> (module, attribute, one-line help shown by `cpudist --help` without importing the module)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "run": ("cpudist.cli.run", "run", "Fine-tune on TASK with --np ranks, here or on a cluster."),
    "launch": ("cpudist.cli.launch", "launch",
               "Your own training script on --np ranks, as a cpudist run."),
    "sweep": ("cpudist.cli.sweep", "sweep",
              "The same run at each node count, then its speedup report."),
    "predict": ("cpudist.cli.predict", "predict",
                "Predictions of a trained model on a file or a GLUE split."),
    "runs": ("cpudist.cli.runs", "runs",
             "Every run with its id, state, start, duration and metric."),
    "logs": ("cpudist.cli.logs", "logs", "A run's output so far, or followed (-f) until it ends."),
    "stop": ("cpudist.cli.stop", "stop",
             "Stop a running run from another shell (it checkpoints first)."),
    "report": ("cpudist.cli.report", "report", "Speedup and efficiency of comparable runs."),
    "plan": ("cpudist.cli.plan", "plan",
             "Step time, speedup and cost at N nodes, before renting them."),
    "hosts": ("cpudist.cli.hosts", "hosts",
              "Prepare and check the nodes of an on-prem or cloud cluster."),
    "cluster": ("cpudist.cli.cluster", "cluster",
                "Provision a cluster of CPU instances on AWS, and remove it."),
    "ami": ("cpudist.cli.ami", "ami", "Images for cluster nodes."),
}
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110}


class Root(click.Group):
    """Lazily loaded commands; every error is one line (ours, with a traceback under --debug, and
    click's own)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[name]
        command: click.Command = getattr(importlib.import_module(module), attr)
        apply_user_defaults(ctx, name, command)
        return command

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[CompletionItem]:
        """Command names from COMMANDS (click's own would import every command for its help
        line)."""
        names = [CompletionItem(name, help=summary) for name, (_, _, summary) in COMMANDS.items()
                 if name.startswith(incomplete)]
        return [*names, *click.Command.shell_complete(self, ctx, incomplete)]

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list from COMMANDS' one-liners: `cpudist --help` imports no command
        module."""
        with formatter.section("Commands"):
            formatter.write_dl([(name, summary) for name, (_, _, summary) in COMMANDS.items()])

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


@click.group(cls=Root, context_settings=CONTEXT)
@click.version_option(__version__, "-V", "--version", prog_name="cpudist")
@click.option("--debug", is_flag=True, help="Show tracebacks with errors.")
def cli(debug: bool) -> None:
    """Data-parallel fine-tuning of transformers on clusters of CPU servers.

    Defaults for any command's options can live in a TOML file (`cpudist <command> --help` shows the
    options): $CPUDIST_CONFIG, else config.toml in the platform's config folder
    (~/.config/cpudist/config.toml on Linux), one table per command: [run], [sweep], [cluster.up],
    ... The command line wins over the file; `run` and `sweep` also take --config FILE.
    """


def main() -> None:
    try:
        defaults = user_defaults()
    except CpudistError as e:
        e.show()
        sys.exit(e.exit_code)
    cli(default_map=defaults)
