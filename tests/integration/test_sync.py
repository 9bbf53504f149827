"""Gradient sync strategies train the model one rank would: real ranks, real gloo, compared step by
step.

Every comparison holds the data fixed (same seed, same global batch of 16, grouped batches that do
not depend on the split), turns dropout off and trains in fp32. Every step is compared, the loss
(computed before the step's exchange, on the model the earlier exchanges made) and the gradient norm
(logged after the exchange, before clipping): an exchange that sums without dividing doubles the
norm, one that leaves a rank out changes it, even where AdamW's scale invariance would keep the
losses close. A run with no exchange at all (2 ranks of local SGD that never average) is the
negative control: each check is shown to reject it. Element-by-element checks of each exchange, and
its bytes counted, are in test_sync_exchange.py.

Each run is a few processes that import torch (the training itself is well under a second), so runs
are few: one run per set of options in the module, on the fewest ranks a check needs, and a run with
--grad-accum 2 serves both the check of its exchange and that of accumulation.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.helpers import cpudist

pytestmark = pytest.mark.slow

STEPS = 6
# the global batch: 1 rank x 16, 2 x 8, 4 x 4; with --grad-accum 2, 2 ranks x 2 x 4 and 4 x 2 x 2
BATCH = 16
# fp32 paths: the ranks add the same numbers in another order than one rank does, which moves each
# sum by a few units of fp32's 2^-24 (measured: at most 2.3e-7 relative over 6 steps on 2 ranks,
# 9.6e-7 on 4); AdamW's first steps divide by the gradients' own size, so an element near zero can
# swing, and the next steps carry it on. 2^-16 (1.5e-5) leaves 16x room; no exchange moves the norm
# by 20% and more.
FP32 = 2.0**-16
# 16-bit wires: an exchange rounds each rank's gradient once to the wire's unit roundoff u (2^-8 for
# bf16's 8 significant bits, 2^-11 for fp16's 11) and their sum once: each element errs by at most u
# (|g_1| + |g_2|) / 2 + u |mean| (held element by element in test_sync_exchange.py). For the norm
# that is u (1 + R), R the ranks' norms over their mean's: 1 to 3 on most steps here, 17 where the
# ranks' gradients cancel (step 2 of seed 5, measured); the errors are not aligned, so the norm
# moved at most 1.6 u (bf16) and 0.5 u (fp16) on 3 seeds, and the losses far less (AdamW's first
# updates are the gradients' signs). 8 u bounds R <= 7 and catches no exchange (20% and more off
# from the first step).
WIRE = {"bf16": 8 * 2.0**-8, "fp16": 8 * 2.0**-11}
# No model saved, and 16 evaluation rows tokenized (none evaluated). The training rows stay all of
# MRPC's: which rows fill the first batch decides whether the ranks' halves differ at step 1 (240
# rows gave halves whose gradient norms were 1e-4 apart: no check could tell an exchange from none
# there).
ROWS = ("--max-eval-samples", "16", "--save-model", "none")
# Local SGD, DiLoCo and accumulation under them train with plain SGD and no clipping: an update
# linear in the gradient, so that averaging the parameters after every step is averaging the
# gradients before it.
SGD = ("--optimizer", "sgd", "--max-grad-norm", "0", "--lr", "0.5")
# One synchronous warm-up step, then an average every 2nd step (at 3 and 5)
LOCAL_SGD = ("--sync", "local-sgd", "--sync-every", "2", "--local-sgd-warmup", "1")


def run(shared_data: Path, out: Path, np_: int, *extra: str, home: Path) -> list[dict[str, float]]:
    """Train tiny on MRPC and return its steps.jsonl rows (`home`: the CPUDIST_HOME whose token
    cache it shares)."""
    args = ["run", "mrpc", "--data-dir", shared_data / "glue" / "MRPC", "--model", "tiny",
            "--max-steps", str(STEPS),
            "--dropout", "0", "--precision", "fp32", "--no-eval", "--lr", "1e-3", "--log-every",
            "1", "--seed", "5",
            "--lr-scaling", "none",  # one global batch split over 1, 2 or 4 ranks: one lr
            *ROWS, "--np", str(np_), "--output-dir", out, *(["--oversubscribe"] if np_ > 2 else []),
            *extra]
    r = cpudist(*args, env={"CPUDIST_HOME": str(home)})
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]


def split(np_: int, accum: int = 1) -> tuple[str, ...]:
    """The options that feed the global batch of 16 to `np_` ranks in `accum` micro-batches each
    step."""
    return ("--batch-size", str(BATCH // (np_ * accum)),
            *(("--grad-accum", str(accum)) if accum > 1 else ()))


def departures(a: list[dict[str, float]], b: list[dict[str, float]], key: str) -> list[float]:
    """Per step, how far b's `key` is from a's, relative to a's."""
    assert len(a) == len(b) == STEPS, (a, b)
    return [abs(x[key] - y[key]) / abs(x[key]) for x, y in zip(a, b, strict=True)]


def same(a: list[dict[str, float]], b: list[dict[str, float]], tol: float) -> bool:
    """Every step's loss and gradient norm within `tol` of each other (relative)."""
    return all(d <= tol for key in ("loss", "grad_norm") for d in departures(a, b, key))


class Runs:
    """`run` once per set of options in this module: tests that need the same run share it. Every
    run of the module shares one CPUDIST_HOME: MRPC is tokenized once, then each rank reads the
    token cache (nothing here reads the ledger; the cache's hits and misses are
    test_run_local.py's)."""

    def __init__(self, shared_data: Path, folders: pytest.TempPathFactory) -> None:
        self.shared_data, self.folders = shared_data, folders
        self.home = folders.mktemp("cpudist-home")
        self.done: dict[tuple[object, ...], Path] = {}

    def folder(self, np_: int, *extra: str) -> Path:
        if (np_, *extra) not in self.done:
            out = self.folders.mktemp("run")
            run(self.shared_data, out, np_, *extra, home=self.home)
            self.done[(np_, *extra)] = out
        return self.done[(np_, *extra)]

    def steps(self, np_: int, *extra: str) -> list[dict[str, float]]:
        return [json.loads(line)
                for line in (self.folder(np_, *extra) / "steps.jsonl").read_text().splitlines()]

    def result(self, np_: int, *extra: str) -> dict[str, Any]:
        return dict(json.loads((self.folder(np_, *extra) / "result.json").read_text()))


@pytest.fixture(scope="module")
def memo(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(shared_data, tmp_path_factory)


@pytest.fixture(scope="module")
def one_rank(memo: Runs) -> list[dict[str, float]]:
    return memo.steps(1, *split(1))


@pytest.fixture(scope="module")
def no_exchange(memo: Runs) -> list[dict[str, float]]:
    """2 ranks that never exchange: local SGD with no warm-up and an average due after the run
    (every rank steps on its own gradients, as DDP would with its all-reduce gone; the logged loss
    is still the mean)."""
    return memo.steps(2, *split(2), "--sync", "local-sgd", "--sync-every", "1000",
                      "--local-sgd-warmup", "0")


# (ranks, strategy, micro-batches per step). 2 ranks for ddp, accumulating (DDP's own accumulation:
# no_sync); 4 ranks for cpudist's own exchanges, allreduce and gather-scatter, where a mean that
# divides by 2 and not by the world size shows. Gather-scatter accumulates too: the loop's
# accumulation is the same for every strategy but DDP (Strategy.skip does nothing), so that run also
# checks accumulation, once, for allreduce and gather-scatter alike. Not run: allreduce on 2 ranks
# (its exchange, element by element on 2 ranks: test_sync_exchange.py), ddp on 4 (torch's
# DistributedDataParallel divides by its world size; cpudist's split over 4 ranks runs in both
# 4-rank cases), and ddp on 2 without accumulation: its exchange is test_sync_exchange.py's too,
# element by element, and the loop runs it here under each compressed wire and in PowerSGD's fp32
# warm-up, held to the one rank below.
SYNCHRONOUS = [(2, "ddp", 2), (4, "allreduce", 1), (4, "gather-scatter", 2)]


@pytest.mark.parametrize(("np_", "strategy", "accum"), SYNCHRONOUS)
def test_synchronous_strategies_equal_one_rank(memo: Runs, one_rank: list[dict[str, float]],
                                               np_: int, strategy: str, accum: int) -> None:
    steps = memo.steps(np_, *split(np_, accum), "--sync", strategy)
    result = memo.result(np_, *split(np_, accum), "--sync", strategy)
    assert (result["sync"] == strategy and result["world_size"] == np_
            and result["global_batch_size"] == BATCH)
    assert result["comm_time_s"] > 0 and result["bus_bandwidth_gbps"] > 0
    assert same(one_rank, steps, FP32), {k: departures(one_rank, steps, k)
                                         for k in ("loss", "grad_norm")}


def test_the_checks_reject_ranks_that_never_exchange(one_rank: list[dict[str, float]],
                                                    no_exchange: list[dict[str, float]]) -> None:
    """Step 1's loss comes before any exchange: it cannot tell; its gradient norm and every later
    step can."""
    assert departures(one_rank, no_exchange, "loss")[0] <= FP32
    assert departures(one_rank, no_exchange, "grad_norm")[0] > max(WIRE.values())
    assert (not same(one_rank, no_exchange, FP32)
            and not same(one_rank, no_exchange, max(WIRE.values())))


@pytest.mark.parametrize("wire", ["bf16", "fp16"])
def test_compressed_ddp_follows_fp32_ddp_to_the_wire_precision(memo: Runs,
                                                               one_rank: list[dict[str, float]],
                                                               no_exchange: list[dict[str, float]],
                                                               wire: str) -> None:
    """Held to the one rank that fp32 exchanges equal (within FP32, the test above; 2^-16 is far
    below either wire's bound). Many small buckets in flight at once, too: the ranks must issue
    their collectives in one order."""
    options = (*split(2), "--grad-compression", wire, "--bucket-cap-mb", "0.05")
    steps = memo.steps(2, *options)
    assert same(one_rank, steps, WIRE[wire]), {k: departures(one_rank, steps, k)
                                               for k in ("loss", "grad_norm")}
    assert not same(one_rank, steps, FP32)  # the wire rounded: further off than any fp32 exchange
    assert not same(one_rank, no_exchange, WIRE[wire])  # the check can fail
    assert memo.result(2, *options)["sync"] == f"ddp+{wire}"


def test_powersgd_is_fp32_ddp_in_its_warm_up_then_departs_far_less_than_no_exchange(
        memo: Runs, one_rank: list[dict[str, float]], no_exchange: list[dict[str, float]]) -> None:
    """PowerSGD's first steps are plain fp32 all-reduces (its error feedback needs them): the same
    numbers as DDP's, which are one rank's (within FP32). Then it sends a rank-1 approximation, with
    the error fed back into the next steps: its numbers leave those (a hook that silently
    all-reduces in fp32 would not) but stay far closer to them than ranks that never exchange (a
    hook that does nothing would not). Which tensors it reduces, and how, is checked tensor by
    tensor in test_sync_exchange.py: the gradient norm here is mostly the classifier's."""
    options = (*split(2), "--grad-compression", "powersgd:1", "--bucket-cap-mb", "0.05")
    steps = memo.steps(2, *options)
    start = 2  # max(2, 10% of the 6 steps), as cpudist.train.sync.spec_of sets it
    norm, loss = departures(one_rank, steps, "grad_norm"), departures(one_rank, steps, "loss")
    alone = departures(one_rank, no_exchange, "grad_norm")
    # the loss of step 3 precedes its exchange
    assert max(norm[:start] + loss[:start + 1]) <= FP32, (norm, loss)
    assert max(norm[start:]) > FP32, norm
    assert all(d <= 0.1 * a for d, a in zip(norm[start:], alone[start:], strict=True)), (
        norm, alone)
    assert memo.result(2, *options)["sync"] == "ddp+powersgd:1"


def test_local_sgd_averaging_every_step_equals_one_rank_with_plain_sgd(memo: Runs) -> None:
    """K=1 with SGD: averaging the parameters after each step is averaging the gradients before it,
    which is DDP's step and so one rank's on the whole batch (the equality above).

    Plain SGD and no clipping, because the equality needs an update linear in the gradient; AdamW
    normalizes each rank's step by its own moments, so no local SGD equals DDP under it.
    """
    one = memo.steps(1, *split(1), *SGD)
    k1 = memo.steps(2, *split(2), *SGD, "--sync", "local-sgd", "--sync-every", "1",
                    "--local-sgd-warmup", "0")
    k2 = memo.steps(2, *split(2), *SGD, *LOCAL_SGD)  # averages at 3 and 5 only
    assert [s["loss"] for s in one] == pytest.approx([s["loss"] for s in k1], rel=1e-5)
    # the check can fail
    assert [s["loss"] for s in one] != pytest.approx([s["loss"] for s in k2], rel=1e-5)


# DiLoCo's run at outer lr 1 accumulates 2 micro-batches a step: that one run checks both DiLoCo's
# outer step and accumulation under local SGD (its warm-up step's gradient mean and its local steps)
# against plain local SGD on the whole batch; a fault in either moves it off.
DILOCO = (*SGD, *LOCAL_SGD, "--outer-optimizer", "nesterov", "--outer-lr", "1", "--outer-momentum",
          "0")


def test_diloco_with_outer_lr_one_and_no_momentum_is_local_sgd(memo: Runs) -> None:
    """The outer step applies the averaged change: lr 1 without momentum lands on the plain average
    (averages at steps 3 and 5, both before logged steps)."""
    plain = memo.steps(2, *split(2), *SGD, *LOCAL_SGD)
    outer = memo.steps(2, *split(2, 2), *DILOCO)
    assert same(plain, outer, FP32), (plain, outer)
    result = memo.result(2, *split(2, 2), *DILOCO)
    assert result["sync"] == "diloco:2" and result["sync_options"]["outer_lr"] == 1


Run = tuple[int, tuple[str, ...]]  # ranks, options
# strategy: (the run of the batch twice as big, the run that accumulates 2 micro-batches a step)
ACCUMULATED: dict[str, tuple[Run, Run]] = {
    # the 1-rank batch of 16: ddp on 2 ranks and gather-scatter on 4 without accumulation are not
    # run (above)
    "ddp": ((1, split(1)), (2, (*split(2, 2), "--sync", "ddp"))),
    "gather-scatter": ((1, split(1)), (4, (*split(4, 2), "--sync", "gather-scatter"))),
    # DiLoCo at lr 1: local SGD
    "local-sgd": ((2, (*split(2), *SGD, *LOCAL_SGD)), (2, (*split(2, 2), *DILOCO))),
}


@pytest.mark.parametrize("strategy", list(ACCUMULATED))
def test_accumulating_two_micro_batches_equals_one_batch_twice_as_big(memo: Runs,
                                                                      strategy: str) -> None:
    """--grad-accum 2 trains the steps of the batch twice as big (the runs are those of the tests
    above; the ranks' rows over a step's micro-batches are their rows of the whole batch)."""
    (np_big, big_options), (np_accum, accum_options) = ACCUMULATED[strategy]
    big, accum = memo.steps(np_big, *big_options), memo.steps(np_accum, *accum_options)
    # its bytes, once per step, are counted in test_sync_traffic.py
    assert same(big, accum, FP32), (big, accum)
    assert memo.result(np_accum, *accum_options)["grad_accum"] == 2
