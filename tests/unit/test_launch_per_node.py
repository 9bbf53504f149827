"""`cpudist launch --per-node`: each node's torchrun command from the launcher's numbering, and what --dry-run
shows (one process per node; tests/integration/test_launch_script_per_node.py runs it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from cpudist.cli.main import cli
from cpudist.errors import CpudistError
from cpudist.run.script_rank import per_node_argv
from cpudist.train.dist import RankInfo


def test_each_nodes_torchrun_takes_its_place_and_the_rendezvous_from_the_launcher() -> None:
    node1 = RankInfo(1, 3, 0, 1, "PMI_RANK")  # the second of 3 nodes, one process each
    env = {"MASTER_ADDR": "n0", "MASTER_PORT": "29511"}
    assert per_node_argv(["python3", "train.py", "--lr", "1"], "/py", node1, 4, env) == [
        "/py", "-m", "torch.distributed.run", "--nnodes", "3", "--node-rank", "1", "--nproc-per-node", "4",
        "--master-addr", "n0", "--master-port", "29511", "train.py", "--lr", "1"]
    assert per_node_argv(["train.py"], "/py", node1, 2, env)[-1] == "train.py"
    with pytest.raises(CpudistError, match="MASTER_PORT not set for node 1"):
        per_node_argv(["train.py"], "/py", node1, 2, {"MASTER_ADDR": "n0"})


def test_dry_run_starts_one_process_per_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("raise SystemExit('must not run')\n")
    (tmp_path / "hosts").write_text("localhost\n127.0.0.2\n")
    r = CliRunner().invoke(cli, ["launch", "--np", "4", "--ppn", "2", "--hostfile", "hosts", "--per-node",
                                 "--dry-run", "--", "python", "train.py"])
    assert r.exit_code == 0, r.output
    assert "localhost:1\n127.0.0.2:1" in r.output and " -np 2 " in r.output
    assert "--per-node 2 -- python train.py" in r.output
