"""The front door: help on every option, one spelling for machine output, defaults from TOML, fast
help."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from cpudist.cli.main import COMMANDS, cli
from cpudist.cli.options import SectionedCommand
from cpudist.cli.run_sections import SECTIONS
from cpudist.results.ledger import append
from tests.unit.test_results import result

MRPC = Path(__file__).resolve().parents[3] / "shared" / "data" / "glue" / "MRPC"


def leaves(cmd: click.Command,
           path: tuple[str, ...] = ("cpudist",)) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """Every command that runs something, with its path."""
    ctx = click.Context(cli)
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            assert sub is not None, name
            yield from leaves(sub, (*path, name))
    else:
        yield path, cmd


def test_every_command_and_option_says_what_it_is_for() -> None:
    missing = [f"{' '.join(path)} {p.opts[0]}" for path, cmd in leaves(cli)
               for p in cmd.params if isinstance(p, click.Option) and not p.help]
    assert missing == []
    assert [" ".join(path) for path, cmd in leaves(cli) if not cmd.help] == []
    # the walk reached every group's commands (the check can fail)
    assert len(list(leaves(cli))) >= 13


def test_machine_output_is_format_with_json_as_its_alias_everywhere() -> None:
    """One rule: a command with results to print takes --format, and --json means --format json."""
    for path, cmd in leaves(cli):
        by_flag = {o: p for p in cmd.params if isinstance(p, click.Option) for o in p.opts}
        if "--json" in by_flag or "--format" in by_flag:
            fmt, js = by_flag.get("--format"), by_flag.get("--json")
            assert fmt is not None and js is not None, path
            assert fmt.name == js.name == "fmt" and js.flag_value == "json", path
            assert isinstance(fmt.type, click.Choice) and "json" in fmt.type.choices, path


def test_run_help_lists_options_under_sections_and_h_is_help() -> None:
    run = cli.get_command(click.Context(cli), "run")
    assert isinstance(run, SectionedCommand)
    listed = {n for names in SECTIONS.values() for n in names}
    # HF's aliases are hidden
    shown = [p for p in run.params if isinstance(p, click.Option) and not p.hidden]
    unplaced = {p.name for p in shown if p.name not in listed} - {"help"}
    assert unplaced == set(), "every run option belongs to a section of --help"
    out = CliRunner().invoke(cli, ["run", "-h"]).output
    headings = [h for h in SECTIONS if f"\n{h}:\n" in out]
    assert headings == list(SECTIONS)
    assert out.index("Gradient sync:") < out.index("--sync-every") < out.index("Speed levers:")


def _imported_after(*argv: str, env: dict[str, str] | None = None) -> tuple[str, set[str]]:
    """Run the CLI in a fresh interpreter; (stdout, heavy modules it imported)."""
    code = ("import atexit, sys\n"
            "heavy = ('torch', 'transformers', 'datasets', 'boto3', 'paramiko', 'matplotlib')\n"
            "atexit.register(lambda: print('IMPORTED', *[m for m in heavy if m in sys.modules]))\n"
            "from cpudist.cli.main import main\n"
            f"sys.argv = ['cpudist', *{list(argv)!r}]\n"
            "main()\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, **(env or {})})
    last = p.stdout.strip().splitlines()[-1]
    assert last.startswith("IMPORTED"), p.stdout + p.stderr
    return p.stdout, set(last.split()[1:])


def test_top_level_help_and_completion_import_nothing_heavy() -> None:
    out, heavy = _imported_after("--help")
    assert heavy == set() and all(name in out for name in COMMANDS)
    for command in ("run", "sweep"):  # the biggest --help, and the command that trains
        out, heavy = _imported_after(command, "--help")
        assert heavy == set() and "Gradient sync:" in out, (command, heavy)
    out, heavy = _imported_after(env={"_CPUDIST_COMPLETE": "bash_complete",
                                      "COMP_WORDS": "cpudist ru", "COMP_CWORD": "1"})
    assert heavy == set() and "plain,run" in out


def test_the_task_argument_completes() -> None:
    out, _ = _imported_after(env={"_CPUDIST_COMPLETE": "bash_complete",
                                  "COMP_WORDS": "cpudist run m", "COMP_CWORD": "2"})
    assert {"plain,mrpc", "plain,mnli"} <= set(out.split())


def test_user_config_and_config_file_give_defaults_and_the_command_line_wins(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    user = tmp_path / "config.toml"
    user.write_text('[run]\nmodel = "tiny"\nnp = 2\n')
    monkeypatch.setenv("CPUDIST_CONFIG", str(user))
    own = tmp_path / "job.toml"
    # [sweep] is another command's table
    own.write_text('max-steps = 7\nnp = 1\n[sweep]\nppn = 9\n')
    args = ["run", "mrpc", "--data-dir", str(MRPC), "--dry-run"]
    r = subprocess.run([sys.executable, "-m", "cpudist.cli", *args], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--model=tiny" in r.stdout and " -np 2 " in r.stdout
    r = subprocess.run([sys.executable, "-m", "cpudist.cli", *args, "--config", str(own)],
                       capture_output=True, text=True, timeout=120)
    assert ("--max-steps=7" in r.stdout and " -np 1 " in r.stdout
            and "--model=tiny" in r.stdout), r.stderr
    r = subprocess.run([sys.executable, "-m", "cpudist.cli", *args, "--config", str(own), "--np",
                        "2"],
                       capture_output=True, text=True, timeout=120)
    assert " -np 2 " in r.stdout, r.stderr


@pytest.mark.parametrize(("text", "says"), [('[run]\nnpx = 3\n', "`run` has no option --npx"),
                                            ("[run\n", "cannot read"),
                                            ('[cluster]\nbogus = {a = 1}\n',
                                             "`cluster` has no command 'bogus'")])
def test_a_bad_config_file_is_one_line_and_exit_2(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "config.toml"
    path.write_text(text)
    for argv in (["run", "mrpc", "--dry-run"], ["cluster", "list"]):
        r = subprocess.run([sys.executable, "-m", "cpudist.cli", *argv], capture_output=True,
                           text=True, timeout=120, env={**os.environ, "CPUDIST_CONFIG": str(path)})
        if says in r.stderr:
            break
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_ssh_setup_dry_run_touches_nothing(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost\n127.0.0.1\n")
    home = tmp_path / "home"
    home.mkdir()
    r = subprocess.run([sys.executable, "-m", "cpudist.cli", "hosts", "ssh-setup", "--hostfile",
                        str(hostfile), "--dry-run"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "HOME": str(home),
                            "CPUDIST_HOME": str(home / ".cpudist")})
    assert r.returncode == 0, r.stderr
    assert "localhost" in r.stdout and "authorized_keys" in r.stdout
    assert list(home.rglob("*")) == []  # no key made, nothing pinned, nothing written


def test_json_is_format_json_for_report(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    for world, sps in ((1, 10.0), (2, 18.0)):
        append(ledger, result(world, sps))
    a = CliRunner().invoke(cli, ["report", str(ledger), "--json"])
    b = CliRunner().invoke(cli, ["report", str(ledger), "--format", "json"])
    assert a.exit_code == b.exit_code == 0 and a.output == b.output
    assert [row["ranks"] for row in json.loads(a.output)] == [1, 2]
