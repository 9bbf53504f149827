"""Gradient sync strategies train the model one rank would: real ranks, real gloo, compared step by step.

Every comparison holds the data fixed (same seed, same global batch, grouped batches that do not
depend on the split), turns dropout off and trains in fp32. Besides the loss, each step's gradient
norm (logged before clipping) is compared: an exchange that sums without dividing doubles it, one
that leaves a rank out changes it, even where AdamW's scale invariance would keep the losses close.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.helpers import cpudist

pytestmark = pytest.mark.slow

STEPS = 4


def run(shared_data: Path, out: Path, np_: int, *extra: str) -> list[dict[str, float]]:
    """Train tiny on MRPC and return its steps.jsonl rows."""
    args = ["run", "mrpc", "--data-dir", shared_data / "glue" / "MRPC", "--model", "tiny", "--max-steps", str(STEPS),
            "--dropout", "0", "--precision", "fp32", "--no-eval", "--lr", "1e-3", "--log-every", "1", "--seed", "5",
            "--np", str(np_), "--output-dir", out, *(["--oversubscribe"] if np_ > 2 else []), *extra]
    r = cpudist(*args)
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]


def same(a: list[dict[str, float]], b: list[dict[str, float]], tol: float) -> bool:
    return len(a) == len(b) == STEPS and all(
        abs(x[k] - y[k]) <= tol * abs(x[k]) for x, y in zip(a, b, strict=True) for k in ("loss", "grad_norm"))


@pytest.fixture(scope="module")
def one_rank(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, float]]:
    return run(shared_data, tmp_path_factory.mktemp("np1"), 1, "--batch-size", "16")


@pytest.mark.parametrize("np_", [2, 4])
@pytest.mark.parametrize("strategy", ["ddp", "allreduce", "gather-scatter"])
def test_synchronous_strategies_equal_one_rank(shared_data: Path, tmp_path: Path, one_rank: list[dict[str, float]],
                                               np_: int, strategy: str) -> None:
    steps = run(shared_data, tmp_path, np_, "--batch-size", str(16 // np_), "--sync", strategy)
    assert same(one_rank, steps, 1e-4), (one_rank, steps)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["sync"] == strategy and result["world_size"] == np_
    assert result["comm_time_s"] > 0 and result["bus_bandwidth_gbps"] > 0
    assert result["comm_bytes_per_step"] > 0 and result["expected_tx_bytes_per_step"] == 0  # one node


@pytest.mark.parametrize("compression", ["bf16", "powersgd:1"])
def test_compressed_ddp_across_many_buckets(shared_data: Path, tmp_path: Path, one_rank: list[dict[str, float]],
                                            compression: str) -> None:
    """Many small buckets in flight at once: the ranks must issue their collectives in one order.

    PowerSGD's first steps are plain fp32 all-reduces (its error feedback needs them), so step 1 is the
    one-rank step exactly; later steps only approximate it (bf16 rounding, a rank-1 approximation).
    """
    steps = run(shared_data, tmp_path, 2, "--batch-size", "8", "--grad-compression", compression,
                "--bucket-cap-mb", "0.05")
    assert len(steps) == STEPS and all(s["loss"] == s["loss"] for s in steps)  # ran every step, no NaN
    tol = 1e-4 if compression.startswith("powersgd") else 1e-2
    assert abs(steps[0]["loss"] - one_rank[0]["loss"]) <= tol * abs(one_rank[0]["loss"]), (one_rank, steps)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["sync"] == f"ddp+{compression}"


def test_local_sgd_averaging_every_step_equals_ddp_with_plain_sgd(shared_data: Path, tmp_path: Path) -> None:
    """K=1 with SGD: averaging the parameters after each step is averaging the gradients before it.

    Plain SGD and no clipping, because the equality needs an update linear in the gradient; AdamW
    normalizes each rank's step by its own moments, so no local SGD equals DDP under it.
    """
    common = ["--batch-size", "8", "--optimizer", "sgd", "--max-grad-norm", "0", "--lr", "0.5"]
    ddp = run(shared_data, tmp_path / "ddp", 2, *common)
    k1 = run(shared_data, tmp_path / "k1", 2, *common, "--sync", "local-sgd", "--sync-every", "1",
             "--local-sgd-warmup", "0")
    k2 = run(shared_data, tmp_path / "k2", 2, *common, "--sync", "local-sgd", "--sync-every", "2",
             "--local-sgd-warmup", "0")
    assert [s["loss"] for s in ddp] == pytest.approx([s["loss"] for s in k1], rel=1e-5)
    assert [s["loss"] for s in ddp] != pytest.approx([s["loss"] for s in k2], rel=1e-5)  # the check can fail


def test_diloco_with_outer_lr_one_and_no_momentum_is_local_sgd(shared_data: Path, tmp_path: Path) -> None:
    """The outer step applies the averaged change: lr 1 without momentum lands on the plain average."""
    common = ["--batch-size", "8", "--sync", "local-sgd", "--sync-every", "2", "--local-sgd-warmup", "1"]
    plain = run(shared_data, tmp_path / "plain", 2, *common)
    outer = run(shared_data, tmp_path / "outer", 2, *common, "--outer-optimizer", "nesterov", "--outer-lr", "1",
                "--outer-momentum", "0")
    assert same(plain, outer, 1e-5), (plain, outer)
    result = json.loads((tmp_path / "outer" / "result.json").read_text())
    assert result["sync"] == "diloco:2" and result["sync_options"]["outer_lr"] == 1


@pytest.mark.parametrize("strategy", ["ddp", "gather-scatter", "local-sgd"])
def test_accumulating_two_micro_batches_equals_one_batch_twice_as_big(shared_data: Path, tmp_path: Path,
                                                                      strategy: str) -> None:
    """--grad-accum 2 x batch 4 trains the steps of batch 8 (and exchanges once per step, not per micro-batch)."""
    sync = ["--sync", strategy, *(["--local-sgd-warmup", "2", "--sync-every", "2"] if strategy == "local-sgd" else [])]
    big = run(shared_data, tmp_path / "big", 2, "--batch-size", "8", *sync)
    accum = run(shared_data, tmp_path / "accum", 2, "--batch-size", "4", "--grad-accum", "2", *sync)
    assert same(big, accum, 1e-4), (big, accum)
    a, b = (json.loads((tmp_path / n / "result.json").read_text()) for n in ("big", "accum"))
    assert a["comm_bytes_per_step"] == b["comm_bytes_per_step"]
