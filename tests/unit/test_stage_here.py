"""A run from the head itself (run/stage_here.py): what --dry-run says it would stage, and when nothing is."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from cpudist.cli.main import cli


def _dry_run(tmp_path: Path, shared_data: Path, *extra: str) -> str:
    (tmp_path / "hosts").write_text("localhost\n192.0.2.1\n")  # this machine, then a node that is not it
    r = CliRunner().invoke(cli, ["run", "mrpc", "--np", "2", "--ppn", "1", "--hostfile", str(tmp_path / "hosts"),
                                 "--model", "tiny", "--data-dir", str(shared_data / "glue" / "MRPC"),
                                 "--output-dir", str(tmp_path / "out"), "--dry-run", *extra])
    assert r.exit_code == 0, r.output
    return r.output


def test_dry_run_from_the_head_names_what_it_would_stage(tmp_path: Path, shared_data: Path) -> None:
    out = _dry_run(tmp_path, shared_data)
    assert f"# stage data (data_dir) {shared_data / 'glue' / 'MRPC'} -> ~/.cpudist/stage/<sha256>/ here, then on " \
           "192.0.2.1" in out
    assert not (tmp_path / "out").exists()
    assert "# stage" not in _dry_run(tmp_path, shared_data, "--shared-fs")
