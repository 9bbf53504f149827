"""`cpudist run --detach`'s rules and dry run (the run itself:
tests/integration/test_remote_onprem.py)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from cpudist.cli.main import cli
from cpudist.run.life.detach import Detached
from cpudist.run.life.identity import RunInfo, read_run, write_run


def test_detach_without_a_head_is_refused_in_one_line(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli,
                           ["run", "synthetic", "--np", "1", "--model", "tiny", "--max-steps", "1",
                            "--output-dir", str(tmp_path / "out"), "--detach"])
    assert r.exit_code == 2, r.output
    assert r.output.startswith("Error: --detach is for runs on a cluster from outside it "
                               "(--cluster or --head)")
    assert not (tmp_path / "out" / "run.json").exists()  # refused before anything started


def test_dry_run_says_the_agent_is_detached(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node-a\nnode-b\n")
    args = ["run", "synthetic", "--np", "2", "--ppn", "1", "--model", "tiny", "--hostfile",
            str(hostfile),
            "--head", "192.0.2.7", "--output-dir", str(tmp_path / "out"), "--dry-run"]
    r = CliRunner().invoke(cli, [*args, "--detach"])
    assert r.exit_code == 0, r.output
    assert ("# --detach: on the head, setsid nohup python -m cpudist.run.agent --detached "
            "<run dir>") in r.output
    plain = CliRunner().invoke(cli, args)
    assert plain.exit_code == 0 and "--detach" not in plain.output, plain.output


def test_run_json_keeps_the_detached_agent(tmp_path: Path) -> None:
    d = Detached(host="192.0.2.7", user="root", port=2222, identity="/k", known_hosts="/kh",
                 python="/usr/bin/python3", pythonpath=None,
                 run_dir="/root/.cpudist/runs/x-1", agent_pid=42, agent_start=1234,
                 fetch_model=True, report_to=False, ledger="/ledger", staging={"head": "192.0.2.7"})
    write_run(tmp_path,
              RunInfo(id="20261126-100000-123456", task="mrpc", model="tiny",
                      where="head:192.0.2.7", state="running",
                      started_at="2026-11-26T10:00:00+00:00", run_dir=str(tmp_path),
                      detached=d.__dict__))
    info = read_run(tmp_path)
    assert info is not None and Detached.from_dict(info.detached) == d
    assert d.target().port == 2222 and d.landing(tmp_path).ledger == Path("/ledger")
