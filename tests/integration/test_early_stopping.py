"""Early stopping and the best model's metric, on real runs: 2 ranks on this machine (the default
launcher) and 2 namespace hosts under torchrun (tests/harness/netns.py). Every rank stops at the
same step (a rank that went on would hang its peer's next collective: the run would time out),
the saved model is the best evaluation's, the done line and result.json say why and where, and
nothing is left running. The data makes the best evaluation an early one: a tiny model learns the
training rows' rule, and the validation rows say the opposite."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.netns import NetnsCluster, missing_requirements
from tests.integration.helpers import CPUDIST, cmdline, cpudist, keyed_hosts

pytestmark = pytest.mark.slow


def inverted(folder: Path) -> tuple[Path, Path]:
    """Rows of 'alpha' are pos and of 'beta' neg in train.csv, the other way round in validation."""
    rng = random.Random(0)

    def rows(n: int, flip: bool) -> str:
        lines = ["text,label"]
        for i in range(n):
            word, label = ("alpha", "pos") if i % 2 == 0 else ("beta", "neg")
            if flip:
                label = "neg" if label == "pos" else "pos"
            lines.append(f"{' '.join([word] * rng.randint(2, 6))},{label}")
        return "\n".join(lines) + "\n"

    folder.mkdir(parents=True, exist_ok=True)
    train, validation = folder / "train.csv", folder / "validation.csv"
    train.write_text(rows(256, flip=False))
    validation.write_text(rows(64, flip=True))
    return train, validation


def args(data: Path, out: Path, *extra: str) -> list[str]:
    train, validation = inverted(data)
    return ["custom", "--train-file", str(train), "--validation-file", str(validation), "--model",
            "tiny", "--batch-size", "8", "--lr", "1e-3", "--max-steps", "60", "--eval-every", "4",
            "--output-dir", str(out), *extra]


def stopped_early(out: Path, said: str, patience: int) -> dict[str, Any]:
    """What every route shows of a run early stopping ended."""
    result = json.loads((out / "result.json").read_text())
    early, evals = result["early_stopping"], result["evaluations"]
    assert early and early["patience"] == patience and early["step"] == result["steps"] < 60, early
    assert [e["step"] for e in evals] == list(range(4, early["step"] + 1, 4))  # no final one again
    assert f"stopped early at step {early['step']}: {early['reason']}" in said
    assert result["save_model"] == "best" and result["model_step"] == early["best_step"]
    return result


def test_two_ranks_stop_together_at_the_same_step_keeping_the_best(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = cpudist("run", *args(tmp_path / "data", out, "--np", "2", "--early-stopping-patience", "2",
                             "--save-strategy", "eval"), timeout=600)
    assert r.returncode == 0, r.stderr
    result = stopped_early(out, r.stdout, 2)
    metric = result["metric_for_best_model"]
    assert metric == "accuracy" and result["greater_is_better"] is True
    scored = [e["metrics"][metric] for e in result["evaluations"]]
    assert scored[result["model_step"] // 4 - 1] == max(scored) == result["metrics"][metric]
    assert len(result["checkpoints"]["written"]) == len(scored)  # --save-strategy eval
    assert "stopped early" in (out / "model" / "README.md").read_text()  # the card says it too
    assert not [p for p in _pids() if str(out) in cmdline(p)]  # no rank left behind


def test_eval_loss_picks_the_lowest_and_patience_counts_it(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = cpudist("run", *args(tmp_path / "data", out, "--metric-for-best-model", "eval_loss",
                             "--early-stopping-patience", "1", "--save-model", "best"), timeout=600)
    assert r.returncode == 0, r.stderr
    result = stopped_early(out, r.stdout, 1)
    assert result["metric_for_best_model"] == "eval_loss" and result["greater_is_better"] is False
    losses = [e["metrics"]["eval_loss"] for e in result["evaluations"]]
    assert losses[-1] >= losses[-2] and result["model_step"] == 4 * (losses.index(min(losses)) + 1)
    assert result["metrics"]["eval_loss"] == min(losses)


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsCluster]:
    why = missing_requirements()
    if why is not None:
        pytest.skip(why)
    with keyed_hosts(2, tmp_path_factory.mktemp("early"), "ces") as c:
        yield c


def test_two_hosts_stop_together_and_leave_nothing(hosts: NetnsCluster, tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = [*CPUDIST, "run", *args(tmp_path / "data", out, "--launcher", "torchrun", "--hostfile",
                                   str(hosts.hostfile), "--np", "2", "--ppn", "1",
                                   "--early-stopping-patience", "2")]
    r = hosts.run(0, argv, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    result = stopped_early(out, r.stdout, 2)
    assert len(result["nodes"]) == 2
    left = [f"{hosts.name(i)}: {cmdline(p)[:80]}" for i in range(hosts.n) for p in hosts.pids(i)
            if p != hosts.sshd_pid(i) and cmdline(p)]
    assert left == []
