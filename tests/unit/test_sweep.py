"""`cpudist sweep`: which counts, in what order, and the series refused before any run."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from cpudist.cli.main import cli
from cpudist.cli.run import run
from cpudist.cli.sweep import SET_PER_RUN, sweep
from cpudist.errors import BadInput
from cpudist.run.sweep import SeriesHosts, check_series, parse_counts, run_dirs
from cpudist.state import ledger_path

HOSTFILE = SeriesHosts(Path("hosts"), None, "auto", 4)


def test_counts_run_smallest_first() -> None:
    assert parse_counts("4,1,2") == (1, 2, 4)
    assert parse_counts(" 1, 8 ") == (1, 8)


@pytest.mark.parametrize(("text", "why"), [("0,1", "not a positive"), ("1,-2", "not a positive"),
                                           ("1,2,2", "names 2 more than once"),
                                           ("1,two", "not a whole number"),
                                           ("1,,2", "not a whole number")])
def test_bad_counts(text: str, why: str) -> None:
    with pytest.raises(BadInput, match=why):
        parse_counts(text)


def test_series_checks() -> None:
    check_series((1, 2, 4), 1, HOSTFILE)
    # one node: this machine will do
    check_series((1,), None, SeriesHosts(None, None, "auto", None))
    # Slurm's allocation holds the nodes
    check_series((1, 2), 2, SeriesHosts(None, None, "slurm", None))
    with pytest.raises(BadInput, match="more than the 4 host"):
        check_series((1, 8), 1, HOSTFILE)
    with pytest.raises(BadInput, match="need --ppn"):
        check_series((1, 2), None, HOSTFILE)
    with pytest.raises(BadInput, match=r"more than the 2 host.*cluster c1"):
        check_series((1, 4), 1, SeriesHosts(None, "c1", "auto", 2))
    with pytest.raises(BadInput, match="needs more than this machine"):
        check_series((1, 2), 1, SeriesHosts(None, None, "auto", None))


def test_each_count_gets_its_folder() -> None:
    assert run_dirs(Path("s"), (1, 2)) == {1: Path("s/nodes1"), 2: Path("s/nodes2")}


def test_sweep_takes_every_run_option_but_the_per_run_ones() -> None:
    ours = {p.name for p in sweep.params}
    # --nodes, --output-dir, --format: its own
    assert {p.name for p in run.params} - ours == {"np_", "nodes"}
    assert set(SET_PER_RUN) == {"np_", "nodes", "output_dir", "fmt"}
    assert {p.name for p in sweep.params} - {p.name for p in run.params} == {"counts", "plot"}
    formats = {o: p.type.choices for p in sweep.params if p.name == "fmt" for o in p.opts
               if o == "--format"}
    # the report's formats, not run's
    assert formats == {"--format": ("table", "md", "csv", "json")}
    assert {"counts", "output_dir", "fmt", "plot", "launcher", "hostfile", "ppn"} <= ours


@pytest.mark.parametrize(("args", "why"), [
    (["--nodes", "0,1", "--ppn", "1"], "not a positive node count"),
    (["--nodes", "1,2,2", "--ppn", "1"], "more than once"),
    (["--nodes", "1,2,3", "--ppn", "1"], "more than the 2 host"),
    (["--nodes", "1,2"], "need --ppn"),
])
def test_bad_input_fails_before_any_run_with_one_line(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      args: list[str], why: str) -> None:
    (tmp_path / "hosts").write_text("localhost\n127.0.0.1\n")
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli, ["sweep", "mrpc", "--hostfile", "hosts", "--model", "tiny", *args])
    assert r.exit_code == 2, r.output
    assert why in r.output and len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists() and not ledger_path().exists()


def test_dry_run_shows_each_run_with_the_options_passed_through(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                shared_data: Path) -> None:
    (tmp_path / "hosts").write_text("localhost\n127.0.0.1\n")
    monkeypatch.chdir(tmp_path)
    common = ["sweep", "mrpc", "--data-dir", str(shared_data / "glue" / "MRPC"), "--model", "tiny",
              "--max-steps", "3", "--dry-run", "--output-dir", "s"]
    r = CliRunner().invoke(cli, [*common, "--nodes", "2,1", "--ppn", "1", "--hostfile", "hosts"])
    assert r.exit_code == 0, r.output
    assert [line for line in r.output.splitlines() if line.startswith("# sweep")] == [
        "# sweep 1/2: 1 node(s), --ppn 1 -> s/nodes1",
        "# sweep 2/2: 2 node(s), --ppn 1 -> s/nodes2"]
    commands = [line for line in r.output.splitlines() if "cpudist.rank" in line]
    assert len(commands) == 2 and "-np 1 -ppn 1" in commands[0] and "-np 2 -ppn 1" in commands[1]
    assert all("--max-steps=3" in c for c in commands) and "--output-dir=s/nodes2" in commands[1]
    torchrun = CliRunner().invoke(cli, [*common, "--nodes", "1", "--launcher", "torchrun"])
    assert (torchrun.exit_code == 0
            and "torch.distributed.run --nnodes 1" in torchrun.output), torchrun.output
    assert not (tmp_path / "s").exists()  # a dry run writes nothing
