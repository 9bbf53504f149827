"""Training speed of one node: cpudist vs Hugging Face Trainer (best CPU settings) vs the blog's,
and each lever.

    # MRPC subset, short bert-base run, 3 alternated repeats
    python benchmarks/throughput.py --quick
    # MRPC 3 epochs with dev metrics, bert-base 12 steps
    python benchmarks/throughput.py
    python benchmarks/throughput.py --quick --suites levers-minilm,levers-bert-base,eval

Suites (each writes results/throughput-<suite>[-quick]-<cpu kind>.json and .md, with the command):
  mrpc-minilm, bert-base   ours (`cpudist run` defaults, 1 node) vs hf_best vs blog
  levers-minilm, levers-bert-base
                           each lever as its own arm on top of `bare` (every lever off), beside
                           hf_best and ours: ranks x threads, tcmalloc, jemalloc, Intel OpenMP,
                           torch.compile, frozen embeddings, cheaper dropout masks, the first-token
                           last layer
  eval                     evaluation alone: grad mode, eval batch, precision, row order
  mfu                      bert-base on full 128-token rows vs a measured GEMM ceiling in its
                           precision
  presets                  every real-size preset (random init; --presets picks some): ours vs
                           hf_best, samples/s and each process's peak RSS (one rank; its whole
                           training process); --gradient-checkpointing adds both with activation
                           checkpointing (ours-gc, hf_best-gc)
  parity-minilm            dev accuracy of ours vs hf_best, MRPC 3 epochs (also with --quick), a
                           seed per repeat
  lora-minilm, lora-bert-base
                           `--peft lora` beside full fine-tuning (ours, hf_best): the default LoRA
                           (every Linear, dropout 0.1), the same with dropout 0, and query/value
                           only (LORA_ARMS)

Arms of a suite alternate inside every repeat, so drifts of the machine hit every arm alike; ratios
are of median steady samples/s (min-max beside them). The CPU kind (amx-bf16, avx512-bf16, avx512,
avx2) is in every file name and body: results of different CPUs sit side by side.
  hf_best  Trainer(use_cpu, bf16 where the CPU has it, group_by_length, DataCollatorWithPadding)
  blog     Trainer in fp32 with every row padded to 128 (run_glue.py --max_seq_length 128)
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MRPC = HERE.parent.parent / "shared" / "data" / "glue" / "MRPC"
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
# Every lever off: what each lever is measured against.
BARE: dict[str, str | None] = {"allocator": "none", "openmp": "gnu", "torch-dropout": None,
                               "full-last-layer": None}
LEVERS: dict[str, dict[str, str | None]] = {
    # 2 ranks x 1 thread, same global batch + lr
    "ranks-2x1": {"np": "2", "half-batch": None, "lr-scaling": "none"},
    # the same, DDP all-reducing the whole word embedding (ddp before --embedding-sync rows became
    # its default)
    "ranks-2x1-dense-emb": {"np": "2", "half-batch": None, "lr-scaling": "none",
                            "embedding-sync": "dense"},
    "tcmalloc": {"allocator": "tcmalloc"},
    "jemalloc": {"allocator": "jemalloc"},
    "intel-openmp": {"openmp": "intel"},
    "compile": {"compile": None},
    "freeze-embeddings": {"freeze-embeddings": None},
    # Click takes the last of --torch-dropout/--fast-dropout
    "fast-dropout": {"fast-dropout": None},
    "first-token-last-layer": {"first-token-last-layer": None},
}
# The lora-* suites: what a LoRA step costs beside full fine-tuning (ours, hf_best), by what LoRA
# adapts and its dropout
LORA_ARMS: dict[str, dict[str, str | None]] = {
    # the default: every Linear of the layers, no dropout on the adapters' input (0.1 until
    # 2026-11-28: the result files of before name that arm ours-lora and the one without dropout
    # ours-lora-dropout-0)
    "ours-lora": {"peft": "lora"},
    "ours-lora-dropout-0.1": {"peft": "lora", "lora-dropout": "0.1"},
    "ours-lora-qv": {"peft": "lora", "lora-targets": "query,value"},
}
# --without LEVER: an arm of `ours` with that default lever turned off, beside `ours` (what the
# lever adds to it).
OFF: dict[str, dict[str, str | None]] = {"first-token-last-layer": {"full-last-layer": None},
                                         "fast-dropout": {"torch-dropout": None},
                                         "allocator": {"allocator": "none"}}


def cpu() -> Any:
    from cpudist.cpu import read_cpu

    return read_cpu()


def run_json(cmd: list[str]) -> dict[str, Any]:
    print("$", shlex.join(cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    try:
        return json.loads(out)  # cpudist run --json: one indented object
    except json.JSONDecodeError:
        return json.loads(out.strip().splitlines()[-1])  # hf_trainer.py: a JSON line after the logs


def flags(opts: dict[str, str | None]) -> list[str]:
    return [x for k, v in opts.items() for x in ((f"--{k}",) if v is None else (f"--{k}", v))]


def ours(model: str, common: dict[str, str], eval_: bool,
         extra: dict[str, str | None]) -> dict[str, Any]:
    opts: dict[str, str | None] = {**common, **extra}
    if "half-batch" in opts:  # more ranks, same global batch
        del opts["half-batch"]
        opts["batch-size"] = str(int(common["batch-size"]) // int(opts.get("np") or 1))
    opts.setdefault("np", "1")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["cpudist", "run", "mrpc", "--data-dir", str(MRPC), "--model", model, "--output-dir",
               f"{tmp}/run", "--ledger", f"{tmp}/ledger.jsonl", "--json", "--quiet", *flags(opts)]
        if not eval_:
            cmd.append("--no-eval")
        r = run_json(cmd)
        steps = [json.loads(line)
                 for line in Path(f"{tmp}/run/steps.jsonl").read_text().splitlines()]
    # the steps steady_samples_per_s keeps
    from cpudist.train.loop import WARMUP_STEPS_EXCLUDED as k

    # (with --compile it also drops compiling steps; not here)
    kept = steps[k:] if len(steps) > 2 * k else steps
    return {"steady_samples_per_s": r["steady_samples_per_s"],
            "steady_tokens_per_s": (sum(s["tokens"] for s in kept)
                                    / sum(s["step_time_s"] for s in kept)),
            "train_time_s": r["train_time_s"],
            "eval_time_s": r["eval_time_s"], "time_to_result_s": time.perf_counter() - started,
            "train_samples_per_s": r["train_samples_per_s"], "metrics": r["metrics"],
            "precision": r["precision"],
            "mfu": r.get("mfu"), "peak_how": r.get("peak_how"), "peak_rss_mb": r.get("peak_rss_mb"),
            "steps": r["steps"], "threads_per_rank": r["threads_per_rank"],
            "world_size": r["world_size"],
            "cpu": r["cpu"], "versions": r["versions"], "flags": flags(opts)}


def hf(mode: str, model: str, common: dict[str, str], eval_: bool,
       extra: tuple[str, ...] = ()) -> dict[str, Any]:
    from cpudist.train.models import resolve_model

    cmd = [sys.executable, str(HERE / "hf_trainer.py"), "--mode", mode, "--data-dir", str(MRPC),
           "--model", resolve_model(model), *flags(dict(common)), *extra]
    if not eval_:
        cmd.append("--no-eval")
    started = time.perf_counter()
    r = run_json(cmd)
    r["time_to_result_s"] = time.perf_counter() - started
    return r


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def suite(name: str, model: str, common: dict[str, str], eval_: bool, repeats: int,
          arms: dict[str, Any]) -> dict[str, Any]:
    """Every arm once per repeat, in the same order; medians and min-max per arm."""
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    for _ in range(repeats):
        for arm, call in arms.items():
            runs[arm].append(call())
            print(f"# {name} {arm}: {runs[arm][-1]['steady_samples_per_s']:.2f} samples/s",
                  file=sys.stderr, flush=True)
    stats = {arm: spread([r["steady_samples_per_s"] for r in rs]) for arm, rs in runs.items()}
    med = {arm: s["median"] for arm, s in stats.items()}
    first = next(rs[0] for arm, rs in runs.items() if arm.startswith("ours") or arm == "bare")
    out: dict[str, Any] = {
        "suite": name, "model": model, "settings": common, "repeats": repeats,
        "median_steady_samples_per_s": med, "steady_samples_per_s": stats,
        "over_hf_best": {arm: m / med["hf_best"] for arm, m in med.items()},
        "time_to_result_s": {arm: statistics.median(r["time_to_result_s"] for r in rs) for arm,
                             rs in runs.items()},
        "cpu": first["cpu"], "cpu_kind": first["cpu"].get("kind", cpu().kind),
        "versions": first["versions"],
        "runs": runs}
    if all("steady_tokens_per_s" in r for rs in runs.values() for r in rs):
        # Real tokens/s of the same steady steps: the fair ratio when the arms' samplers order rows
        # by length differently (Trainer's group_by_length runs its longest batches first, so its
        # steps 4-8 are long ones)
        out["median_steady_tokens_per_s"] = {
            arm: statistics.median(r["steady_tokens_per_s"] for r in rs)
            for arm, rs in runs.items()}
        if "ours" in med:
            tok = out["median_steady_tokens_per_s"]
            out["ours_over_hf_best_tokens"] = tok["ours"] / tok["hf_best"]
    if "ours" in med:
        out["ours_over_hf_best"] = med["ours"] / med["hf_best"]
        if "blog" in med:
            out["ours_over_blog"] = med["ours"] / med["blog"]
        out["ours_mfu"] = statistics.median(r["mfu"] or 0 for r in runs["ours"])
        out["peak_how"] = runs["ours"][0]["peak_how"]
    return out


# The presets of real size (cpudist/train/models.py PRESETS), smallest first
PRESET_SUITE = ("minilm-l6", "distilbert-base", "bert-base", "modernbert-base", "deberta-v3-base",
                "bert-large", "modernbert-large")


def presets(names: list[str], common: dict[str, str], repeats: int,
            checkpointing: bool = False) -> dict[str, Any]:
    """ours vs hf_best on each preset: steady samples/s and peak RSS, arms alternating inside each
    repeat (with `checkpointing`, both again with activation checkpointing)."""
    from cpudist.train.models import build_model

    out: dict[str, Any] = {"suite": "presets", "settings": common, "repeats": repeats,
                           "presets": {}}
    for name in names:
        arms = {"hf_best": lambda m=name: hf("best", m, common, False),
                "ours": lambda m=name: ours(m, common, False, {})}
        if checkpointing:
            arms["hf_best-gc"] = lambda m=name: hf("best", m, common, False,
                                                   ("--gradient-checkpointing",))
            arms["ours-gc"] = lambda m=name: ours(m, common, False,
                                                  {"gradient-checkpointing": None})
        res = suite(f"presets {name}", name, common, False, repeats, arms)
        params = sum(p.numel() for p in build_model(name, 2, False, None).parameters())
        rss = {arm: statistics.median(r["peak_rss_mb"] for r in rs) for arm,
               rs in res["runs"].items()}
        out["presets"][name] = {"params": params,
                                "median_steady_samples_per_s": res["median_steady_samples_per_s"],
                                "steady_samples_per_s": res["steady_samples_per_s"],
                                "ours_over_hf_best": res["ours_over_hf_best"], "peak_rss_mb": rss,
                                "median_steady_tokens_per_s": res.get("median_steady_tokens_per_s"),
                                "ours_over_hf_best_tokens": res.get("ours_over_hf_best_tokens"),
                                "precision": res["runs"]["ours"][0]["precision"],
                                "runs": res["runs"]}
        out["cpu"], out["cpu_kind"], out["versions"] = res["cpu"], res["cpu_kind"], res["versions"]
    return out


def presets_markdown(res: dict[str, Any], command: str) -> str:
    c = res["cpu"]
    lines = [f"# Throughput and memory per preset on {res['cpu_kind']}", "",
             f"Made by: `{command}`", "",
             f"Settings: {res['settings']}, no evaluation, random-init presets on MRPC's rows; "
             f"{res['repeats']} alternated repeat(s) (median, min-max); CPU {c['model']} "
             f"({c['physical_cores']} cores, flags {', '.join(c['flags'])}). Peak RSS: the "
             "training process's (getrusage), one rank. Tokens/s: real (unpadded) tokens of the "
             "same steady steps; the fairer ratio, as the two samplers put rows of different "
             "lengths in those steps.", "",
             "| preset | params | precision | ours samples/s | hf_best samples/s | ours / hf_best "
             "| ours / hf_best in tokens/s | ours peak RSS MB | hf_best peak RSS MB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, p in res["presets"].items():
        s = p["steady_samples_per_s"]
        cell = {arm: f"{s[arm]['median']:.2f} ({s[arm]['min']:.2f}-{s[arm]['max']:.2f})"
                for arm in s}
        lines.append(f"| {name} | {p['params'] / 1e6:.1f}M | {p['precision']} | {cell['ours']} | "
                     f"{cell['hf_best']} | {p['ours_over_hf_best']:.2f}x | "
                     + (f"{p['ours_over_hf_best_tokens']:.2f}x"
                        if p.get("ours_over_hf_best_tokens") else "-")
                     + f" | {p['peak_rss_mb']['ours']:.0f} | "
                     f"{p['peak_rss_mb']['hf_best']:.0f} |")
    checkpointed = [(n, p) for n, p in res["presets"].items() if "ours-gc" in p["peak_rss_mb"]]
    if checkpointed:
        lines += ["",
                  "Activation checkpointing (`--gradient-checkpointing`; Trainer's "
                  "`gradient_checkpointing=True`): "
                  "peak RSS and samples/s against the same framework without it.", "",
                  "| preset | ours-gc samples/s | / ours | ours-gc RSS MB | / ours | hf_best-gc "
                  "samples/s | / hf_best | hf_best-gc RSS MB | / hf_best |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for name, p in checkpointed:
            med, rss = p["median_steady_samples_per_s"], p["peak_rss_mb"]
            lines.append(f"| {name} | {med['ours-gc']:.2f} | {med['ours-gc'] / med['ours']:.2f}x | "
                         f"{rss['ours-gc']:.0f} | {rss['ours-gc'] / rss['ours']:.2f}x | "
                         f"{med['hf_best-gc']:.2f} | {med['hf_best-gc'] / med['hf_best']:.2f}x | "
                         f"{rss['hf_best-gc']:.0f} | {rss['hf_best-gc'] / rss['hf_best']:.2f}x |")
    return "\n".join(lines) + "\n"


def markdown(res: dict[str, Any], command: str) -> str:
    c = res["cpu"]
    lines = [f"# Throughput: {res['suite']} ({res['model']}) on {res['cpu_kind']}", "",
             f"Made by: `{command}`", "",
             f"Settings: {res['settings']}; {res['repeats']} alternated repeat(s); CPU "
             f"{c['model']} "
             f"({c['physical_cores']} cores, flags {', '.join(c['flags'])}, "
             f"kind {res['cpu_kind']})", "",
             "| arm | median steady samples/s (min-max) | / hf_best | time to result s (median) | "
             "dev metrics |",
             "|---|---|---|---|---|"]
    for arm, runs in res["runs"].items():
        s = res["steady_samples_per_s"][arm]
        metrics = " ".join(f"{k}={statistics.median(r['metrics'][k] for r in runs):.4f}"
                           for k in runs[0]["metrics"]) or "-"
        lines.append(f"| {arm} | {s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f}) | "
                     f"{res['over_hf_best'][arm]:.2f}x | {res['time_to_result_s'][arm]:.1f} | "
                     f"{metrics} |")
    if "ours_over_hf_best" in res:
        lines += ["", f"ours / hf_best = **{res['ours_over_hf_best']:.2f}x**"
                  + (f"; ours / blog = **{res['ours_over_blog']:.2f}x**" if "ours_over_blog" in res
                     else "")
                  + f"; ours MFU = {res['ours_mfu']:.1%} of the nominal peak ({res['peak_how']})"]
    if "ours_over_hf_best_tokens" in res:
        tok = res["median_steady_tokens_per_s"]
        lines += ["",
                  f"In real (unpadded) tokens/s of the same steady steps: ours {tok['ours']:.1f}, "
                  f"hf_best {tok['hf_best']:.1f}: ours / hf_best = "
                  f"**{res['ours_over_hf_best_tokens']:.2f}x**, the fairer ratio when the two "
                  "samplers put rows of other lengths into the steps measured"]
    return "\n".join(lines) + "\n"


def gemm_ceiling(threads: int, dtype: str, n: int = 2048) -> float:
    """FLOP/s of a large matmul in `dtype` on `threads` threads: what this CPU really sustains."""
    import torch

    torch.set_num_threads(threads)
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    a, b = torch.randn(n, n, dtype=dt), torch.randn(n, n, dtype=dt)
    for _ in range(2):
        a @ b
    best = 0.0
    for _ in range(3):  # the best of 3 bursts: the ceiling, not an average with interruptions
        start, reps = time.perf_counter(), 5
        for _ in range(reps):
            a @ b
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - start))
    return best


def mfu_at_128(steps: int, repeats: int, precision: str = "auto") -> dict[str, Any]:
    """bert-base on full 128-token rows (synthetic task: no padding), in `precision`, vs measured
    GEMMs."""
    runs = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            runs.append(run_json(["cpudist", "run", "synthetic", "--np", "1", "--model",
                                  "bert-base", "--max-seq-len", "128", "--batch-size", "32",
                                  "--max-steps", str(steps), "--no-eval", "--synthetic-samples",
                                  str(32 * steps), "--output-dir", f"{tmp}/run", "--ledger",
                                  f"{tmp}/l.jsonl", "--precision", precision, "--json", "--quiet"]))
    r = sorted(runs, key=lambda x: x["train_flops_per_s"])[len(runs) // 2]  # the median run
    out = {k: r[k]
           for k in ("mfu", "train_flops_per_s", "peak_flops_per_s", "peak_how", "precision",
                     "steady_samples_per_s", "peak_rss_mb", "cpu", "versions", "threads_per_rank")}
    out["runs_flops_per_s"] = [x["train_flops_per_s"] for x in runs]
    threads = r["threads_per_rank"]
    out["gemm_fp32_flops_per_s"] = gemm_ceiling(threads, "fp32")
    out["gemm_bf16_flops_per_s"] = gemm_ceiling(threads, "bf16") if r["cpu"]["bf16"] else None
    ceiling = (out["gemm_bf16_flops_per_s"] if r["precision"] == "bf16"
               else out["gemm_fp32_flops_per_s"])
    out["gemm_ceiling_flops_per_s"] = ceiling
    out["fraction_of_gemm_ceiling"] = r["train_flops_per_s"] / ceiling
    out["cpu_kind"] = r["cpu"].get("kind", cpu().kind)
    return out


def mfu_markdown(res: dict[str, Any], command: str) -> str:
    bf16 = res["gemm_bf16_flops_per_s"]
    return (f"# MFU: bert-base preset, 128-token rows, batch 32, {res['precision']}, on "
            f"{res['cpu_kind']}\n\n"
            f"Made by: `{command}`\n\n"
            f"- training: {res['train_flops_per_s'] / 1e9:.1f} GFLOP/s (model FLOPs, real tokens; "
            "median of "
            f"{len(res['runs_flops_per_s'])} runs: "
            f"{', '.join(f'{x / 1e9:.1f}' for x in res['runs_flops_per_s'])})\n"
            f"- **{res['fraction_of_gemm_ceiling']:.1%} of the measured GEMM ceiling in "
            f"{res['precision']}** "
            f"({res['gemm_ceiling_flops_per_s'] / 1e9:.1f} GFLOP/s: 2048x2048 matmul, "
            f"{res['threads_per_rank']} threads, best of 3 bursts)\n"
            f"- measured ceilings: fp32 {res['gemm_fp32_flops_per_s'] / 1e9:.1f} GFLOP/s"
            + (f", bf16 {bf16 / 1e9:.1f} GFLOP/s" if bf16 else ", bf16 not native") + "\n"
            f"- MFU against the nominal peak: {res['mfu']:.1%} ({res['peak_how']})\n"
            f"- peak RSS {res['peak_rss_mb']:.0f} MB\n")


def eval_levers(model: str, repeats: int) -> dict[str, Any]:
    """Evaluation alone on MRPC dev (408 rows): each lever switched on one after another."""
    import torch

    from cpudist.train.data import load_glue_tsv
    from cpudist.train.features import collate, encode
    from cpudist.train.models import build_model, load_tokenizer

    c = cpu()
    torch.set_num_threads(c.physical_cores)
    task = load_glue_tsv("mrpc", MRPC)
    data = encode(task.validation, load_tokenizer(model, None), 128)
    net = build_model(model, 2, False, None).eval()
    steps = [  # (arm, grad mode, batch, bf16, sorted rows): each adds one lever to the one before
        ("no_grad, batch 8, fp32, file order (HF Trainer's eval defaults)", "no_grad", 8, False,
         False),
        ("+ inference_mode", "inference", 8, False, False),
        ("+ batch 64", "inference", 64, False, False),
        ("+ training precision (bf16 where native)", "inference", 64, c.has_bf16, False),
        ("+ rows sorted by length (cpudist's default)", "inference", 64, c.has_bf16, True),
    ]
    times: dict[str, list[float]] = {s[0]: [] for s in steps}
    for _ in range(repeats):
        for arm, mode, batch, bf16, ordered in steps:
            rows = (sorted(range(len(data)), key=lambda i: len(data.input_ids[i])) if ordered
                    else list(range(len(data))))
            ctx = torch.inference_mode() if mode == "inference" else torch.no_grad()
            start = time.perf_counter()
            with ctx, torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                for i in range(0, len(rows), batch):
                    b = collate(data, rows[i:i + batch], False)
                    b.pop("labels")
                    net(**b)
            times[arm].append(time.perf_counter() - start)
    return {"suite": "eval", "model": model, "rows": len(data), "repeats": repeats,
            "cpu": c.summary(), "cpu_kind": c.kind,
            "eval_time_s": {arm: spread(t) for arm, t in times.items()}, "runs": times}


def eval_markdown(res: dict[str, Any], command: str) -> str:
    first = next(iter(res["eval_time_s"].values()))["median"]
    lines = [f"# Evaluation levers: {res['model']}, MRPC dev ({res['rows']} rows), on "
             f"{res['cpu_kind']}", "",
             f"Made by: `{command}`; {res['repeats']} alternated repeats; "
             f"CPU {res['cpu']['model']}", "",
             "| evaluation | median s (min-max) | speedup vs first row |", "|---|---|---|"]
    for arm, s in res["eval_time_s"].items():
        lines.append(f"| {arm} | {s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f}) | "
                     f"{first / s['median']:.2f}x |")
    return "\n".join(lines) + "\n"


def parity(model: str, common: dict[str, str], repeats: int) -> dict[str, Any]:
    """Dev accuracy of ours and hf_best at the same settings, one seed per repeat (both arms share
    it): a gap under the seeds' own spread is no gap. Dropout masks differ between the two however
    close the code."""
    runs: dict[str, list[dict[str, Any]]] = {"hf_best": [], "ours": []}
    for repeat in range(repeats):
        seeded = {**common, "seed": str(42 + repeat)}
        runs["hf_best"].append(hf("best", model, seeded, True))
        runs["ours"].append(ours(model, seeded, True, {}))
        print(f"# parity seed {42 + repeat}: "
              + ", ".join(f"{arm} {rs[-1]['metrics']}" for arm, rs in runs.items()),
              file=sys.stderr, flush=True)
    stats = {arm: {k: spread([r["metrics"][k] for r in rs])
                   | {"mean": statistics.mean(r["metrics"][k] for r in rs)}
                   for k in rs[0]["metrics"]} for arm, rs in runs.items()}
    gap = {k: stats["ours"][k]["mean"] - stats["hf_best"][k]["mean"] for k in stats["ours"]}
    return {"suite": "parity", "model": model, "settings": common, "repeats": repeats,
            "metrics": stats, "ours_minus_hf_best": gap, "cpu": runs["ours"][0]["cpu"],
            "cpu_kind": runs["ours"][0]["cpu"]["kind"], "versions": runs["ours"][0]["versions"],
            "runs": runs}


def parity_markdown(res: dict[str, Any], command: str) -> str:
    lines = [f"# Accuracy parity: {res['model']} on MRPC dev, ours vs hf_best ({res['cpu_kind']})",
             "",
             f"Made by: `{command}`", "",
             f"Settings: {res['settings']}; seeds 42..{41 + res['repeats']}, "
             "one per repeat, shared by both arms", "",
             "| metric | hf_best mean (min-max) | ours mean (min-max) | ours - hf_best (points) |",
             "|---|---|---|---|"]
    for k, gap in res["ours_minus_hf_best"].items():
        h, o = res["metrics"]["hf_best"][k], res["metrics"]["ours"][k]
        lines.append(f"| {k} | {h['mean']:.4f} ({h['min']:.4f}-{h['max']:.4f}) | {o['mean']:.4f} "
                     f"({o['min']:.4f}-{o['max']:.4f}) | {100 * gap:+.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--suites", default="mrpc-minilm,bert-base,mfu")
    ap.add_argument("--levers", default=",".join(LEVERS), help="Levers of the levers-* suites.")
    ap.add_argument("--tag", default="",
                    help="added to the result files' name (a run of some levers only: "
                    "--tag=-embedding-rows keeps the full suite's files)")
    ap.add_argument("--without", default="", help="Comma-separated default levers ("
                    + ", ".join(OFF) + "): "
                    "the mrpc-minilm and bert-base suites add an arm of ours with each turned off.")
    ap.add_argument("--presets", default=",".join(PRESET_SUITE), help="of the presets suite")
    ap.add_argument("--gradient-checkpointing", action="store_true",
                    help="presets suite: also ours and hf_best with activation checkpointing")
    ap.add_argument("--precision", choices=["auto", "fp32"], default="auto",
                    help="fp32: every arm in fp32, the path of CPUs without bf16 (Ice Lake), on "
                         "this CPU")
    a = ap.parse_args()
    forced = {"precision": a.precision} if a.precision != "auto" else {}
    command = "python benchmarks/throughput.py " + " ".join(sys.argv[1:])
    minilm = {"batch-size": "32", "lr": "5e-5", "epochs": "1" if a.quick else "3",
              **({"max-train-samples": "640"} if a.quick else {}), **forced}
    bert = {"batch-size": "32", "max-steps": "8" if a.quick else "12", "max-train-samples": "640",
            **forced}
    plans = {"mrpc-minilm": (MINILM, minilm, True), "bert-base": ("bert-base", bert, False),
             "levers-minilm": (MINILM, minilm, True),
             "levers-bert-base": ("bert-base", bert, False),
             "lora-minilm": (MINILM, minilm, False), "lora-bert-base": ("bert-base", bert, False)}
    kind = cpu().kind
    quick = "-quick" if a.quick else ""
    for name in a.suites.split(","):
        gc = "-gc" if name == "presets" and a.gradient_checkpointing else ""
        path = (HERE / "results"
                / f"throughput-{name}{quick}{gc}{a.tag}-{kind}{'-fp32' if forced else ''}")
        if name == "mfu":
            res = {"suite": "mfu", "command": command,
                   **mfu_at_128(8 if a.quick else 12, a.repeats, a.precision)}
            md = mfu_markdown(res, command)
        elif name == "presets":
            res = {"command": command,
                   **presets(a.presets.split(","), bert, a.repeats, a.gradient_checkpointing)}
            md = presets_markdown(res, command)
        elif name == "parity-minilm":
            full = {k: v for k, v in minilm.items() if k != "max-train-samples"} | {"epochs": "3"}
            res = {"command": command, **parity(MINILM, full, a.repeats)}
            md = parity_markdown(res, command)
        elif name == "eval":
            res = {"command": command, **eval_levers(MINILM, a.repeats)}
            md = eval_markdown(res, command)
        else:
            model, common, eval_ = plans[name]
            arms: dict[str, Any] = {"hf_best": lambda m=model, c=common,
                                    e=eval_: hf("best", m, c, e)}
            if name.startswith("levers"):
                arms["bare"] = lambda m=model, c=common, e=eval_: ours(m, c, e, dict(BARE))
                for lever in a.levers.split(","):
                    arms[lever] = (lambda m=model, c=common, e=eval_, x=LEVERS[lever]:
                                   ours(m, c, e, {**BARE, **x}))
            elif not name.startswith("lora-"):
                arms["blog"] = lambda m=model, c=common, e=eval_: hf("blog", m, c, e)
            for lever in filter(None, a.without.split(",")):
                arms[f"ours-without-{lever}"] = (lambda m=model, c=common, e=eval_,
                                                 x=OFF[lever]: ours(m, c, e, x))
            arms["ours"] = lambda m=model, c=common, e=eval_: ours(m, c, e, {})
            if name.startswith("lora-"):
                for arm, x in LORA_ARMS.items():
                    arms[arm] = lambda m=model, c=common, e=eval_, x=x: ours(m, c, e, x)
            res = {"command": command, **suite(name, model, common, eval_, a.repeats, arms)}
            md = markdown(res, command)
        path.with_suffix(".json").write_text(json.dumps(res, indent=2) + "\n")
        path.with_suffix(".md").write_text(md)
        print(md, flush=True)


if __name__ == "__main__":
    main()
