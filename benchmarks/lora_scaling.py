"""LoRA against full fine-tuning across hosts of the miniature cluster: speed, bytes per step (issue
25, item 3).

    python benchmarks/lora_scaling.py --quick \
        --blog-calibration benchmarks/results/scaling-halfcore-amx-bf16.json
    python benchmarks/lora_scaling.py --models bert-base,bert-large --repeats 3 \
        --lock-each /tmp/cpudist-cpu.lock

Hosts: benchmarks/miniature.py's `halfcore` layout (4 namespace hosts, half a core each by CFS
quota, two per core, so no two ranks compete for a core). Work: MRPC's real rows as `cpudist run`
trains them (dynamic padding, length-grouped batches, the CPU's default precision), batch 32 per
host, the random-weight preset of each model (no pretrained bert-base/bert-large offline: speed and
bytes do not depend on the weights), no evaluation.

The link is calibrated per model to OUR node on the task, as time_to_accuracy.py does (issue 24): a
c6i.16xlarge running cpudist on MRPC would train 23.6 x S(bert-base, task) / S(bert-base, blog) x
S(model, blog) / S(bert-base, blog) samples/s on 25 Gbit/s (S: one miniature host's steady
samples/s; `blog`: the blog's 128-token fp32 rows), and the miniature link gets 25 Gbit/s x S(model,
task) / that. For bert-base this is the blog's own ratio, 25 Gbit/s x S(bert-base, blog) / 23.6.

Arms: `full` (ddp, every parameter trained and all-reduced) and `lora` (`--peft lora`, rank 8:
`--lora default`, on cpudist's default targets, every Linear of the layers, with the head in full;
`--lora first`, on the query and value projections with BERT's pooler frozen, as the first run; DDP
all-reduces only what requires a gradient). Every host count and arm alternate inside each repeat.
Speedup of an arm at N hosts: its median steady samples/s over the same arm's at 1 host. The timed
runs take `--sampler random` (DistributedSampler's order, each batch padded to its longest row), not
the default length-grouped batches: grouped batches range from ~20 to ~100 tokens a row, and each
host count trains other rows, so a 10-step window compared unequal work. A first try with grouped
batches read 2.49x at 2 hosts for LoRA (1.2x beyond linear) in tokens/s as well as in samples/s (a
step's fixed costs weigh less in long batches); padded random batches cost about the same at every
host count (the longest of 32 random rows). Each run's steps stay in the result (`step_log`: real
tokens, samples, seconds). The hosts a run does not use spin in their own cgroups
(miniature.ballast: every host count on an equally busy machine); each repeat also runs LoRA on 1
host with the others idle (the control row), which showed no difference beyond the runs' spread.
Bytes per step: what the hosts' interface counters saw (result.json measured_tx_bytes_per_step,
every node together), beside cpudist's expectation (cpudist/traffic.py).

`summary[model]`: `lora_speedup_4_hosts`, `full_speedup_4_hosts`, `bytes_ratio_full_over_lora`
(measured, 4 hosts) and `accuracy_delta_points` (LoRA minus full fine-tuning, median over seeds,
read from accuracy_scaling.py's ledger: the pretrained MiniLM on MRPC, the one pretrained encoder
offline; None with the reason when its runs are missing). Goal (issue 25): LoRA at 4 hosts >= 3.8x
one host, >= 50x fewer bytes per step than full ddp, within 1.5 points of full fine-tuning.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from miniature import (
    BLOG_LINK_GBPS,
    BLOG_SAMPLES_PER_S,
    LAYOUTS,
    ROOT,
    calibrate,
    miniature,
    on_head,
    shaped,
    shaped_to,
    ssh_setup,
)
from scaling import code_version

from cpudist.cpu import read_cpu
from cpudist.train.loop import WARMUP_STEPS_EXCLUDED

MRPC = ROOT.parent / "shared" / "data" / "glue" / "MRPC"
BATCH = 32
# The `lora` arm: `--lora` picks which LoRA. `first`: as the first run had it
# (results/lora-scaling-amx-bf16.*), r 8 on the query and value projections with BERT's pooler
# frozen (then the default). `default`: r 8 on cpudist's default targets since 2026-11-27, every
# Linear of the layers, the pooler in full, which met full fine-tuning's accuracy
# (accuracy_scaling.py "1 rank lora r8 all-linear lr 1e-3").
LORA_FLAGS: dict[str, tuple[str, ...]] = {
    "first": ("--peft", "lora", "--lora-r", "8", "--lora-targets", "query,value",
              "--lora-modules-to-save", "classifier", "--lora-dropout", "0.1"),
    # cpudist's default; its adapters' dropout was 0.1 until 2026-11-28 (the result files of before
    # say which ran)
    "default": ("--peft", "lora", "--lora-r", "8"),
}
# accuracy_scaling.py's arm that answers accuracy_delta_points for each (MiniLM, MRPC, 3 epochs, 1
# rank, same seeds); "1 rank lora r8 all-linear lr 1e-3" is the default of before 2026-11-28
# (adapter dropout 0.1)
LORA_ACCURACY_ARM = {"first": "1 rank lora r8 lr 1e-3 frozen pooler",
                     "default": "1 rank lora r8 lr 1e-3 dropout 0"}
IDLE_CONTROL = "lora, other hosts idle"  # not in the summary: it shows what the ballast changes
GOAL = {"lora_speedup_4_hosts": 3.8, "bytes_ratio_full_over_lora": 50.0,
        "accuracy_delta_points": -1.5}
KEEP = ("run_id", "steady_samples_per_s", "train_samples_per_s", "steps", "wall_time_s",
        "world_size", "nodes", "precision", "threads_per_rank", "peak_rss_mb", "trainable_params",
        "grad_bytes", "comm_time_s", "exposed_comm_s", "expected_tx_bytes_per_step",
        "measured_tx_bytes_per_step", "peft")
ACCURACY_LEDGER = ROOT / "benchmarks" / "results" / "accuracy-scaling-{kind}.jsonl"


def run(cluster: Any, work: Path, lock: Path | None, args: list[str], hosts: int, steps: int,
        sampler: str = "random", busy: bool = True) -> dict[str, Any]:
    """`cpudist run ARGS` on the first `hosts` hosts, 1 rank each, no evaluation; the fields kept
    (or the error)."""
    out = Path(tempfile.mkdtemp(dir=work, prefix="run-"))
    full = ["run", *args, "--hostfile", str(cluster.hostfile), "--nodes", str(hosts), "--ppn", "1",
            "--batch-size", str(BATCH), "--max-steps", str(steps), "--sampler", sampler,
            "--no-eval", "--save-model", "none", "--output-dir", str(out / "run"), "--json",
            "--quiet"]
    try:
        r = on_head(cluster, full, lock, used=hosts if busy else None)
    except RuntimeError as e:
        print(f"# failed: {e}", file=sys.stderr, flush=True)
        return {"error": str(e)[-600:], "hosts": hosts}
    return {**{k: r.get(k) for k in KEEP}, **steady_tokens(out / "run" / "steps.jsonl"),
            "hosts": hosts,
            "ballast": busy, "cpu": r["cpu"], "versions": r["versions"], "command": "cpudist "
            + " ".join(full)}


def steady_tokens(steps_jsonl: Path) -> dict[str, Any]:
    """Steady real tokens/s (over the steps after the warm-up ones result.json also leaves out),
    real tokens per sample, and every step's log."""
    steps = [json.loads(line) for line in steps_jsonl.read_text().splitlines() if line.strip()]
    log = [[int(s["tokens"]), int(s["samples"]), round(float(s["step_time_s"]), 3)] for s in steps]
    k = WARMUP_STEPS_EXCLUDED if len(steps) > 2 * WARMUP_STEPS_EXCLUDED else 0
    steady = steps[k:]
    seconds = sum(float(s["step_time_s"]) for s in steady)
    tokens = sum(int(s["tokens"]) for s in steady)
    return {"steady_tokens_per_s": tokens / seconds if seconds else 0.0,
            "tokens_per_sample": tokens / max(1, sum(int(s["samples"]) for s in steady)),
            "step_log": log}  # [real tokens, samples, seconds] per step, every rank together


def calibration(cluster: Any, work: Path, a: argparse.Namespace, model: str) -> dict[str, Any]:
    """The link for `model` on MRPC (module docstring), from four one-host speeds."""
    task = ["mrpc", "--data-dir", str(MRPC)]
    blog = ["synthetic", "--precision", "fp32", "--max-seq-len", "128",
            "--synthetic-samples", str(BATCH * a.calibration_steps)]
    # S(bert-base, blog) from scaling.py's halfcore calibration on this CPU kind
    if a.blog_calibration:
        bb_blog = float(json.loads(a.blog_calibration.read_text())["calibration"]["samples_per_s"])
    else:
        bb_blog = float(calibrate(cluster, a.calibration_steps, work, a.lock_each)["samples_per_s"])

    def speed(args: list[str]) -> float:
        # as time_to_accuracy.py
        r = run(cluster, work, a.lock_each, args, 1, a.calibration_steps, "grouped")
        if "error" in r:
            raise SystemExit(f"calibration failed: {r['error']}")
        return float(r["steady_samples_per_s"])

    bb_task = speed([*task, "--model", "bert-base"])
    m_task = bb_task if model == "bert-base" else speed([*task, "--model", model])
    m_blog = bb_blog if model == "bert-base" else speed([*blog, "--model", model])
    c6i_task = BLOG_SAMPLES_PER_S * (bb_task / bb_blog) * (m_blog / bb_blog)
    return {"model": model, "bert_base_blog_samples_per_s": bb_blog,
            "bert_base_task_samples_per_s": bb_task, "model_blog_samples_per_s": m_blog,
            "model_task_samples_per_s": m_task, "c6i_task_samples_per_s": c6i_task,
            "link_gbps": BLOG_LINK_GBPS * m_task / c6i_task, "steps": a.calibration_steps,
            "bert_base_blog_from": str(a.blog_calibration or "measured")}


def median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [float(r[key]) for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def accuracy_delta(kind: str, lora_kind: str) -> dict[str, Any]:
    """LoRA minus full fine-tuning in points, median over the seeds both arms ran
    (accuracy_scaling.py's ledger)."""
    arms = {"full": "1 rank", "lora": LORA_ACCURACY_ARM[lora_kind]}
    ledger = Path(str(ACCURACY_LEDGER).format(kind=kind))
    if not ledger.is_file():
        return {"points": None, "why": f"no {ledger.name}: run accuracy_scaling.py --arms "
                                       f"'{arms['full']},{arms['lora']}'"}
    by_arm: dict[str, dict[int, float]] = {}
    for line in ledger.read_text().splitlines():
        row = json.loads(line)
        if row.get("arm") in arms.values() and "metrics" in row:
            by_arm.setdefault(row["arm"], {})[int(row["seed"])] = float(row["metrics"]["accuracy"])
    full, lora = by_arm.get(arms["full"], {}), by_arm.get(arms["lora"], {})
    seeds = sorted(set(full) & set(lora))
    if not seeds:
        return {"points": None, "why": "no seed with both arms in " + ledger.name}
    return {"points": 100
            * (statistics.median(lora[s] for s in seeds)
               - statistics.median(full[s] for s in seeds)),
            "seeds": seeds, "full": [full[s] for s in seeds], "lora": [lora[s] for s in seeds],
            "arms": arms, "model": "sentence-transformers/all-MiniLM-L6-v2", "task": "mrpc",
            "from": ledger.name}


def summarize(cells: dict[str, list[dict[str, Any]]], accuracy: dict[str, Any]) -> dict[str, Any]:
    table: dict[str, dict[str, Any]] = {}
    for cell, runs in cells.items():
        arm, hosts = cell.rsplit("@", 1)
        base = median(cells.get(f"{'lora' if arm == IDLE_CONTROL else arm}@1", []),
                      "steady_samples_per_s")
        sps = median(runs, "steady_samples_per_s")
        tps = median(runs, "steady_tokens_per_s")
        table[cell] = {"arm": arm, "hosts": int(hosts), "repeats": len(runs), "tokens_per_s": tps,
                       "tokens_per_s_all": [r.get("steady_tokens_per_s") for r in runs],
                       "samples_per_s": sps,
                       "samples_per_s_all": [r.get("steady_samples_per_s") for r in runs],
                       "tokens_per_sample": median(runs, "tokens_per_sample"),
                       "speedup": sps / base if sps and base else None,
                       "measured_tx_bytes_per_step": median(runs, "measured_tx_bytes_per_step"),
                       "expected_tx_bytes_per_step": median(runs, "expected_tx_bytes_per_step"),
                       "exposed_comm_s": median(runs, "exposed_comm_s"),
                       "peak_rss_mb": median(runs, "peak_rss_mb"),
                       "trainable_params": median(runs, "trainable_params"),
                       "errors": [r["error"] for r in runs if "error" in r]}

    def at4(arm: str, key: str) -> float | None:
        value = table.get(f"{arm}@4", {}).get(key)
        return float(value) if value is not None else None

    full_bytes = at4("full", "measured_tx_bytes_per_step")
    lora_bytes = at4("lora", "measured_tx_bytes_per_step")
    summary = {"lora_speedup_4_hosts": at4("lora", "speedup"),
               "full_speedup_4_hosts": at4("full", "speedup"),
               "bytes_ratio_full_over_lora": full_bytes / lora_bytes if full_bytes and lora_bytes
               else None,
               "lora_over_full_1_host": (table["lora@1"]["samples_per_s"]
                                         / table["full@1"]["samples_per_s"]
                                         if table.get("lora@1", {}).get("samples_per_s")
                                         and table.get("full@1", {}).get("samples_per_s")
                                         else None),
               "accuracy_delta_points": accuracy["points"], "accuracy": accuracy, "goal": GOAL,
               "cells": table}
    checks = [summary[k] is not None and summary[k] >= v for k, v in GOAL.items()]
    summary["met"] = all(checks)
    return summary


def num(v: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def x(v: float | None) -> str:
    return num(v, suffix="x")


def verdict(s: dict[str, Any]) -> str:
    """`met`, `not met`, or `not measured` when a run the goal needs is missing (e.g. no 4-host
    cell)."""
    missing = [k for k in GOAL if s.get(k) is None]
    return (f"not measured ({', '.join(missing)} missing)" if missing
            else "met" if s["met"] else "not met")


def markdown(res: dict[str, Any], where: str = "the miniature cluster") -> str:
    lines = [f"# LoRA against full fine-tuning on {where} ({res['cpu_kind']})", "",
             f"`{res['command']}`", "", *([f"Note: {res['note']}", ""] if res.get("note") else []),
             f"CPU: {res['cpu'].get('model', res['cpu'])}; code {res['code']}. "
             f"Hosts: {res['cluster_text']}", ""]
    for model, s in res["summary"].items():
        cal = res["calibrations"][model]
        link = f"Link {cal['link_gbps']:.3f} Gbit/s (`{cal.get('tbf', '?')}`)"
        # given (wholecore_scaling.py --link-gbps), or no 1-host full run
        if cal.get("c6i_task_samples_per_s") is None:
            link += f" from {cal.get('from', '?')}"
            if cal.get("bert_base_blog_samples_per_s"):
                link += (f": one host {cal['bert_base_blog_samples_per_s']:.3f} "
                         "bert-base samples/s on the blog's rows")
            link += "."
        else:
            link += (f": one host {cal['model_task_samples_per_s']:.2f} samples/s on MRPC "
                     f"(bert-base {cal['bert_base_task_samples_per_s']:.2f} on MRPC, "
                     f"{cal['bert_base_blog_samples_per_s']:.3f} on the blog's rows "
                     f"[{cal['bert_base_blog_from']}]; {model} on the blog's rows "
                     f"{cal['model_blog_samples_per_s']:.3f}) -> a c6i.16xlarge running cpudist: "
                     f"{cal['c6i_task_samples_per_s']:.1f} samples/s on 25 Gbit/s.")
        lines += [f"## {model} on MRPC (random init, real rows, {res['precision']})", "", link, "",
                  "| arm | hosts | repeats | samples/s (median; each) | real tokens/s | real "
                  "tokens/sample | speedup vs same arm at 1 host (samples/s) | bytes/step "
                  "measured (expected) | exposed comm s | trainable params | peak RSS MB |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for c in s["cells"].values():
            each = " / ".join(num(v) for v in c["samples_per_s_all"])
            mb, ex, params = (c["measured_tx_bytes_per_step"], c["expected_tx_bytes_per_step"],
                              c["trainable_params"])
            lines.append(f"| {c['arm']} | {c['hosts']} | {c['repeats']} | "
                         f"{num(c['samples_per_s'])} ({each}) | {num(c['tokens_per_s'], '.0f')} | "
                         f"{num(c['tokens_per_sample'], '.1f')} | {num(c['speedup'], suffix='x')} "
                         f"| {num(mb and mb / 1e6, suffix=' MB')} "
                         f"({num(ex and ex / 1e6, suffix=' MB')}) | "
                         f"{num(c['exposed_comm_s'], '.1f')} | "
                         f"{num(params and params / 1e6, suffix='M')} | "
                         f"{num(c['peak_rss_mb'], '.0f')} |")
        acc = s["accuracy"]
        acc_text = (f"{acc['points']:+.1f} points (MiniLM on MRPC, 3 epochs, 1 rank, seeds "
                    f"{acc['seeds']}: full {acc['full']}, LoRA r8 lr 1e-3 {acc['lora']})"
                    if acc["points"] is not None
                    else f"not measured ({acc['why']})")

        lines += ["",
                  f"LoRA at 4 hosts: {x(s['lora_speedup_4_hosts'])} its 1-host speed (full ddp: "
                  f"{x(s['full_speedup_4_hosts'])}); bytes per step full / LoRA: "
                  f"{x(s['bytes_ratio_full_over_lora'])}; LoRA / full at 1 host: "
                  f"{x(s['lora_over_full_1_host'])}; accuracy LoRA - full: {acc_text}. Goal (3.8x, "
                  f"50x, within 1.5 points): {verdict(s)}.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="bert-base, 1 repeat, 8 steps")
    ap.add_argument("--models",
                    help="random-init presets [default: bert-base,bert-large; --quick: bert-base]")
    ap.add_argument("--repeats", type=int, help="[default: 3; --quick: 1]")
    ap.add_argument("--steps", type=int,
                    help="steps per run, the first 3 left out of the steady rate "
                    "[default: 12; --quick: 8]")
    ap.add_argument("--host-counts", default="1,2,4")
    ap.add_argument("--sampler", default="random", choices=["random", "grouped"],
                    help="of the timed runs (module docstring) [default: random]")
    ap.add_argument("--calibration-steps", type=int, default=8)
    ap.add_argument("--blog-calibration", type=Path,
                    help="reuse S(bert-base, blog) from a scaling.py result JSON "
                    "of the halfcore layout on this CPU kind (its bert-base fp32 run takes ~26 s a "
                    "step)")
    ap.add_argument("--lock-each", type=Path, help="hold this flock file around each run")
    ap.add_argument("--lora", choices=list(LORA_FLAGS), default="default",
                    help="the lora arm's LoRA (LORA_FLAGS) [default: default, every Linear; the "
                         "result files of "
                    "`first` have no suffix, those of `default` end in -all-linear]")
    ap.add_argument("--prefix", default="lora")
    ap.add_argument("--render", type=Path,
                    help="print the markdown of a result JSON again, run nothing")
    ap.add_argument("--resummarize", type=Path,
                    help="recompute a result JSON's summary (its cells, the accuracy "
                    "ledger as it is now) and rewrite its JSON and markdown, run nothing")
    ap.add_argument("--results-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    a = ap.parse_args()
    if a.render:
        print(markdown(json.loads(a.render.read_text())), flush=True)
        return
    if a.resummarize:
        res = json.loads(a.resummarize.read_text())
        lora_kind = res["settings"].get("lora", "first")  # the first result file predates --lora
        res["summary"] = {m: summarize(res["cells"][m], accuracy_delta(res["cpu_kind"], lora_kind))
                          for m in res["cells"]}
        a.resummarize.write_text(json.dumps(res, indent=2) + "\n")
        a.resummarize.with_suffix(".md").write_text(markdown(res) + "\n")
        print(markdown(res), flush=True)
        return
    models = (a.models or ("bert-base" if a.quick else "bert-base,bert-large")).split(",")
    repeats = a.repeats or (1 if a.quick else 3)
    steps = a.steps or (8 if a.quick else 12)
    host_counts = [int(n) for n in a.host_counts.split(",")]
    command = "python benchmarks/lora_scaling.py " + " ".join(sys.argv[1:])
    kind = read_cpu().kind
    name = (f"lora-scaling{'-quick' if a.quick else ''}-{kind}"
            f"{'' if a.lora == 'first' else '-all-linear'}")
    arms: dict[str, tuple[str, ...]] = {"full": (), "lora": LORA_FLAGS[a.lora]}
    partial = a.results_dir / f"{name}.partial.json"
    layout = LAYOUTS["halfcore"]
    cells: dict[str, dict[str, list[dict[str, Any]]]] = {m: {} for m in models}
    calibrations: dict[str, dict[str, Any]] = {}
    started = time.time()
    with (tempfile.TemporaryDirectory(prefix="lora-") as tmp,
          miniature(layout, Path(tmp) / "cluster", a.prefix) as c):
        work = Path(tmp)
        # the links are shaped per model (its calibration's link and tbf), after this description
        cluster_text = json.dumps({**c.describe(), "link_gbps": "per model", "tbf": "per model"})
        ssh_setup(c)
        for model in models:
            cluster = shaped(c, None)  # calibrated per model: one host, the link unused
            cal = calibrations[model] = calibration(cluster, work, a, model)
            cluster = shaped_to(cluster, cal, model)
            # repeats outside, host counts and arms alternating inside
            for repeat in range(repeats):
                for hosts in host_counts:
                    for arm, flags in arms.items():
                        r = run(cluster, work, a.lock_each,
                                ["mrpc", "--data-dir", str(MRPC), "--model", model,
                                 *flags], hosts, steps, a.sampler)
                        cells[model].setdefault(f"{arm}@{hosts}",
                                                []).append({**r, "repeat": repeat})
                        print(f"# {model} {arm} x{hosts} repeat {repeat}: "
                              f"{r.get('steady_tokens_per_s')} tokens/s, "
                              f"{r.get('steady_samples_per_s')} samples/s, "
                              f"{r.get('measured_tx_bytes_per_step')} B/step", file=sys.stderr,
                              flush=True)
                        partial.write_text(json.dumps({"command": command,
                                                       "calibrations": calibrations,
                                                       "cells": cells}) + "\n")
                # the control: LoRA on 1 host with the other hosts idle, as before the ballast
                r = run(cluster, work, a.lock_each,
                        ["mrpc", "--data-dir", str(MRPC), "--model", model,
                         *arms["lora"]], 1, steps, a.sampler,
                        busy=False)
                cells[model].setdefault(f"{IDLE_CONTROL}@1", []).append({**r, "repeat": repeat})
                print(f"# {model} {IDLE_CONTROL} repeat {repeat}: {r.get('steady_samples_per_s')} "
                      "samples/s",
                      file=sys.stderr, flush=True)
    first = next((r for m in cells.values() for rs in m.values() for r in rs if "cpu" in r), None)
    if first is None:
        raise SystemExit("every run failed: see the errors above")
    accuracy = accuracy_delta(kind, a.lora)
    res = {"command": command, "cpu": first["cpu"], "cpu_kind": kind, "versions": first["versions"],
           "precision": first.get("precision"), "code": code_version(),
           "cluster_text": cluster_text,
           "layout": layout.name, "wall_s": round(time.time() - started),
           "settings": {"quick": a.quick, "models": models, "repeats": repeats, "steps": steps,
                        "batch": BATCH, "host_counts": host_counts, "sampler": a.sampler,
                        "arms": {k: list(v) for k, v in arms.items()}, "lora": a.lora},
           "calibrations": calibrations,
           "summary": {m: summarize(cells[m], accuracy) for m in models},
           "cells": cells}
    out = a.results_dir / name
    out.with_suffix(".json").write_text(json.dumps(res, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(res) + "\n")
    partial.unlink(missing_ok=True)
    print(markdown(res), flush=True)


if __name__ == "__main__":
    main()
