"""`cpudist run --head ... --dry-run`: shows what a run from outside the cluster would stage and
launch."""

from __future__ import annotations

import json
from pathlib import Path

from tests.integration.helpers import cpudist


def test_dry_run_from_outside_shows_the_plan_and_touches_nothing(shared_data: Path,
                                                                 tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node-a\nnode-b\nnode-c\n")
    out_dir = tmp_path / "runs" / "x"
    # 192.0.2.1 (TEST-NET-1) answers nothing: a dry run must not try to connect.
    r = cpudist("run", "mrpc", "--np", "2", "--ppn", "1", "--hostfile", hostfile, "--head",
                "192.0.2.1", "--user", "ubuntu", "--data-dir", shared_data / "glue" / "MRPC",
                "--model", "tiny", "--output-dir", out_dir, "--dry-run", timeout=60,
                env={"HOME": str(tmp_path / "home")})
    assert r.returncode == 0, r.stderr
    note, *lines = r.stdout.splitlines()
    assert note.startswith("# 2 ranks x batch 16 = global batch 32: lr 2e-05 x 2 = 4e-05 "
                           "(--lr-scaling auto")
    assert lines[0].startswith("# from this machine: ssh ubuntu@192.0.2.1")
    assert any(line.startswith("# stage data (data_dir)") and "then on node-b" in line
               for line in lines)
    assert "# nodes (as they reach each other): node-a node-b" in lines
    request = json.loads(lines[-1])
    assert request["launch"]["np"] == 2 and request["train"]["model"] == "tiny"
    assert not out_dir.exists() and not (tmp_path / "home").exists()


def test_more_nodes_than_the_hostfile_is_bad_input_before_any_connection(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node-a\nnode-b\n")
    r = cpudist("run", "synthetic", "--np", "3", "--ppn", "1", "--hostfile", hostfile, "--head",
                "192.0.2.1", "--model", "tiny", timeout=60)
    assert r.returncode == 2 and "needs 3 nodes but 2 are available" in r.stderr
