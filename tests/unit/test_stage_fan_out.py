"""The head's fan-out (run/stage.py fan_out_script), run for real with sh and tar: each "node" is a
folder of its own, reached through a stand-in for ssh that runs the command there (the head's home
path mapped to the node's). Every node checks what it receives and what it keeps, as the head
does."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from cpudist.run import stage, stage_scripts

SHIM = """#!/bin/sh
# ssh stand-in: ssh HOST COMMAND, run here with the head's home path mapped to the node's folder
host=$1; shift
cmd=$(printf '%s' "$*" | sed "s|$HEAD_HOME|$NODES/$host|g")
exec sh -c "$cmd"
"""


def _world(tmp_path: Path) -> tuple[stage.StageItem, Path, Path, dict[str, str]]:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "train.tsv").write_text("x\t1\n" * 2000)
    (src / "sub" / "dev.tsv").write_text("y\t0\n")
    it = stage.item("data", src)
    head = tmp_path / "head"
    r = subprocess.run(["sh", "-c", stage_scripts.receive_script(it.remote_dir(str(head)))],
                       input=stage.tar_bytes(it), capture_output=True)
    assert r.returncode == 0, r.stderr
    shim = tmp_path / "ssh"
    shim.write_text(SHIM)
    shim.chmod(0o755)
    env = {**os.environ, "HEAD_HOME": str(head), "NODES": str(tmp_path / "nodes")}
    return it, head, shim, env


def _fan_out(it: stage.StageItem, head: Path, shim: Path, env: dict[str, str]) -> list[str]:
    script = stage_scripts.fan_out_script([it.remote_dir(str(head))], ["n1", "n2"], str(shim))
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env,
                         timeout=120).stdout
    return sorted(line.split(" ")[0] + " " + line.split(" ")[1] for line in out.splitlines())


def test_fan_out_sends_once_then_repairs_only_the_damaged_node(tmp_path: Path) -> None:
    it, head, shim, env = _world(tmp_path)
    assert _fan_out(it, head, shim, env) == ["sent n1", "sent n2"]
    node_dir = {n: Path(it.remote_dir(str(tmp_path / "nodes" / n))) for n in ("n1", "n2")}
    for d in node_dir.values():
        assert (d / "train.tsv").read_text() == (it.local / "train.tsv").read_text()
        assert (d / stage_scripts.COMPLETE).is_file()
    assert _fan_out(it, head, shim, env) == ["have n1", "have n2"]  # a re-run copies nothing
    # a node's copy damaged after it was marked complete
    os.truncate(node_dir["n2"] / "sub" / "dev.tsv", 1)
    assert _fan_out(it, head, shim, env) == ["have n1", "sent n2"]
    assert (node_dir["n2"] / "sub" / "dev.tsv").read_text() == "y\t0\n"


def test_a_head_copy_that_no_longer_matches_its_digest_is_not_spread(tmp_path: Path) -> None:
    """A node refuses what the head sends when it does not match the folder's digest: `fail` per
    node, and no node marks a complete copy."""
    it, head, shim, env = _world(tmp_path)
    with (Path(it.remote_dir(str(head))) / "train.tsv").open("r+") as f:
        f.write("z")  # same size: only the bytes tell
    assert _fan_out(it, head, shim, env) == ["fail n1", "fail n2"]
    assert not list((tmp_path / "nodes").glob(f"*/.cpudist/stage/*/{stage_scripts.COMPLETE}"))
