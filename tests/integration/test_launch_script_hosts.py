"""`cpudist launch --hostfile` on two network-namespace hosts (tests/harness/netns.py, a real sshd
each; cpudist on host 0, the head): one rank per host through MPICH's Hydra (the default launcher),
each rank with torchrun's variables (GROUP_RANK its host's number) and the losses of the same 2-rank
DDP worked out in one process (on one machine tests/integration/test_launch_script.py checks them
against torchrun by hand). torchrun across hosts ran the same (55 s on a loaded 2-core machine) and
is left out to keep CI short. The hosts share this machine's filesystem, as nodes on NFS do."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.netns import NetnsCluster, missing_requirements
from tests.integration.helpers import CPUDIST, keyed_hosts
from tests.integration.test_launch_script import DDP_SCRIPT, losses
from tests.integration.user_scripts import LEAVE

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(missing_requirements() is not None,
                                 reason=str(missing_requirements()))]


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsCluster]:
    with keyed_hosts(2, tmp_path_factory.mktemp("launch"), "cls") as c:
        yield c


def one_process_losses() -> list[float]:
    """DDP_SCRIPT's mean loss per step on 2 ranks, worked out in one process: each step's gradient
    is the mean of the two ranks' (equal row counts), which is the gradient of their mean loss."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)
    out = []
    for step in range(4):
        rank_losses = [
            torch.nn.functional.mse_loss(model(x[slice(step * 16 + r, (step + 1) * 16, 2)]),
                                         y[slice(step * 16 + r, (step + 1) * 16, 2)])
            for r in (0, 1)]
        mean = (rank_losses[0] + rank_losses[1]) / 2
        opt.zero_grad()
        mean.backward()
        opt.step()
        out.append(mean.item())
    return out


def test_one_rank_per_host_with_torchruns_variables_and_ddps_losses(hosts: NetnsCluster,
                                                                    tmp_path: Path) -> None:
    (tmp_path / "ddp.py").write_text(DDP_SCRIPT + LEAVE)
    tmp_path.chmod(0o755)
    out = tmp_path / "run"
    r = hosts.run(0,
                  [*CPUDIST, "launch", "--np", "2", "--ppn", "1", "--hostfile", str(hosts.hostfile),
                   "--output-dir", str(out), "--ledger", str(tmp_path / "ledger.jsonl"),
                   "--workdir", str(tmp_path), "--", "python", "ddp.py"], timeout=240)
    assert r.returncode == 0, r.stderr
    assert [int(step) for step, _ in losses(r.stderr)] == [0, 1, 2, 3], r.stderr
    assert ([float(loss) for _, loss in losses(r.stderr)]
            == pytest.approx(one_process_losses(), abs=1e-6))
    seen = {v["RANK"]: v
            for v in (json.loads(line.split("vars ", 1)[1]) for line in r.stderr.splitlines()
                      if "vars {" in line)}
    assert {k: (v["GROUP_RANK"], v["LOCAL_RANK"], v["WORLD_SIZE"], v["LOCAL_WORLD_SIZE"])
            for k, v in seen.items()} \
        == {"0": ("0", "0", "2", "1"), "1": ("1", "0", "2", "1")}, r.stderr
    entry = json.loads((tmp_path / "ledger.jsonl").read_text())
    assert sorted(entry["nodes"]) == sorted([hosts.name(0),
                                             hosts.name(1)]) and entry["world_size"] == 2
    assert (entry["launcher"] == "mpich"
            and json.loads((out / "run.json").read_text())["where"].startswith("hostfile"))
