"""--save-model best over a resumed run's parts, on a real rank: the second part saves the first
part's best model when its own evaluations score no higher (as one unbroken run would)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.helpers import cpudist

pytestmark = pytest.mark.slow


def _result(run: Path) -> dict[str, Any]:
    return json.loads((run / "result.json").read_text())


def _first_best(evaluations: list[tuple[int, float]]) -> int:
    """The step whose evaluation --save-model best keeps: the highest accuracy, the earliest of a
    tie."""
    return max(evaluations, key=lambda e: (e[1], -e[0]))[0]


def test_a_resumed_run_saves_the_best_of_all_its_parts(tmp_path: Path, shared_data: Path) -> None:
    """Part 1 evaluates at steps 2, 4 and 6 and checkpoints at each (after evaluating: step-2's meta
    holds its evaluation); part 2 resumes from step 4 and evaluates at 6 only. At lr 1e-6 the tiny
    model's scores tie, so the best is step 2's, from part 1: part 2's model/ must be part 1's, byte
    for byte, and say step 2."""
    run = tmp_path / "RUN"
    args = ("run", "mrpc", "--data-dir", shared_data / "glue" / "MRPC", "--model", "tiny", "--np",
            "1", "--max-steps", "6", "--eval-every", "2", "--checkpoint-every", "2",
            "--keep-checkpoints", "3", "--lr", "1e-6", "--save-model", "best",
            "--max-train-samples", "64", "--max-eval-samples", "32", "--output-dir", run,
            "--ledger", tmp_path / "ledger.jsonl")
    launched = time.time()
    r = cpudist(*args)
    assert r.returncode == 0, r.stderr
    first = _result(run)
    # wall clock at each evaluation's end (time to accuracy)
    ended = [e["at"] for e in first["evaluations"]]
    assert launched < ended[0] < ended[1] < ended[2] < time.time(), (launched, ended)
    scored = [(e["step"], e["metrics"]["accuracy"]) for e in first["evaluations"]]
    assert [s for s, _ in scored] == [2, 4, 6]
    meta = json.loads((run / "checkpoints" / "step-000002" / "meta.json").read_text())
    assert meta["best"] == first["evaluations"][0]  # evaluated before the checkpoint of its step
    shutil.copy(run / "model" / "model.safetensors", tmp_path / "part1.safetensors")

    r = cpudist(*args, "--resume", run / "checkpoints" / "step-000004")
    assert r.returncode == 0, r.stderr
    second = _result(run)
    assert [e["step"] for e in second["evaluations"]] == [6]  # this part's own
    best = _first_best([s for s in scored if s[0] <= 4]
                       + [(6, second["evaluations"][0]["metrics"]["accuracy"])])
    # the setting above makes it so
    assert best == 2 == first["model_step"], (scored, second["evaluations"])
    assert second["model_step"] == best and second["metrics"] == first["evaluations"][0]["metrics"]
    assert (run / "model" / "model.safetensors").read_bytes() == (
        tmp_path / "part1.safetensors").read_bytes()
