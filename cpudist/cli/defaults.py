"""Option defaults from TOML: the user's config file, and `--config FILE` of run, sweep and cluster
up.

A file holds one table per command (`[run]`, `[sweep]`, `[cluster.up]`, ...) whose keys are the
options' long names (`max-steps = 100`, `np = 4`, `json = true`); the command line always wins.
Click reads defaults by parameter name (`np_`, `cluster_name`, ...), so keys are translated through
the command's own options, and a key that names no option is an error, not silently ignored.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

import click

from cpudist.errors import BadInput

ENV = "CPUDIST_CONFIG"


def config_path() -> Path:
    """$CPUDIST_CONFIG, else config.toml in the platform's config folder (~/.config/cpudist on
    Linux)."""
    given = os.environ.get(ENV)
    return Path(given).expanduser() if given else Path(click.get_app_dir("cpudist")) / "config.toml"


def read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise BadInput(f"cannot read {path}: {e}",
                       "Give a TOML file, e.g. examples/cluster.toml") from None


def user_defaults() -> dict[str, Any]:
    """The user's config file as click's nested default_map (untranslated until a command is
    loaded)."""
    path = config_path()
    if not path.is_file():
        if os.environ.get(ENV):
            raise BadInput(f"${ENV} names {path}, which does not exist",
                           f"Create it, or unset {ENV}")
        return {}
    return {"__source__": str(path), **read_toml(path)}


def translate(command: click.Command, table: dict[str, Any], source: str) -> dict[str, Any]:
    """A TOML table keyed by option names -> click's default_map for `command` (groups recurse)."""
    if isinstance(command, click.Group):
        out: dict[str, Any] = {}
        for key, value in table.items():
            sub = command.commands.get(key)
            if sub is None or not isinstance(value, dict):
                tables = ", ".join(f"[{command.name}.{c}]" for c in command.commands)
                raise BadInput(f"{source}: `{command.name}` has no command {key!r}",
                               f"Use a table per command: {tables}")
            out[key] = translate(sub, value, source)
        return out
    names: dict[str, str] = {}
    for p in command.params:
        if isinstance(p, click.Option) and p.name is not None:
            for flag in p.opts:  # not secondary ones: `on-demand = true` would mean spot = true
                names[flag.lstrip("-").replace("_", "-")] = p.name
    mapped = {}
    for key, value in table.items():
        # another command's table ([sweep] in a file read for run): not ours
        if isinstance(value, dict):
            continue
        name = names.get(key.replace("_", "-"))
        if name is None:
            raise BadInput(f"{source}: `{command.name}` has no option --{key}",
                           f"See `cpudist {command.name} --help` for its options")
        mapped[name] = value
    return mapped


def apply_user_defaults(ctx: click.Context, name: str, command: click.Command) -> None:
    """Translate the user file's table for `name`, once, when that command is loaded."""
    done = ctx.meta.setdefault("cpudist.translated", set())
    if not ctx.default_map or name not in ctx.default_map or name in done:
        return
    done.add(name)
    source = str(ctx.default_map.get("__source__", config_path()))
    table = ctx.default_map[name]
    if not isinstance(table, dict):
        raise BadInput(f"{source}: {name} = ... must be a table [{name}]",
                       f"Write the options under [{name}]")
    ctx.default_map[name] = translate(command, table, source)


def config_option(f: Any) -> Any:
    """`--config FILE`: TOML defaults for this command: its table ([run], [sweep], [cluster.up] or
    [cluster]) as far as the file has it, else the file's top level."""

    def load(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
        if value is not None:
            table = read_toml(value)
            for part in ctx.command_path.split()[1:]:
                if isinstance(table.get(part), dict):
                    table = table[part]
            ctx.default_map = {**(ctx.default_map or {}),
                               **translate(ctx.command, table, str(value))}
        return value

    return click.option("--config", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                        callback=load,
                        is_eager=True, expose_value=False,
                        help="TOML file of option defaults (its [command] table, or top-level "
                             "keys); the command "
                        "line wins.")(f)
