"""Two real ranks over gloo: the same initial model, different dropout noise (seed + rank, like HF
Trainer)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from cpudist.launch.tools import free_port

RANK = r"""
import json, os, sys, torch, torch.distributed as dist
from cpudist.train.setup import setup
from cpudist.config import TrainConfig
from cpudist.train.dist import discover_rank, shutdown_distributed
cfg = TrainConfig(task="synthetic", output_dir=sys.argv[1], model="tiny", synthetic_samples=64,
                  max_seq_len=16)
job = setup(cfg, discover_rank(os.environ))
module = getattr(job.model, "module", job.model)
params = [p.detach().flatten()[:4].tolist() for p in module.parameters()]
noise = torch.rand(6).tolist()  # what dropout draws from next
out = [None] * dist.get_world_size()
dist.all_gather_object(out, {"params": params, "noise": noise})
if dist.get_rank() == 0:
    print(json.dumps(out))
del job, module
shutdown_distributed()
"""


def test_same_init_different_noise_per_rank(tmp_path: Path) -> None:
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(tmp_path)], stdout=subprocess.PIPE,
                              text=True,
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    zero, one = json.loads(outs[0].strip().splitlines()[-1])
    assert zero["params"] == one["params"]
    assert zero["noise"] != one["noise"]
    for rank, got in enumerate((zero, one)):  # exactly seed + rank, so a rerun draws the same noise
        torch.manual_seed(42 + rank)
        assert got["noise"] == torch.rand(6).tolist()
