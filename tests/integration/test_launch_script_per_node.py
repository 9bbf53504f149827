"""`cpudist launch --per-node`: the launcher starts one process per node, which starts the script's
ranks under torchrun (`python -m torch.distributed.run`, for scripts that expect it): the plain DDP
script on 2 ranks of this machine has the losses of the same 2-rank DDP worked out in one process
(test_launch_script.py checks those against torchrun by hand), torchrun's own variables, and a
record of 2 ranks on 1 node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.helpers import cpudist
from tests.integration.test_launch_script import DDP_SCRIPT, losses
from tests.integration.test_launch_script_hosts import one_process_losses
from tests.integration.user_scripts import ACCELERATE_SCRIPT, LEAVE, STEP, accelerate_losses

pytestmark = pytest.mark.slow
# DDP_SCRIPT, and whether torchrun started it: torchrun (its elastic agent) names its run in every
# worker
SCRIPT = DDP_SCRIPT + '''
# one write: both workers share stdout
print(f"under torchrun {'TORCHELASTIC_RUN_ID' in os.environ}", flush=True)
''' + LEAVE


def test_one_torchrun_per_node_starts_the_ranks_with_ddps_losses(tmp_path: Path) -> None:
    (tmp_path / "ddp.py").write_text(SCRIPT)
    out, ledger = tmp_path / "run", tmp_path / "ledger.jsonl"
    r = cpudist("launch", "--np", "2", "--per-node", "--output-dir", out, "--ledger", ledger,
                "--workdir", tmp_path, "--", "python", "ddp.py", timeout=240)
    assert r.returncode == 0, r.stderr
    assert [float(loss) for _, loss in losses(r.stderr)] == pytest.approx(
        one_process_losses(), abs=1e-6), r.stderr
    assert r.stderr.count("under torchrun True") == 2, r.stderr
    seen = {v["RANK"]: v
            for v in (json.loads(line.split("vars ", 1)[1]) for line in r.stderr.splitlines()
                      if "vars {" in line)}
    assert {k: (v["LOCAL_RANK"], v["WORLD_SIZE"], v["LOCAL_WORLD_SIZE"], v["GROUP_RANK"]) for k,
            v in seen.items()} \
        == {"0": ("0", "2", "2", "0"), "1": ("1", "2", "2", "0")}, r.stderr
    command = (out / "command.txt").read_text()
    assert " -np 1 " in command and "--per-node 2" in command  # one process from the launcher
    entry = json.loads(ledger.read_text())
    assert (entry["world_size"], entry["ppn"], len(entry["nodes"])) == (2, 2, 1)
    # the node's cores shared
    assert list(entry["rank_threads"]) == [seen["0"]["threads"], seen["1"]["threads"]]


# The Accelerate loop, and whether `accelerate launch` started it (its launcher names the precision
# for every worker)
ACCELERATE = ACCELERATE_SCRIPT + '''
import os
print(f"under accelerate launch {os.environ.get('ACCELERATE_MIXED_PRECISION') is not None} "
      f"torchrun {'TORCHELASTIC_RUN_ID' in os.environ}", flush=True)
''' + LEAVE


def test_accelerate_launch_per_node_starts_the_ranks_with_the_loops_losses(tmp_path: Path) -> None:
    """`--per-node -- accelerate launch train.py`: one `accelerate launch` on the node, its machine
    count, rank, rendezvous and 2 processes from cpudist's layout; the loop's losses those of its
    2-process run worked out in one process (test_launch_accelerate.py checks the loop against
    torchrun by hand)."""
    pytest.importorskip("accelerate")  # the test extra installs it
    (tmp_path / "train.py").write_text(ACCELERATE)
    out, ledger = tmp_path / "run", tmp_path / "ledger.jsonl"
    r = cpudist("launch", "--np", "2", "--per-node", "--output-dir", out, "--ledger", ledger,
                "--workdir", tmp_path, "--metric-file", "metrics.json", "--", "accelerate",
                "launch", "train.py", timeout=240)
    assert r.returncode == 0, r.stderr
    assert [float(loss) for _, loss in STEP.findall(r.stderr)] == pytest.approx(
        accelerate_losses(), abs=1e-6), r.stderr
    assert all(f"state DistributedType.MULTI_CPU 2 {i}" in r.stderr for i in (0, 1)), r.stderr
    assert r.stderr.count("under accelerate launch True torchrun True") == 2, r.stderr
    command = (out / "command.txt").read_text()
    assert (" -np 1 " in command and "--per-node 2 " in command
            and command.endswith(" -- accelerate launch train.py\n"))
    entry = json.loads(ledger.read_text())
    assert (entry["world_size"], entry["ppn"], len(entry["nodes"]),
            entry["train_samples"]) == (2, 2, 1, 64)
