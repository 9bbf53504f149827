"""The time-to-accuracy ledger: one JSON line per finished run, so the plan is gathered in
stretches.

A line is skipped on a re-run when its key matches: (task, arm, hosts, seed, PROTOCOL, the CPU
kind). PROTOCOL names how this benchmark measures (budgets, targets, schedule, hosts, the arms'
meaning) and is bumped by hand when that changes, so a fix to a message or a new arm keeps what was
measured; each line also records its commit and a hash of the benchmark's files (`code`), so a
result names exactly what produced every run in it. Calibrations are lines too (kind "calibration"):
every arm of a task uses the first one this protocol made on this CPU kind, so arms gathered in
different sessions compare on one link. Machines of one CPU kind still differ in speed (virtual
machines on other hosts, other neighbours): every line records `speed_probe_s`, the stretch's timing
of one fixed training step, so that cells gathered on machines of other speeds are told apart.
"""

from __future__ import annotations

import functools
import hashlib
import json
import statistics
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cpudist.cpu import read_cpu

HERE = Path(__file__).resolve().parent
CODE_FILES = ("time_to_accuracy.py", "tta_ledger.py", "tta_hf.py", "tta_runs.py", "tta_summary.py",
              "miniature.py")
CPU_FLAGS = ("amx_bf16", "avx512_bf16", "avx2")
# bump when what a run measures changes (budgets, targets, evaluation schedule, layout)
PROTOCOL = "tta-2"


@dataclass(frozen=True)
class Cell:
    """One run of the plan."""

    task: str
    arm: str
    hosts: int
    seed: int

    def label(self) -> str:
        return f"{self.task} {self.arm} x{self.hosts} seed {self.seed}"


def code_hash() -> str:
    """A hash of the benchmark's files as they are on disk."""
    h = hashlib.sha256()
    for name in CODE_FILES:
        h.update(name.encode() + b"\0" + (HERE / name).read_bytes())
    return h.hexdigest()[:16]


def machine() -> dict[str, Any]:
    """The commit, and the CPU kind with the flags that decide it."""
    head = subprocess.run(["git", "-C", str(HERE), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout
    cpu = read_cpu()
    return {"commit": head.strip() or None, "cpu_kind": cpu.kind, "cpu_model": cpu.model,
            "cpu_flags": {f: f in cpu.flags for f in CPU_FLAGS}}


PROBE_ROWS, PROBE_TOKENS, PROBE_REPEATS = 16, 128, 5


@functools.cache
def speed_probe_s() -> float:
    """This machine's compute speed now: the median seconds of one MiniLM-shaped training step (16
    rows of 128 tokens, forward and backward, random weights, one thread) over 5 after a warm-up;
    timed once a process, at the start of its stretch, when nothing else computes."""
    import torch

    from cpudist.train.models import build_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model = build_model("minilm-l6", 2, False, 0.0)
        ids = torch.randint(1000, 20000, (PROBE_ROWS, PROBE_TOKENS))
        labels = torch.zeros(PROBE_ROWS, dtype=torch.long)
        times = []
        for _ in range(PROBE_REPEATS + 1):
            t0 = time.perf_counter()
            model(input_ids=ids, labels=labels).loss.backward()
            times.append(time.perf_counter() - t0)
            model.zero_grad(set_to_none=True)
        return round(statistics.median(times[1:]), 4)
    finally:
        torch.set_num_threads(threads)


class Ledger:
    """The JSONL file of one plan (its tag): read once, appended a line at a time."""

    def __init__(self, path: Path, code: str, cpu_kind: str) -> None:
        self.path, self.code, self.cpu_kind = path, code, cpu_kind
        lines = path.read_text().splitlines() if path.is_file() else []
        self.lines = [json.loads(line) for line in lines if line.strip()]

    def mine(self) -> list[dict[str, Any]]:
        """The lines this protocol wrote on this CPU kind."""
        return [x for x in self.lines if x.get("protocol") == PROTOCOL
                and x.get("cpu_kind") == self.cpu_kind]

    def done(self, cell: Cell) -> dict[str, Any] | None:
        return next((x for x in self.mine() if x.get("kind") == "run" and _cell(x) == cell), None)

    def calibration(self, task: str) -> dict[str, Any] | None:
        return next((x["calibration"] for x in self.mine() if x.get("kind") == "calibration"
                     and x["task"] == task), None)

    def runs(self, task: str) -> dict[str, list[dict[str, Any]]]:
        """This protocol's runs of a task on this CPU kind, by cell ('ARM@HOSTS'), seeds in
        order."""
        out: dict[str, list[dict[str, Any]]] = {}
        for x in sorted((x for x in self.mine() if x.get("kind") == "run" and x["task"] == task),
                        key=lambda x: x["seed"]):
            out.setdefault(f"{x['arm']}@{x['hosts']}", []).append(
                {**x["run"], "speed_probe_s": x.get("speed_probe_s")})
        return out

    def append(self, kind: str, **fields: Any) -> None:
        line = {"kind": kind, "protocol": PROTOCOL, "code": self.code, **machine(),
                "speed_probe_s": speed_probe_s(), **fields}
        self.lines.append(line)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(line) + "\n")


def _cell(x: dict[str, Any]) -> Cell:
    return Cell(x["task"], x["arm"], int(x["hosts"]), int(x["seed"]))


def estimate_s(cell: Cell, ledger: Ledger, budget: int, eval_every: int,
               base_sps: float | None) -> float:
    """Seconds the run should take: the median of this protocol's runs of the same arm and hosts on
    this CPU kind, else the budget at the task's 1-host speed (the calibration's) times 0.7 per
    added host, plus start and evaluation."""
    seen = sorted(float(x["elapsed_s"]) for x in ledger.mine() if x.get("kind") == "run"
                  and x["task"] == cell.task
                  and x["arm"] == cell.arm and x["hosts"] == cell.hosts and "elapsed_s" in x)
    if seen:
        return seen[len(seen) // 2]
    # 30 samples/s: MiniLM on a half-core host, roughly
    sps = (base_sps or 30.0) * (1 + 0.7 * (cell.hosts - 1))
    return 60.0 + budget / sps + 5.0 * (budget // eval_every)


def total_s(cells: Iterable[Cell], ledger: Ledger, plan: dict[str, dict[str, int]],
            speeds: dict[str, float | None]) -> float:
    return sum(estimate_s(c, ledger, plan[c.task]["budget"], plan[c.task]["eval_every"],
                          speeds.get(c.task))
               for c in cells)
