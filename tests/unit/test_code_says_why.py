"""Figures rot where they are written: `--help` holds no measured figure and the code no issue
number or stop (a rule plus a pointer to benchmarks/ is enough; the measurement lives in
benchmarks/results/)."""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from pathlib import Path

import click

from cpudist.cli.main import COMMANDS

PACKAGE = Path(__file__).resolve().parents[2] / "cpudist"
# a percentage (not a threshold: "more than 10%"), a decimal ratio ("1.2x"), accuracy points, a
# throughput: what a measurement reads like
FIGURE = re.compile(r"(?<!than )\b\d+(\.\d+)?\s?%|\b\d+\.\d+x\b|\b\d+(\.\d+)? (\w+ )?points\b|\d "
                    r"samples/s")
HISTORY = re.compile(r"\bissue #?\d+|(?<!cpudist )\bstop \d{1,3}\b|\(#\d+\)", re.I)


def helps(command: click.Command, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from helps(sub, f"{path} {name}")
    yield path, command.help or ""
    for param in command.params:
        yield f"{path} {param.opts[0]}", getattr(param, "help", None) or ""


def test_help_holds_no_measured_figure() -> None:
    found = [(where, text) for name, (module, attr, _) in COMMANDS.items()
             for where,
             text in helps(getattr(importlib.import_module(module), attr), f"cpudist {name}")
             if FIGURE.search(text)]
    assert not found, found


def test_code_names_no_issue_or_stop() -> None:
    found = [f"{path.relative_to(PACKAGE)}:{n}" for path in PACKAGE.rglob("*.py")
             for n, line in enumerate(path.read_text().splitlines(), 1) if HISTORY.search(line)]
    assert not found, found
