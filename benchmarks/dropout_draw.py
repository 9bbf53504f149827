"""cpudist's dropout masks from torch's generator (as before) against from numpy's SFC64 (cpudist's
now).

    python benchmarks/dropout_draw.py [--repeats 5] [--steps 7]

A mask's random words are drawn serially whatever torch.get_num_threads() says, so once the matrix
products use every core the masks are what is left (`aten::random_` was 23% of a bert-base LoRA step
in bf16 on 4 AMX cores, benchmarks/results/lora-step-profile-amx-bf16-bert-base-bf16.txt). Arms,
alternated within each repeat, both through `cpudist.train.dropout.keep_mask` (16-bit lanes of
64-bit words): `torch` (the words from torch's `random_` on the default generator, cpudist's draw
until 2026-11-28) and `sfc64` (`random_words`: numpy's SFC64 seeded by one draw of the default
generator, for every mask of SFC64_FROM words or more, as all of these are).

1. The masks of one bert-base step's dropouts (32 rows x 56 tokens: 26 hidden-state masks [32, 56,
   768], 12 attention masks [32, 12, 56, 56]; with LoRA's adapter dropout, 60 more over [32, 56,
   768] and 12 over [32, 56, 3072]) at 1 thread and at every core: milliseconds, median of
   --repeats.
2. Whole training steps (lora_step_profile.py's: bert-base, 32 x 56 tokens, fused AdamW, cpudist's
   dropout, this CPU's default precision) at every core, full fine-tuning and LoRA with adapter
   dropout 0.1: median of --steps.

Results: benchmarks/results/dropout-draw-<cpu kind>.{json,md}, with the command.
"""

from __future__ import annotations

import argparse
import functools
import json
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from cpudist.cpu import read_cpu
from cpudist.train import dropout as fd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lora_step_profile import PRESETS, make

RESULTS = Path(__file__).resolve().parent / "results"
# torch's draw (cpudist's for every mask until 2026-11-28) against random_words (SFC64 for these
# lengths)
ARMS = (("torch", fd.torch_words), ("sfc64", fd.random_words))
HIDDEN, ATTENTION, FFN = (32, 56, 768), (32, 12, 56, 56), (32, 56, 3072)
STEP_MASKS = {"bert-base dropouts": [HIDDEN] * 26 + [ATTENTION] * 12,
              "bert-base dropouts + LoRA's adapters": [HIDDEN] * 26 + [ATTENTION] * 12 + [HIDDEN]
              * 60 + [FFN] * 12}


def timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def masks(shapes: Sequence[tuple[int, ...]]) -> None:
    for shape in shapes:
        fd.keep_mask(torch.Size(shape), 0.1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="bert-base")
    a = ap.parse_args()
    cpu = read_cpu()
    cores = torch.get_num_threads()
    res: dict[str, Any] = {"command": shlex.join(["python", *sys.argv]), "cpu": cpu.model,
                           "cpu_kind": cpu.kind, "torch": torch.__version__, "threads": cores,
                           "masks_ms": {}, "step_ms": {}}
    for name, shapes in STEP_MASKS.items():
        for threads in sorted({1, cores}):
            torch.set_num_threads(threads)
            times: dict[str, list[float]] = {arm: [] for arm, _ in ARMS}
            for r in range(a.repeats + 1):
                for arm, draw in ARMS:
                    fd.random_words = draw
                    t = timed(functools.partial(masks, shapes))
                    if r:  # the first round warms the allocator
                        times[arm].append(t * 1000)
            res["masks_ms"][f"{name}, {threads} thread(s)"] = times
            print(f"{name}, {threads} thread(s): torch {statistics.median(times['torch']):.1f} ms, "
                  f"sfc64 {statistics.median(times['sfc64']):.1f} ms", flush=True)
    torch.set_num_threads(cores)
    bf16 = cpu.has_bf16
    x, y = torch.randint(1000, 20000, (32, 56)), torch.randint(0, 2, (32,))
    for arm_name, lora_dropout in (("full", None), ("lora, adapter dropout 0.1", 0.1)):
        model, opt = make(PRESETS[a.preset], lora_dropout, True)

        def step(model: Any = model, opt: torch.optim.Optimizer = opt) -> None:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = model(input_ids=x, labels=y).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        times = {arm: [] for arm, _ in ARMS}
        for r in range(a.steps + 2):
            for arm, draw in ARMS:
                fd.random_words = draw
                t = timed(step)
                if r >= 2:
                    times[arm].append(t * 1000)
        res["step_ms"][arm_name] = times
        print(f"{a.preset} {arm_name} step: torch {statistics.median(times['torch']):.0f} ms, "
              f"sfc64 {statistics.median(times['sfc64']):.0f} ms", flush=True)
    res["precision"] = "bf16" if bf16 else "fp32"
    stem = RESULTS / f"dropout-draw-{cpu.kind}"
    stem.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")
    stem.with_suffix(".md").write_text(markdown(res))
    print(markdown(res))


def markdown(res: dict[str, Any]) -> str:
    lines = [f"# Dropout masks from torch's generator against numpy's SFC64 ({res['cpu_kind']})",
             "",
             f"`{res['command']}`", "",
             f"CPU: {res['cpu']}; torch {res['torch']}; steps in {res['precision']} on "
             f"{res['threads']} thread(s).",
             "",
             "| what | torch's draw, ms (median; min-max) | SFC64, ms (median; min-max) | torch / "
             "SFC64 |",
             "|---|---|---|---|"]
    for section in ("masks_ms", "step_ms"):
        for name, t in res[section].items():
            s, c = statistics.median(t["torch"]), statistics.median(t["sfc64"])
            label = (name if section == "masks_ms"
                     else f"a training step: {name}, {res['threads']} thread(s)")
            lines.append(f"| {label} | {s:.1f} ({min(t['torch']):.1f}-{max(t['torch']):.1f}) | "
                         f"{c:.1f} ({min(t['sfc64']):.1f}-{max(t['sfc64']):.1f}) | {s / c:.2f}x |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
