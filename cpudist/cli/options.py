"""What every command shares at the front door: machine-output options, the ranks-per-node
type, option sections in --help.

One rule for machine output: a command that prints results takes `--format` with its formats, and
`--json` is the same as `--format json` everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import click


def output_options(formats: Sequence[str] = ("text", "json"),
                   default: str = "text") -> Callable[[Any], Any]:
    """`--format {formats}` and its shorthand `--json`, both into the parameter `fmt`."""

    def decorate(f: Any) -> Any:
        f = click.option("--json", "fmt", flag_value="json", help="Same as --format json.")(f)
        shown = ", ".join(formats)
        return click.option("--format", "fmt", type=click.Choice(formats), default=default,
                            show_default=True, help=f"Output: {shown}.")(f)

    return decorate


class _Ppn(click.ParamType):
    """A positive rank count, or `auto`."""

    name = "N|auto"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int | str:
        if value == "auto" or (isinstance(value, int) and value >= 1):
            return value
        if isinstance(value, str) and value.isdigit() and int(value) >= 1:
            return int(value)
        self.fail(f"{value!r} is neither a positive count nor auto", param, ctx)


PPN = _Ppn()


class SectionedCommand(click.Command):
    """A command whose --help lists options under headings: `sections` maps a heading to parameter
    names.

    Options not named in any section are listed last, under "Other options".
    """

    def __init__(self, *args: Any, sections: dict[str, Sequence[str]] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sections = sections or {}

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(p.name, record) for p in self.get_params(ctx)
                if isinstance(p, click.Option) and (record := p.get_help_record(ctx)) is not None]
        placed: set[str | None] = set()
        for heading, names in self.sections.items():
            # a name listed under an earlier heading stays there
            fresh = [n for n in names if n not in placed]
            # --format and --json share one
            records = [record for n in fresh for name, record in rows if name == n]
            placed.update(fresh)
            if records:
                with formatter.section(heading):
                    formatter.write_dl(records)
        rest = [record for name, record in rows if name not in placed]
        if rest:
            with formatter.section("Other options"):
                formatter.write_dl(rest)
