"""A run from the head itself (run/stage_here.py): what --dry-run says it would stage, and when
nothing is."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from cpudist.cli.main import cli
from cpudist.errors import CpudistError
from cpudist.run.stage_here import Here


def _dry_run(tmp_path: Path, shared_data: Path, *extra: str) -> str:
    # this machine, then a node that is not it
    (tmp_path / "hosts").write_text("localhost\n192.0.2.1\n")
    r = CliRunner().invoke(cli,
                           ["run", "mrpc", "--np", "2", "--ppn", "1", "--hostfile",
                            str(tmp_path / "hosts"), "--model", "tiny", "--data-dir",
                            str(shared_data / "glue" / "MRPC"), "--output-dir",
                            str(tmp_path / "out"), "--dry-run", *extra])
    assert r.exit_code == 0, r.output
    return r.output


def test_dry_run_from_the_head_names_what_it_would_stage(tmp_path: Path, shared_data: Path) -> None:
    out = _dry_run(tmp_path, shared_data)
    assert f"# stage data (data_dir) {shared_data / 'glue' / 'MRPC'} -> ~/.cpudist/stage/" \
           "<sha256>/ here, then on 192.0.2.1" in out
    assert not (tmp_path / "out").exists()
    assert "# stage" not in _dry_run(tmp_path, shared_data, "--shared-fs")


def test_the_heads_shell_takes_a_large_item_from_a_command_that_talks_first() -> None:
    """A command that writes more than a pipe holds (64 KiB) to stderr and stdout before it reads
    its stdin: with its output on pipes nobody reads while the item streams in, both sides would
    wait for ever."""
    item = [b"x" * 65536] * 32  # 2 MiB
    said: list[str] = []
    worker = threading.Thread(target=lambda: said.append(Here().check(
        "head -c 300000 /dev/zero >&2; head -c 200000 /dev/zero | tr '\\0' y; wc -c", item,
        timeout=120)))
    worker.start()
    worker.join(120)
    assert (not worker.is_alive() and said[0].endswith(f"{65536 * 32}\n")
            and said[0].startswith("y" * 200000))
    with pytest.raises(CpudistError, match="failed here: no room"):
        Here().check("echo no room >&2; exit 1", [b"z" * 200000])
