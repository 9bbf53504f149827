"""`cpudist launch --launcher slurm` under a real Slurm (tests/harness/slurm.py: slurmctld and a
slurmd on each of two network-namespace hosts, cpudist on host 0 as on a login node): the batch
script is submitted and followed, srun starts the wrapper on one rank per node, and the plain DDP
script has the losses of the same 2-rank DDP worked out in one process (test_launch_script.py checks
those against torchrun by hand), torchrun's variables from Slurm's numbering, and a ledger line
naming both nodes and the job."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import netns
from tests.harness import slurm as slurm_harness
from tests.harness.slurm import SlurmCluster
from tests.integration.test_launch_script import DDP_SCRIPT, losses
from tests.integration.test_launch_script_hosts import one_process_losses
from tests.integration.test_slurm import CPUDIST
from tests.integration.user_scripts import LEAVE

MISSING = netns.missing_requirements() or slurm_harness.missing_requirements()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(MISSING is not None, reason=str(MISSING))]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    with slurm_harness.on_namespace_hosts(2, tmp_path_factory.mktemp("slurm-hosts"),
                                          "sll") as cluster:
        yield cluster


def test_a_script_through_sbatch_on_two_nodes_has_ddps_losses(slurm: SlurmCluster,
                                                              tmp_path: Path) -> None:
    (tmp_path / "ddp.py").write_text(DDP_SCRIPT + LEAVE)
    tmp_path.chmod(0o755)
    out, ledger = tmp_path / "run", tmp_path / "ledger.jsonl"
    r = slurm.run(0,
                  [*CPUDIST, "launch", "--launcher", "slurm", "--nodes", "2", "--ppn", "1",
                   "--output-dir", str(out), "--ledger", str(ledger), "--workdir", str(tmp_path),
                   "--", "ddp.py"],
                  cwd=str(tmp_path), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    got = [float(loss) for _, loss in losses(r.stderr)]
    assert got == pytest.approx(one_process_losses(), abs=1e-6), r.stderr
    seen = {v["RANK"]: v
            for v in (json.loads(line.split("vars ", 1)[1]) for line in r.stderr.splitlines()
                      if "vars {" in line)}
    assert {k: (v["GROUP_RANK"], v["LOCAL_RANK"], v["WORLD_SIZE"], v["LOCAL_WORLD_SIZE"]) for k,
            v in seen.items()} \
        == {"0": ("0", "0", "2", "1"), "1": ("1", "0", "2", "1")}, r.stderr
    entry = json.loads(ledger.read_text())
    assert sorted(entry["nodes"]) == [slurm.hosts.name(0), slurm.hosts.name(1)]
    assert ((entry["launcher"], entry["world_size"], entry["task"]) == ("slurm", 2, "script")
            and entry["slurm_job_id"])
    assert "#SBATCH --nodes=2" in (out / "job.sbatch").read_text()
