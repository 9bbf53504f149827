"""`cpudist launch --per-node`: each node's torchrun (or `accelerate launch`) command from the
launcher's numbering, and what --dry-run shows (one process per node;
tests/integration/test_launch_script_per_node.py runs both)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cpudist.cli.main import cli
from cpudist.errors import CpudistError
from cpudist.run.script_rank import check_accelerate, per_node_argv
from cpudist.train.dist import RankInfo

# what each worker of a node's torchrun runs before the script: the wrapper that tags its lines with
# its rank
WORKER = ["-m", "cpudist.run.script_rank", "--relay"]


def test_each_nodes_torchrun_takes_its_place_and_the_rendezvous_from_the_launcher() -> None:
    node1 = RankInfo(1, 3, 0, 1, "PMI_RANK")  # the second of 3 nodes, one process each
    env = {"MASTER_ADDR": "n0", "MASTER_PORT": "29511"}
    assert per_node_argv(["python3", "train.py", "--lr", "1"], "/py", node1, 4, env) == [
        "/py", "-m", "torch.distributed.run", "--nnodes", "3", "--node-rank", "1",
        "--nproc-per-node", "4",
        "--master-addr", "n0", "--master-port", "29511", *WORKER, "/py", "-u", "train.py", "--lr",
        "1"]
    assert per_node_argv(["train.py"], "/py", node1, 2, env)[-4:] == [*WORKER, "/py", "-u",
                                                                      "train.py"][-4:]
    with pytest.raises(CpudistError, match="MASTER_PORT not set for node 1"):
        per_node_argv(["train.py"], "/py", node1, 2, {"MASTER_ADDR": "n0"})


def test_dry_run_starts_one_process_per_node(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("raise SystemExit('must not run')\n")
    (tmp_path / "hosts").write_text("localhost\n127.0.0.2\n")
    r = CliRunner().invoke(cli,
                           ["launch", "--np", "4", "--ppn", "2", "--hostfile", "hosts",
                            "--per-node", "--dry-run", "--", "python", "train.py"])
    assert r.exit_code == 0, r.output
    assert "localhost:1\n127.0.0.2:1" in r.output and " -np 2 " in r.output
    assert "--per-node 2 -- python train.py" in r.output


def test_accelerate_launch_per_node_gets_cpudists_machines_rank_rendezvous_and_process_count(
) -> None:
    node1 = RankInfo(1, 3, 0, 1, "PMI_RANK")
    env = {"MASTER_ADDR": "n0", "MASTER_PORT": "29511"}
    expected = ["/py", "-m", "accelerate.commands.launch", "--multi_gpu", "--num_machines", "3",
                "--machine_rank", "1", "--main_process_ip", "n0", "--main_process_port", "29511",
                "--num_processes", "12", "--mixed_precision", "no", "--module",
                "cpudist.run.script_rank", "--relay", "/py", "-u", "train.py", "--lr", "1"]
    assert per_node_argv(["accelerate", "launch", "--mixed_precision", "no", "train.py", "--lr",
                          "1"], "/py", node1, 4,
                         env) == expected
    assert per_node_argv(["python3", "-m", "accelerate.commands.launch", "--mixed_precision", "no",
                          "train.py", "--lr", "1"], "/py", node1, 4, env) == expected
    alone = per_node_argv(["/venv/bin/accelerate", "launch", "train.py"], "/py",
                          RankInfo(0, 1, 0, 1, "PMI_RANK"), 1, env)
    # it refuses 1 process
    assert "--multi_gpu" not in alone and alone[-8:-6] == ["--num_processes", "1"]
    # a module or another program is left as given: WORKER starts only a .py script as Accelerate
    # would
    assert per_node_argv(["accelerate", "launch", "-m", "pkg.train"], "/py", node1, 4,
                         env)[-2:] == ["-m", "pkg.train"]


def test_accelerate_options_cpudist_sets_are_refused_before_anything_starts() -> None:
    check_accelerate(["accelerate", "launch", "--mixed_precision", "no", "train.py",
                      "--num_processes", "3"])  # its own
    for given in ("--num_processes=4", "--machine_rank", "--cpu"):
        with pytest.raises(CpudistError, match=f"accelerate launch {given.split('=')[0]}`"):
            check_accelerate(["accelerate", "launch", given, "1", "train.py"])


def test_dry_run_shows_each_nodes_accelerate_launch_and_it_needs_per_node(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("raise SystemExit('must not run')\n")
    (tmp_path / "hosts").write_text("localhost\n127.0.0.2\n")
    args = ["launch", "--np", "4", "--ppn", "2", "--hostfile", "hosts", "--dry-run", "--",
            "accelerate", "launch", "train.py"]
    r = CliRunner().invoke(cli, [*args[:-4], "--per-node", *args[-4:]])
    assert r.exit_code == 0, r.output
    nodes = [line for line in r.output.splitlines() if line.startswith("# node ")]
    port = next(line.split("=")[1] for line in r.output.splitlines()
                if line.startswith("export MASTER_PORT="))
    assert [n.split(" runs ")[0] for n in nodes] == ["# node 0 (localhost)",
                                                     "# node 1 (127.0.0.2)"], r.output
    for i, line in enumerate(nodes):
        assert line.endswith(" -m accelerate.commands.launch --multi_gpu --num_machines 2 "
                             f"--machine_rank {i} --main_process_ip 127.0.0.1 --main_process_port "
                             f"{port} --num_processes 4 --module cpudist.run.script_rank --relay "
                             f"{sys.executable} -u train.py")
    assert " -np 2 " in r.output and "--per-node 2 -- accelerate launch train.py" in r.output
    refused = CliRunner().invoke(cli, args)
    assert refused.exit_code == 2 and "Add --per-node" in refused.output, refused.output
