"""A 2-rank run says where rank 0's steps went, in parts that add up to the step, and
`cpudist report --anatomy` shows them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpudist.train.anatomy import PARTS
from tests.integration.helpers import cpudist

pytestmark = pytest.mark.slow


def test_two_ranks_step_anatomy_adds_up_and_is_reported(shared_data: Path, tmp_path: Path) -> None:
    run = tmp_path / "RUN"
    r = cpudist("run", "mrpc", "--data-dir", shared_data / "glue" / "MRPC", "--model", "tiny",
                "--np", "2", "--ppn", "2", "--max-steps", "8", "--max-train-samples", "256",
                "--max-eval-samples", "64", "--eval-every", "3", "--sync", "allreduce",
                "--save-model", "none", "--output-dir", run)
    assert r.returncode == 0, r.stderr
    a = json.loads((run / "result.json").read_text())["step_anatomy"]
    assert a["steps"] == 8 and all(a[k] >= 0 for k in PARTS)
    assert a["compute_s"] > 0 and a["sync_cpu_s"] > 0 and a["eval_s"] > 0
    assert a["wire_s"] + a["wait_s"] > 0
    assert a["sum_s"] == pytest.approx(sum(a[k] for k in PARTS))
    # step_s is measured apart: the loop's own clock over its steps
    assert a["sum_s"] == pytest.approx(a["step_s"], rel=0.05)
    shown = cpudist("report", run, "--anatomy")
    assert shown.returncode == 0, shown.stderr
    assert "where a step goes on rank 0" in shown.stdout and "wait for slowest" in shown.stdout
    assert f"{a['step_s']:.3f}" in shown.stdout and f"{a['compute_s']:.3f}" in shown.stdout
