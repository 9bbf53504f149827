"""`cpudist logs --head`: a run from the laptop (--hostfile with --head) read from the head's own
run folder over SSH, in the on-prem world of test_remote_onprem (two hosts with sshd, the laptop in
its own namespace)."""

from __future__ import annotations

import json

import pytest

from tests.harness.netns import missing_requirements
from tests.harness.world import World
from tests.integration.test_remote_onprem import CPUDIST, laptop_argv, site

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(missing_requirements() is not None,
                                 reason=str(missing_requirements()))]
__all__ = ["site"]  # the module-scoped world, set up once for this module

AS_RUN = ["--user", "root", "--identity", "/srv/cpd-operator/.ssh/id_ed25519"]


def test_logs_head_reads_the_heads_ranks_log_of_a_laptop_run(site: World) -> None:
    r = site.operator_run(laptop_argv(site, "logs-head", "--max-steps", "3", "--no-eval"),
                          timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    info = json.loads(site.operator_path("runs/logs-head/run.json").read_text())
    assert info["where"] == f"head:{site.hosts.public_addr(0)}" and info["state"] == "finished"
    result = json.loads(site.operator_path("runs/logs-head/result.json").read_text())
    remote_dir = result["staging"]["remote_run_dir"]
    on_head = site.hosts.run(0, ["cat", f"{remote_dir}/ranks.log"]).stdout
    assert "rank 1/2 ready" in on_head

    shown = site.operator_run([*CPUDIST, "logs", "--head", info["id"][:17], *AS_RUN], timeout=120)
    assert shown.returncode == 0 and shown.stdout == on_head, shown.stdout + shown.stderr
    followed = site.operator_run([*CPUDIST, "logs", "--head", "-f", "runs/logs-head", *AS_RUN],
                                 timeout=120)
    # a finished run: at once
    assert followed.returncode == 0 and followed.stdout == on_head, followed.stderr
    assert f"run {info['id']} is finished" in followed.stderr
    # what the laptop saw, with its steps
    local = site.operator_run([*CPUDIST, "logs", info["id"]], timeout=120)
    assert (local.returncode == 0 and "[cpudist] step 3/3" in local.stdout
            and "rank 1/2 ready" in local.stdout)
