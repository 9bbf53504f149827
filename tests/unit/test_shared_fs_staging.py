"""#23 item 1, `--shared-fs` from a laptop: the head's staging is the only copy (the nodes see it),
nothing is copied from the head to the other nodes; without it every other node gets a copy
(run/remote.py: copied_to)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from cpudist.cli.main import cli
from cpudist.config import TrainConfig
from cpudist.hostfile import Host
from cpudist.run.remote import copied_to
from cpudist.run.request import LaunchOptions, RunRequest

NODES = (Host("n0"), Host("n1"), Host("n2"))


def test_the_head_copies_its_staging_to_the_other_nodes_unless_they_share_it() -> None:
    plain = RunRequest(train=TrainConfig(task="mrpc", output_dir="out"), launch=LaunchOptions(np=3))
    shared = RunRequest(train=TrainConfig(task="mrpc", output_dir="out"),
                        launch=LaunchOptions(np=3, shared_fs=True))
    assert [h.name for h in copied_to(plain, NODES)] == ["n1", "n2"]
    assert copied_to(shared, NODES) == ()


def test_a_dry_run_from_a_laptop_says_where_inputs_go(tmp_path: Path, shared_data: Path) -> None:
    (tmp_path / "hosts").write_text("n0\nn1\n")
    data = shared_data / "glue" / "MRPC"

    def dry_run(*extra: str) -> str:
        r = CliRunner().invoke(cli,
                               ["run", "mrpc", "--np", "2", "--ppn", "1", "--hostfile",
                                str(tmp_path / "hosts"), "--head", "192.0.2.9", "--model", "tiny",
                                "--data-dir", str(data), "--output-dir", str(tmp_path / "out"),
                                "--dry-run", *extra])
        assert r.exit_code == 0, r.output
        return r.output

    assert f"# stage data (data_dir) {data} -> ~/.cpudist/stage/<sha256>/ on the head, then on " \
           "n1" in dry_run()
    shared = dry_run("--shared-fs")
    assert f"# stage data (data_dir) {data} -> ~/.cpudist/stage/<sha256>/ on the head, the only " \
           "copy (--shared-fs: the nodes read it there)" in shared
    assert "then on" not in shared
