"""What each --sync strategy makes of the ranks' gradients, element by element, and the bytes it
sends, counted.

Two real ranks over gloo run cpudist's strategies (tests/integration/exchange_ranks.py) and keep, at
every step, each rank's own gradients beside what the exchange gave it. The checks hold the exchange
to the rounding its wire format allows, so a strategy that skips the exchange, sums without
dividing, or leaves part of the gradients out fails; each check is also shown to reject such an
exchange. As root, the ranks run in a network namespace of their own, whose loopback counters then
hold this job's bytes only: every step's bytes are counted and held to what cpudist.traffic expects
of the strategy.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from cpudist.strategies import SyncSpec
from cpudist.traffic import expected_traffic, powersgd_values
from tests.integration.exchange_ranks import CASES, DEADLINE_S, STEPS, TOKEN_CASES

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
WORLD = 2
# Unit roundoff of each wire format: round to nearest with p significant bits errs by at most 2^-p
# of the value. bf16 keeps 8 bits, fp16 11, fp32 24.
U = {"none": 2.0**-24, "bf16": 2.0**-8, "fp16": 2.0**-11}
# Below the smallest normal number the spacing is fixed: half of it is the most a rounding there
# errs by (fp16's subnormals are 2^-24 apart, so gradients under 6e-5 round to multiples of it).
FLOOR = {"none": 2.0**-150, "bf16": 2.0**-134, "fp16": 2.0**-25}
# Loopback frames: Ethernet (14 bytes), IPv4 (20) and TCP with timestamps (32) around what the
# sockets sent.
HEADERS = 66
# Left over after headers: gloo's framing, a few hundred bytes per collective (measured 560-680 for
# a 2-rank all-reduce of any size); PowerSGD makes 3 per bucket and this model has up to 3 buckets:
# under 8 KiB a step.
SLACK_BYTES = 8192


def cannot_count() -> str | None:
    if os.geteuid() != 0:
        return "needs root (a network namespace of its own)"
    missing = [t for t in ("unshare", "ip", "ss") if shutil.which(t) is None]
    return (f"{', '.join(missing)} not installed (apt-get install util-linux iproute2)" if missing
            else None)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every case's records, each with `ranks`: the per-rank records side by side."""
    out = tmp_path_factory.mktemp("exchange")
    argv = [sys.executable, "-m", "tests.integration.exchange_ranks", str(out), str(WORLD)]
    counted = cannot_count() is None
    if counted:
        argv = ["unshare", "--net", "--", *argv, "count"]
    r = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=DEADLINE_S + 60,
                       env={**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    per_rank = [torch.load(out / f"rank{i}.pt", weights_only=True) for i in range(WORLD)]
    assert per_rank[0]["counted"] == counted
    return {phase: {case["name"]: {**case, "ranks": [p[phase][i] for p in per_rank]}
                    for i, case in enumerate(per_rank[0][phase])} for phase in ("exact", "wide")}


def f64(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.double() for t in tensors]


def within_rounding(got: list[torch.Tensor], owns: list[list[torch.Tensor]],
                    wire: str) -> tuple[bool, float]:
    """Is `got` the ranks' mean to the rounding of a 2-rank exchange on this wire? (ok, worst error
    / bound)

    Each rank casts its gradient to the wire (one rounding: u of |g_i|, for 16-bit wires) and halves
    it (exact, but for subnormals); gloo adds the halves in the wire format (one rounding: u of
    |sum|) and the sum comes back to fp32 exactly. So every element errs by at most u (|g_1| +
    |g_2|) / 2 + u |got| / (1 - u), plus the subnormal floor of each rounding; fp32 paths round the
    sum only. The ranks' own gradients come from a second backward pass, which may round a few
    products otherwise (BLAS kernels can depend on memory alignment): 4 units of fp32's 2^-24 of the
    gradients allow for it.
    """
    u, floor, casts = U[wire], FLOOR[wire], 0 if wire == "none" else 1
    worst = 0.0
    for g, *mine in zip(f64(got), *map(f64, owns), strict=True):
        mean = sum(mine) / len(mine)
        size = sum(m.abs() for m in mine) / len(mine)
        bound = (u * (casts * size + g.abs() / (1 - u)) + (casts + 2) * floor
                 # the own pass; the reference mean in fp64
                 + 4 * U["none"] * size + 2.0**-50 * mean.abs())
        worst = max(worst, float(((g - mean).abs() / bound).max()))
    return worst <= 1, worst


def exchanged(case: dict[str, Any],
              step: int) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    """(rank 0's gradients after the exchange, every rank's own) at `step` (from 1), checking all
    ranks agree."""
    got = [r["steps"][step - 1]["got"] for r in case["ranks"]]
    for other in got[1:]:
        assert all(torch.equal(a, b) for a,
                   b in zip(got[0], other, strict=True)), "the ranks hold other gradients"
    return got[0], [r["steps"][step - 1]["own"] for r in case["ranks"]]


@pytest.mark.parametrize(("name", "wire"),
                         [("ddp", "none"), ("allreduce", "none"), ("gather-scatter", "none"),
                          ("ddp+accum", "none"), ("ddp+bf16", "bf16"), ("ddp+fp16", "fp16"),
                          ("tokens:ddp", "none"), ("tokens:ddp+bf16", "bf16"),
                          ("tokens:ddp+accum", "none"), ("tokens:ddp+dense-emb", "none")])
def test_every_step_exchanges_the_mean_to_the_wire_rounding(ranks: dict[str, Any], name: str,
                                                            wire: str) -> None:
    case = ranks["exact"][name]
    for step in range(1, STEPS + 1):
        got, owns = exchanged(case, step)
        ok, worst = within_rounding(got, owns, wire)
        assert ok, f"step {step}: error {worst:.3g}x the {wire} rounding bound"
        # The check can fail: keeping one's own gradient (no exchange), or summing without dividing.
        assert not within_rounding(owns[0], owns,
                                   wire)[0], f"step {step}: the check accepts no exchange"
        assert not within_rounding([2 * g for g in got], owns,
                                   wire)[0], f"step {step}: it accepts a sum"
    if wire != "none":  # and the 16-bit wire really rounds: the fp32 bound rejects it
        assert not all(within_rounding(*exchanged(case, s), "none")[0] for s in range(1, STEPS + 1))


@pytest.mark.parametrize("name", ["tokens:ddp", "tokens:ddp+bf16", "tokens:ddp+accum"])
def test_ddp_sends_the_embedding_rows_some_rank_touched(ranks: dict[str, Any], name: str) -> None:
    case = ranks["exact"][name]
    vocab = case["shapes"][0][0]
    for step in range(1, STEPS + 1):
        _, owns = exchanged(case, step)
        touched = [set(own[0].ne(0).any(1).nonzero().flatten().tolist()) for own in owns]
        sent = [r["steps"][step - 1]["rows"] for r in case["ranks"]]
        # every rank sent the union of the rows the ranks' batches touched: not one rank's, not all
        # of them
        assert sent == [len(set.union(*touched))] * len(sent), (step, sent, touched)
        assert max(map(len, touched)) < sent[0] < vocab / 10, (step, sent)
    # DDP kept all of it
    assert ranks["exact"]["tokens:ddp+dense-emb"]["ranks"][0]["steps"][0]["rows"] is None


def test_local_sgd_exchanges_gradients_in_its_warm_up_only(ranks: dict[str, Any]) -> None:
    case = ranks["exact"]["local-sgd:2"]
    assert within_rounding(*exchanged(case, 1), "none")[0]  # the synchronous warm-up step
    for step in range(2, STEPS + 1):  # local steps keep each rank's own gradient
        for r in case["ranks"]:
            s = r["steps"][step - 1]
            assert all(torch.equal(a, b) for a, b in zip(s["got"], s["own"], strict=True)), step


def powersgd_reference(case: dict[str, Any], feedback: bool = True) -> list[float]:
    """Per compressed step, how far the exchange is from PowerSGD's rank-r reference, relative to
    fp32's bound.

    After its fp32 warm-up, PowerSGD leaves each rank the projection U U^T C of C, the mean over
    ranks of (own gradient + own error memory), onto r directions U; each rank's memory keeps what
    the last exchange left out of its part (own + memory - exchanged); the tensors it does not
    compress get C itself. U is PowerSGD's own (a power iteration finds it) but spans the columns of
    what came back: so what came back must have rank r and equal U U^T C for U its left singular
    vectors. Rounding: fp32 sums of up to max(n, m) products (P = sum M_i Q, Q = sum M_i^T P / N, P
    Q^T) err by at most that many units of 2^-24.
    """
    rank, start = case["spec"]["powersgd_rank"], SyncSpec().powersgd_start
    memory = [[torch.zeros(s, dtype=torch.float64) for s in case["shapes"]] for _ in case["ranks"]]
    worst = []
    for step in range(start + 1, STEPS + 1):
        got, owns = exchanged(case, step)
        got, owns = f64(got), [f64(o) for o in owns]
        mean_c = [torch.stack([owns[i][j] + memory[i][j] for i in range(WORLD)]).mean(0)
                  for j in range(len(got))]
        ratio = 0.0
        for shape, g, c in zip(case["shapes"], got, mean_c, strict=True):
            n, m = shape[0], math.prod(shape) // shape[0]
            tol = 4 * max(n, m) * U["none"]
            # compressed (PyTorch's rule, as cpudist.traffic)
            if powersgd_values(shape, rank) < math.prod(shape):
                left, sv, _ = torch.linalg.svd(g.reshape(n, m), full_matrices=False)
                r = min(n, m, rank)
                proj = left[:, :r] @ (left[:, :r].T @ c.reshape(n, m))
                ratio = max(ratio, float(sv[r:].max() / sv[0]) / tol if len(sv) > r else 0.0,
                            float((g.reshape(n, m) - proj).norm() / c.norm()) / tol)
            else:
                ratio = max(ratio, float((g - c).norm() / c.norm()) / tol)
        worst.append(ratio)
        if feedback:
            memory = [[o + mm - g for o, mm, g in zip(owns[i], memory[i], got, strict=True)]
                      for i in range(WORLD)]
    return worst


def flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.double().flatten() for t in tensors])


@pytest.mark.parametrize("name", ["ddp+powersgd:1", "ddp+powersgd:4"])
def test_powersgd_sends_its_low_rank_projection_with_error_feedback(ranks: dict[str, Any],
                                                                    name: str) -> None:
    case = ranks["exact"][name]
    start = SyncSpec().powersgd_start
    for step in range(1, start + 1):  # its warm-up steps are a plain fp32 all-reduce
        assert within_rounding(*exchanged(case, step), "none")[0], step
    worst = powersgd_reference(case)
    assert len(worst) == STEPS - start >= 2 and max(worst) <= 1, worst
    got, owns = exchanged(case, start + 1)
    mean = (flat(owns[0]) + flat(owns[1])) / 2
    assert not within_rounding(got, owns, "none")[0]  # it compressed: not the plain mean
    # rank 1 of rank-4 gradients (2 rows on each of 2 ranks) is far from their mean
    if name.endswith(":1"):
        assert float((flat(got) - mean).norm()) > 0.1 * float(mean.norm())
        # The check can fail: forgetting the error memory shows from the second compressed step on
        # (at rank 4 the projection loses next to nothing, so the memory stays next to zero).
        assert max(powersgd_reference(case, feedback=False)[1:]) > 1
    # and a hook that keeps each rank's own gradient is no rank-r projection of the mean
    assert not powersgd_holds({**case, "ranks": [own_as_exchanged(r) for r in case["ranks"]]})


def own_as_exchanged(rank_record: dict[str, Any]) -> dict[str, Any]:
    return {**rank_record, "steps": [{**s, "got": s["own"]} for s in rank_record["steps"]]}


def powersgd_holds(case: dict[str, Any]) -> bool:
    try:
        return max(powersgd_reference(case)) <= 1
    except AssertionError:  # the ranks hold other gradients
        return False


def counted(window: tuple[int, int, int], idle: float) -> float:
    """What the sockets sent in a window (bytes less packet headers and what TCP sent twice), less
    what its barrier sends."""
    return window[0] - HEADERS * window[1] - window[2] - idle


def close(got: float, expected: float) -> bool:
    return abs(got - expected) <= 0.01 * expected + SLACK_BYTES


def step_bytes(case: dict[str, Any]) -> list[list[float]]:
    """Per step, the bytes counted in each window: the micro-batches', then the optimizer step's."""
    if case["ranks"][0]["steps"][0]["after_sent"] is None:
        pytest.skip(f"bytes not counted: {cannot_count()}")
    idle = max(counted(w, 0) for w in case["ranks"][0]["idle_sent"])
    return [[counted(w, idle) for w in [*s["micro_sent"], s["after_sent"]]]
            for s in case["ranks"][0]["steps"]]


def expected_bytes(case: dict[str, Any], steps: int) -> float:
    """What loopback carries over `steps` steps by cpudist.traffic: every rank sends what the
    busiest one does (with 2 ranks, gather-scatter's rank 1 sends its gradient and rank 0 the mean:
    one payload each). A case that sent embedding rows: each step's rows as the embedding's shape,
    and its touched-row mask (a byte a row)."""
    spec = SyncSpec(**case["spec"])
    rows = [s["rows"] for s in case["ranks"][0]["steps"][:steps]]
    if steps and rows[0] is not None:
        (vocab, *dim), *rest = case["shapes"]
        return sum(WORLD
                   * expected_traffic(spec, [(n, *dim), *rest], WORLD, WORLD, 1, vocab).rank_send
                   for n in rows)
    return WORLD * expected_traffic(spec, case["shapes"], WORLD, WORLD,
                                    steps).rank_send * steps if steps else 0.0


@pytest.mark.parametrize("name",
                         [name for name, _, _ in CASES + TOKEN_CASES
                          if not name.startswith("local-sgd")])
def test_every_step_sends_the_bytes_of_its_strategy(ranks: dict[str, Any], name: str) -> None:
    case = ranks["wide"][name]
    windows = step_bytes(case)
    # the rows, not the embedding DDP would send
    if name.startswith("tokens:") and not name.endswith("dense-emb"):
        dense = expected_bytes(ranks["wide"]["tokens:ddp+dense-emb"], 1)
        assert (not close(windows[0][-2], dense)
                and expected_bytes(case, 1) < dense / 50), (windows[0], dense)
    for step, (*micro, after) in enumerate(windows, start=1):
        expected = expected_bytes(case, step) - expected_bytes(case, step - 1)
        assert close(micro[-1], expected), (step, micro, expected)
        assert all(close(w, 0) for w in [*micro[:-1], after]), \
            f"step {step}: bytes outside the exchange {windows}"
        # The check can fail: a skipped exchange, a doubled one, or one per micro-batch.
        assert not close(0, expected) and not close(2 * expected, expected), expected
        assert case["micro"] == 1 or not close(sum(micro), case["micro"] * expected)
    plain = expected_bytes(ranks["wide"]["tokens:ddp" if name.startswith("tokens:") else "ddp"], 1)
    # half the bytes (but the rows' one-byte mask, which stays as it is)
    if "bf16" in name or "fp16" in name:
        half = plain / 2 if not name.startswith("tokens:") else expected_bytes(case, 1)
        assert close(windows[0][0], half) and not close(windows[0][0], plain)


def test_local_sgd_sends_gradients_in_warm_up_then_parameters_every_k_steps(
        ranks: dict[str, Any]) -> None:
    case = ranks["wide"]["local-sgd:2"]
    windows = step_bytes(case)
    model = expected_bytes(ranks["wide"]["ddp"], 1)  # the parameters weigh what the gradients do
    # warm-up 1 step (gradients), then an average every 2nd step (parameters, after the optimizer's
    # step)
    pattern: list[list[float]] = [[model, 0], [0, 0], [0, model], [0, 0], [0, model]]
    assert all(close(w, e) for ws, es in zip(windows, pattern, strict=True) for w,
               e in zip(ws, es, strict=True)), \
        windows
    assert close(sum(map(sum, windows)), expected_bytes(case, STEPS))
    # not every step
    assert not close(sum(map(sum, windows)), expected_bytes(ranks["wide"]["ddp"], STEPS))
