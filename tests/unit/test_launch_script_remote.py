"""`cpudist launch --head/--cluster` without a cluster: the snapshot of the script's folder, the
command's staged paths, the job the head's agent reads, each node's working copy, and what --dry-run
says (tests/integration/test_launch_script_remote.py runs it from the laptop namespace)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from cpudist.cli.main import cli
from cpudist.config import TrainConfig
from cpudist.hostfile import Host, Nodes
from cpudist.run.request import LaunchOptions, RunRequest
from cpudist.run.script_rank import copy_folder
from cpudist.run.script_remote import rewrite, snapshot
from cpudist.wire.payload import Probe, Script, Trainer


def test_the_snapshot_leaves_out_the_runs_folder_version_control_and_caches(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    for name in ("data/a.csv", ".git/HEAD", "pkg/__pycache__/m.pyc", "pkg/m.py",
                 "runs/old/result.json"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    out = tmp_path / "runs" / "new"
    out.mkdir()
    copy = snapshot(tmp_path, out)
    assert copy == out / "script"
    assert sorted(str(p.relative_to(copy)) for p in copy.rglob("*") if p.is_file()) == \
        ["data/a.csv", "pkg/m.py", "train.py"]
    # a run folder outside the script's folder: nothing else left out
    elsewhere = snapshot(tmp_path / "pkg", out)
    assert sorted(p.name for p in elsewhere.iterdir()) == ["m.py"]


def test_words_naming_a_staged_path_become_the_nodes_path() -> None:
    paths = {"data/x.csv": "/n/stage/1/x.csv", "/home/me/data/x.csv": "/n/stage/1/x.csv"}
    assert rewrite(("train.py", "data/x.csv", "--file=/home/me/data/x.csv", "--other=data",
                    "x.csv"), paths) == \
        ("train.py", "/n/stage/1/x.csv", "--file=/n/stage/1/x.csv", "--other=data", "x.csv")


def test_the_heads_job_round_trips_through_json_with_each_payload() -> None:
    """The one agent reads every payload from the request's JSON line (no second agent, no sentinel
    task)."""
    script = Script(command=("train.py", "--lr", "1"), workdir="/h/runs/r/work",
                    metric_file="m.json", collect=("outputs",), stage=(),
                    copy_of="/h/stage/abc", per_node=2)
    for payload in (script, Trainer(), Probe(sizes=(4, 8), iters=3, warmup=1)):
        request = RunRequest(train=TrainConfig(task="script", output_dir="/h/runs/r",
                                         model="train.py --lr 1"),
                             launch=LaunchOptions(np=2, ppn=1, env=(("A", "b"),)),
                             nodes=Nodes((Host("10.0.0.2"), Host("10.0.0.3", 2)),
                                   "the nodes of 10.0.0.9"),
                             command="cpudist launch ...", payload=payload)
        assert RunRequest.from_json(request.to_json()) == request


def test_each_node_copies_the_staged_folder_once_without_stagings_marks(tmp_path: Path) -> None:
    staged = tmp_path / "stage"
    (staged / "sub").mkdir(parents=True)
    for name in ("train.py", "sub/d.txt", ".complete", ".manifest"):
        (staged / name).write_text(name)
    work = tmp_path / "run" / "work"
    copy_folder(str(staged), str(work), str(tmp_path / "run"))
    assert sorted(str(p.relative_to(work)) for p in work.rglob("*") if p.is_file()) == ["sub/d.txt",
                                                                                        "train.py"]
    (work / "outputs").mkdir()  # the script's outputs
    # another rank on this node: the copy stays
    copy_folder(str(staged), str(work), str(tmp_path / "run"))
    assert (work / "outputs").is_dir() and not list(tmp_path.glob("run/work.part*"))


def test_dry_run_from_outside_says_what_is_staged_and_where_it_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("raise SystemExit('must not run')\n")
    (tmp_path / "hosts").write_text("n0\nn1\n")
    (tmp_path / "data.csv").write_text("1\n")
    r = CliRunner().invoke(cli,
                           ["launch", "--np", "2", "--ppn", "1", "--hostfile", "hosts", "--head",
                            "10.0.0.9", "--stage", "data.csv", "--collect", "outputs", "--dry-run",
                            "--", "train.py"])
    assert r.exit_code == 0, r.output
    assert "ssh 10.0.0.9" in r.output and "python -m cpudist.run.agent" in r.output
    assert f"# stage {tmp_path / 'data.csv'}" in r.output and "then on n1" in r.output
    assert "outputs ->" in r.output and not Path("runs").exists()
    here = CliRunner().invoke(cli,
                              ["launch", "--np", "2", "--stage", "data.csv", "--dry-run", "--",
                               "train.py"])
    assert here.exit_code == 2 and "--stage puts files on the nodes from outside" in here.output
    missing = CliRunner().invoke(cli,
                                 ["launch", "--np", "2", "--ppn", "1", "--hostfile", "hosts",
                                  "--head", "h", "--stage", "nope", "--dry-run", "--", "train.py"])
    assert missing.exit_code == 2 and "--stage nope" in missing.output, missing.output


def test_sweep_runs_each_count_in_its_folder_and_refuses_what_cannot_finish(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("raise SystemExit('must not run')\n")
    (tmp_path / "hosts").write_text("n0\nn1\n")
    head = ["--hostfile", "hosts", "--head", "10.0.0.9", "--dry-run", "--output-dir", "sw"]
    r = CliRunner().invoke(cli, ["launch", "--sweep", "2,1", "--ppn", "1", *head, "--", "train.py"])
    assert r.exit_code == 0, r.output
    assert "# sweep 1/2: 1 node(s), --ppn 1 -> sw/nodes1" in r.output and "-> sw/nodes2" in r.output
    # each run in its folder
    assert "(as sw/nodes1/script:" in r.output and "(as sw/nodes2/script:" in r.output
    assert "1 rank(s) run `train.py`" in r.output and "2 rank(s) run `train.py`" in r.output
    for args, says in ((["--sweep", "1,4", "--ppn", "1", *head],
                        "--nodes 4 is more than the 2 host(s)"),
                       (["--sweep", "1,2", "--np", "2", "--ppn", "1", *head],
                        "--sweep sets the node count"),
                       (["--sweep", "1,2", "--ppn", "1", "--dry-run"],
                        "needs more than this machine")):
        bad = CliRunner().invoke(cli, ["launch", *args, "--", "train.py"])
        assert bad.exit_code == 2 and says in bad.output, bad.output


def test_runs_staging_finds_no_trainer_inputs_in_a_script_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """remote.stage_run stages the trainer's inputs from the config; a script run's `model` is its
    command, which names a file or folder here as often as not (`train.py`,
    `sentence-transformers/...`): not a model to stage (the script's folder and --stage paths are
    run/script_remote.py's)."""
    from cpudist.run.remote import local_inputs
    from cpudist.run.script import script_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "tool").mkdir()
    for command in (("train.py",), ("tool",), ("sentence-transformers/all-MiniLM-L6-v2",)):
        script = Script(command=command)
        cfg = script_config(script, str(tmp_path / "run"), 2)
        assert local_inputs(RunRequest(train=cfg, launch=LaunchOptions(), payload=script)) == []
