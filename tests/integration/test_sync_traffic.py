"""Bytes per step between two namespace hosts, counted by their interfaces, for what the loop
decides.

test_sync_exchange counts each strategy's bytes where the strategy is called by hand; this runs
`cpudist run` across two hosts (one rank each, a real sshd each, tests/harness/netns.py), where
cpudist's loop decides when to exchange: once per optimizer step under --grad-accum (not per
micro-batch), every K-th step under local SGD, plain fp32 before PowerSGD compresses (its warm-up is
a share of the run's steps); the 16-bit wires halve the bytes whatever the loop does
(test_sync_exchange counts them). Each node's eth0 counter, read by the rank between barriers around
the training steps (`measured_tx_bytes_per_step`), must match what cpudist.traffic expects of the
strategy; the expectations are also pinned to the arithmetic of the case, so that a change in both
the strategy and its expectation shows.

Needs root, iproute2 and openssh-server (tests/harness/setup.sh installs them; CI runs as root).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cpudist.strategies import SyncSpec
from cpudist.traffic import payload_bytes, powersgd_values
from tests.harness.netns import NetnsCluster, missing_requirements
from tests.integration.helpers import CPUDIST, keyed_hosts

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(missing_requirements() is not None,
                                 reason=str(missing_requirements()))]

# Measured over the expected bytes: +0.2% to +0.4% for fp32 and 16-bit steps, +1.1% to +1.5% for
# PowerSGD's small messages: TCP/IP headers (veth offloads carry up to 64 KiB per counted packet),
# the peers' acknowledgements, and each step's all-reduced stop flag. 5% keeps room for all of it
# and still rejects a skipped or doubled exchange (-100%, +100%), an exchange per micro-batch
# (+100%), local SGD averaging every step (+120% here), and PowerSGD sending fp32 after its warm-up
# (x7.7) or nothing (-23%).
TOLERANCE = 0.05


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsCluster]:
    with keyed_hosts(2, tmp_path_factory.mktemp("hosts"), "cst") as c:
        yield c


def traffic(cluster: NetnsCluster, shared_data: Path, out: Path, steps: int,
            *sync: str) -> dict[str, Any]:
    r = cluster.run(0,
                    [*CPUDIST, "run", "mrpc", "--np", "2", "--ppn", "1", "--hostfile",
                     str(cluster.hostfile),
                     "--data-dir", str(shared_data / "glue" / "MRPC"), "--model", "tiny",
                     "--no-eval",
                     "--precision", "fp32", "--max-steps", str(steps), "--batch-size", "8",
                     "--output-dir",
                     # the most a case trains on
                     str(out), "--max-train-samples", "352", *sync], timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    assert len(result["tx_bytes_by_node"]) == 2, result  # both hosts counted
    # and what the run said (rank lines go to stderr)
    return {**result, "said": r.stdout + r.stderr}


def close(measured: float, expected: float) -> bool:
    return abs(measured / expected - 1) <= TOLERANCE


# Per case: options, steps, the bytes both nodes' interfaces send per step, and what a wrong loop
# would send instead; in gradient payloads g (fp32) and c (PowerSGD's): with 2 nodes a ring
# all-reduce has each node send one payload, so an fp32 exchange is 2 g for the pair.
Bytes = Any  # (g, c) -> bytes per step
CASES: dict[str, tuple[list[str], int, Bytes, dict[str, Bytes]]] = {
    "grad-accum": (["--grad-accum", "2", "--embedding-sync", "dense", "--grad-compression", "none"],
                   6, lambda g, c: 2 * g, {"an exchange per micro-batch": lambda g, c: 2 * 2 * g}),
    # 2 fp32 warm-up steps (10% of 20, at least 2), then 18 compressed ones
    "ddp+powersgd:1": (["--grad-compression", "powersgd:1"], 20, lambda g,
                       c: (2 * 2 * g + 18 * 2 * c) / 20,
                       {"fp32 after the warm-up": lambda g, c: 2 * g,
                        "nothing after the warm-up": lambda g, c: 2 * 2 * g / 20}),
    # 2 synchronous warm-up steps (one exchange each, whatever the micro-batches), then an average
    # of the parameters (a gradient's size) every 3rd of the 9 local steps
    "local-sgd:3": (["--sync", "local-sgd", "--sync-every", "3", "--local-sgd-warmup", "2",
                     "--grad-accum", "2"], 11,
                    lambda g, c: (2 + 3) * 2 * g / 11,
                    {"an average every step": lambda g, c: (2 + 9) * 2 * g / 11,
                     "a warm-up exchange per micro-batch": lambda g, c: (2 * 2 + 3) * 2 * g / 11}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_nodes_send_the_bytes_the_loop_should_exchange(two_hosts: NetnsCluster, shared_data: Path,
                                                       tmp_path: Path, case: str) -> None:
    options, steps, per_step, wrong = CASES[case]
    result = traffic(two_hosts, shared_data, tmp_path / "run", steps, *options)
    shapes = [tuple(s) for s in result["param_shapes"]]
    g = payload_bytes(shapes)
    c = 4 * sum(powersgd_values(s, SyncSpec().powersgd_rank) for s in shapes)
    # tiny's fp32 gradient, and PowerSGD's rank-1 share of it
    assert result["grad_bytes"] == g and c < g / 10
    expected, measured = result["expected_tx_bytes_per_step"], result["measured_tx_bytes_per_step"]
    assert math.isclose(expected, per_step(g, c), rel_tol=1e-9), (case, expected, per_step(g, c))
    assert close(measured, expected), (case, measured / expected, result["tx_bytes_by_node"])
    for what, other in wrong.items():  # the check can fail: it tells these apart
        assert not close(measured, other(g, c)), (case, what)


def test_ddp_across_nodes_sends_bf16_and_the_word_embedding_rows_the_steps_touched(
        two_hosts: NetnsCluster, shared_data: Path, tmp_path: Path) -> None:
    """The default ddp across nodes: --grad-compression auto is bf16 there (said before training),
    and DDP's buckets leave out the word embedding, whose touched rows follow
    (sync.EmbeddingRows)."""
    result = traffic(two_hosts, shared_data, tmp_path / "run", 6, "--grad-accum", "2")
    assert ("gradients cross the network in bf16 (--grad-compression auto"
            in result["said"]), result["said"][-3000:]
    assert result["sync"] == "ddp+bf16" and result["sync_options"]["grad_compression"] == "bf16"
    shapes = [tuple(s) for s in result["param_shapes"]]
    (vocab, dim), rest = shapes[0], shapes[1:]
    rows = result["embedding_rows_per_step"]
    # 2 ranks x 2 micro-batches x 8 MRPC pairs: a few hundred rows of 30,522
    assert 50 < rows < vocab / 20, rows
    # per node: a ring all-reduce's one payload of the other gradients and the rows in bf16, and the
    # rows' mask
    per_step = 2 * (payload_bytes(rest, "bf16") + 2 * round(rows) * dim + vocab)
    expected, measured = result["expected_tx_bytes_per_step"], result["measured_tx_bytes_per_step"]
    assert math.isclose(expected, per_step, rel_tol=1e-9), (expected, per_step)
    assert close(measured, expected), (measured / expected, result["tx_bytes_by_node"])
    fp32_rows = 2 * (payload_bytes(rest) + 4 * round(rows) * dim + vocab)
    # not dense
    assert payload_bytes(shapes) > 6 * per_step and not close(measured, 2 * payload_bytes(shapes))
    assert not close(measured, fp32_rows)  # nor fp32
