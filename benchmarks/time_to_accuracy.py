"""Time to accuracy on the capped miniature cluster: how much sooner 2 and 4 hosts reach 1 host's model quality.

    python benchmarks/time_to_accuracy.py --quick --lock-each /tmp/cpudist-cpu.lock   # MRPC, 1 seed each
    python benchmarks/time_to_accuracy.py --lock-each /tmp/cpudist-cpu.lock           # MRPC and SST-2, 5 + 3 seeds
    python benchmarks/time_to_accuracy.py --render benchmarks/results/time-to-accuracy-quick-amx-bf16.json

Hosts: benchmarks/miniature.py's `halfcore` layout (4 namespace hosts, half a core each by CFS quota, two per
core, so no two ranks compete for a core). What users pay for is a model of a given quality sooner, so each run
is timed from its launch (the `cpudist run` command started on host 0) to its first evaluation at or above the
target; the evaluations run every fixed number of samples (sharded over the ranks, their time counted), and
each one's end is read from result.json's `evaluations[].at` (the hosts share one clock).

The link is calibrated to OUR node on the task, not to the blog's work (issue 24): cpudist trains real rows
(dynamic padding, the CPU's default precision), so a node finishes a sample several times sooner than the
blog's fp32 128-token rows, and the same network is relatively slower. Four speeds of one miniature host (1
rank, steady samples/s): S(bert-base, blog) and S(model, blog) on 128-token synthetic rows in fp32, S(bert-base,
task) and S(model, task) as `cpudist run` trains the task. A c6i.16xlarge running cpudist on the task would do
23.6 x S(bert-base, task) / S(bert-base, blog) x S(model, blog) / S(bert-base, blog) samples/s (the blog's
23.6 times cpudist's ratio over the blog's settings, times the two models' ratio under the blog's settings), on
25 Gbit/s; the link gets 25 Gbit/s x S(model, task) / that, so compute / bandwidth is the c6i's running cpudist.

Target per task: the median over --target-seeds of 1 host's final dev accuracy (3 MRPC epochs, 1 SST-2 epoch,
batch 32, lr 5e-5, 10% warm-up), minus 0.5 point. The same 1-host runs give the 1-host time to target. Arms at
2 and 4 hosts (batch 32 per host, the global batch grows): ddp with lr 1e-4 scaled linearly with the hosts (the
best 4-rank arm of accuracy_scaling.py), the same with a bf16 wire, and local SGD (K=8) with both AdamW moments
averaged on a bf16 wire; ddp sends the word embedding's touched rows only (the default --embedding-sync rows), the
dense-emb arm all of it, as ddp did before. `summary[task].speedup_to_target_4_hosts`: the 1-host median time over
the best arm's 4-host median time (a seed that never reaches the target counts as never: the median is then over
reached runs only if more than half reached, else none). Goal: >= 3.3x on each task.
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

GLUE = ROOT.parent / "shared" / "data" / "glue"
MODEL, MODEL_PRESET = "sentence-transformers/all-MiniLM-L6-v2", "minilm-l6"  # pretrained; the same shape, random
TASKS = {"mrpc": {"data": GLUE / "MRPC", "epochs": 3, "eval_samples": 1024},
         "sst2": {"data": GLUE / "SST-2", "epochs": 1, "eval_samples": 8192}}
BATCH, LR = 32, "5e-5"
BF16_WIRE = ("--grad-compression", "bf16")
X2N = ("--lr", "1e-4", "--lr-scaling", "linear")
DENSE = ("--embedding-sync", "dense")  # DDP all-reduces all of the word embedding (cpudist before rows)
ARMS: dict[str, tuple[str, ...]] = {
    "ddp lr x2N": X2N,
    "ddp bf16 wire lr x2N": (*X2N, *BF16_WIRE),
    "ddp bf16 wire dense-emb lr x2N": (*X2N, *BF16_WIRE, *DENSE),
    "local-sgd:8+mv+bf16 lr x2N": ("--sync", "local-sgd", "--sync-every", "8", "--average-moments", "both",
                                   *BF16_WIRE, *X2N),
}
BASE = "1 host"
GOAL = 3.3
KEEP = ("run_id", "steps", "wall_time_s", "train_samples_per_s", "world_size", "global_batch_size", "sync", "lr",
        "metrics", "precision", "threads_per_rank", "comm_time_s", "exposed_comm_s", "measured_tx_bytes_per_step",
        "startup")  # rank 0's phases before its first step: what a host count adds before training


def speed(cluster: Any, work: Path, lock: Path | None, args: list[str], steps: int) -> float:
    """One host's steady samples/s for `cpudist run ARGS` (1 rank on host 0, no evaluation)."""
    out = Path(tempfile.mkdtemp(dir=work, prefix="speed-"))
    r = on_head(cluster, ["run", *args, "--hostfile", str(cluster.hostfile), "--nodes", "1", "--ppn", "1",
                          "--batch-size", str(BATCH), "--max-steps", str(steps), "--no-eval", "--save-model", "none",
                          "--output-dir", str(out / "run"), "--json", "--quiet"], lock, used=1)
    return float(r["steady_samples_per_s"])


def calibration(cluster: Any, work: Path, a: argparse.Namespace, task: str) -> dict[str, Any]:
    """The four speeds and the link they give (module docstring)."""
    if a.calibration:  # all four measured together by an earlier run on this machine (its "# TASK calibration:" line)
        reused = json.loads(a.calibration.read_text())
        if reused["task"] != task:
            raise SystemExit(f"--calibration {a.calibration} is {reused['task']}'s, not {task}'s")
        return {**reused, "reused_from": str(a.calibration)}
    if a.blog_calibration:  # S(bert-base, blog) measured by scaling.py on this layout and CPU kind (26 s a step)
        bb_blog = float(json.loads(a.blog_calibration.read_text())["calibration"]["samples_per_s"])
    else:
        bb_blog = float(calibrate(cluster, a.calibration_steps, work, a.lock_each)["samples_per_s"])
    steps = a.calibration_steps
    synthetic = ["synthetic", "--precision", "fp32", "--max-seq-len", "128", "--synthetic-samples", str(BATCH * steps)]
    on_task = [task, "--data-dir", str(TASKS[task]["data"])]
    bb_task = speed(cluster, work, a.lock_each, [*on_task, "--model", "bert-base"], steps)
    m_blog = speed(cluster, work, a.lock_each, [*synthetic, "--model", MODEL_PRESET], steps)
    m_task = speed(cluster, work, a.lock_each, [*on_task, "--model", MODEL], steps)
    c6i_task = BLOG_SAMPLES_PER_S * (bb_task / bb_blog) * (m_blog / bb_blog)
    link = BLOG_LINK_GBPS * m_task / c6i_task
    return {"task": task, "bert_base_blog_samples_per_s": bb_blog, "bert_base_task_samples_per_s": bb_task,
            "model_blog_samples_per_s": m_blog, "model_task_samples_per_s": m_task,
            "cpudist_over_blog_bert_base": bb_task / bb_blog, "model_over_bert_base_blog": m_blog / bb_blog,
            "c6i_task_samples_per_s": c6i_task, "link_gbps": link, "steps": steps,
            "bert_base_blog_from": str(a.blog_calibration or "measured")}


def train(cluster: Any, work: Path, lock: Path | None, task: str, hosts: int, flags: tuple[str, ...],
          seed: int, rows: list[str]) -> dict[str, Any]:
    """One run to the task's epochs, evaluating every fixed number of samples; its time to each evaluation."""
    spec = TASKS[task]
    every = max(1, int(spec["eval_samples"]) // (BATCH * hosts))
    out = Path(tempfile.mkdtemp(dir=work, prefix="run-"))
    args = ["run", task, "--data-dir", str(spec["data"]), "--model", MODEL, "--hostfile", str(cluster.hostfile),
            "--nodes", str(hosts), "--ppn", "1", "--batch-size", str(BATCH), "--lr", LR, "--epochs",
            str(spec["epochs"]), "--seed", str(seed), "--eval-every", str(every), "--save-model", "none",
            "--output-dir", str(out / "run"), "--json", "--quiet", *rows, *flags]
    launched = time.time()
    try:
        r = on_head(cluster, args, lock, timeout=4 * 3600, used=hosts)
    except RuntimeError as e:
        print(f"# failed: {e}", file=sys.stderr, flush=True)
        return {"error": str(e)[-600:], "flags": list(flags), "seed": seed, "hosts": hosts}
    evals = [{"step": e["step"], "accuracy": e["metrics"]["accuracy"], "after_s": round(e["at"] - launched, 2),
              "eval_s": round(e["seconds"], 2)} for e in r["evaluations"]]
    return {**{k: r.get(k) for k in KEEP}, "hosts": hosts, "seed": seed, "flags": list(flags), "eval_every": every,
            "evaluations": evals, "cpu": r["cpu"], "versions": r["versions"],
            "command": "cpudist " + " ".join(args)}


def time_to(run: dict[str, Any], target: float) -> float | None:
    """Seconds from launch to the first evaluation at or above the target (None: never, or the run failed)."""
    return next((e["after_s"] for e in run.get("evaluations", []) if e["accuracy"] >= target), None)


def median_time(times: list[float | None]) -> float | None:
    """The median over seeds, a never-reached seed counting as longer than any: none when half or more never did."""
    reached = sorted(t for t in times if t is not None)
    if not times or len(reached) * 2 <= len(times):
        return None
    ordered = reached + [float("inf")] * (len(times) - len(reached))
    return statistics.median(ordered)


def summarize(task: str, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Target from the 1-host runs, every cell's times to it, and the verdict."""
    finals = [r["metrics"]["accuracy"] for r in runs[f"{BASE}@1"] if "metrics" in r]
    target = statistics.median(finals) - 0.005 if finals else None
    cells = {}
    for cell, rs in runs.items():
        times = [time_to(r, target) for r in rs] if target is not None else []
        cells[cell] = {"seeds": [r["seed"] for r in rs], "times_s": times, "median_s": median_time(times),
                       "final_accuracy": [r.get("metrics", {}).get("accuracy") for r in rs],
                       "errors": [r["error"] for r in rs if "error" in r]}
    base = cells[f"{BASE}@1"]["median_s"]
    speedups = {arm: base / cells[f"{arm}@4"]["median_s"] for arm in ARMS
                if f"{arm}@4" in cells and base and cells[f"{arm}@4"]["median_s"]}
    best = max(speedups, key=lambda arm: speedups[arm]) if speedups else None
    return {"target": target, "one_host_final_accuracy": finals, "seeds": sorted({s for c in cells.values()
                                                                                 for s in c["seeds"]}),
            "cells": cells, "speedup_to_target_4_hosts": speedups.get(best) if best else None, "best_arm": best,
            "speedups_4_hosts": speedups, "goal": GOAL,
            "met": bool(best and speedups[best] >= GOAL)}


def markdown(res: dict[str, Any]) -> str:
    lines = [f"# Time to accuracy on the miniature cluster ({res['cpu_kind']})", "", f"`{res['command']}`", "",
             f"CPU: {res['cpu'].get('model', res['cpu'])}; code {res['code']}. Hosts: {res['cluster_text']}", ""]
    for task, s in res["summary"].items():
        cal = res["calibrations"][task]
        lines += [f"## {task}", "",
                  f"Link {cal['link_gbps']:.3f} Gbit/s (`{cal.get('tbf', '?')}`): one host "
                  f"{cal['model_task_samples_per_s']:.2f} samples/s on "
                  f"{task} (bert-base: {cal['bert_base_task_samples_per_s']:.2f} on {task}, "
                  f"{cal['bert_base_blog_samples_per_s']:.3f} on the blog's rows [{cal['bert_base_blog_from']}]; "
                  f"{MODEL_PRESET} on the blog's rows {cal['model_blog_samples_per_s']:.2f}) -> a c6i.16xlarge "
                  f"running cpudist: {cal['c6i_task_samples_per_s']:.1f} samples/s on 25 Gbit/s.", "",
                  f"Target: {s['target']:.4f} (1-host final accuracy {s['one_host_final_accuracy']} median - 0.5 pt)"
                  if s["target"] is not None else "Target: none (every 1-host run failed)", "",
                  "| arm | hosts | seeds | time to target per seed (s) | median (s) | speedup vs 1 host | final acc "
                  "| launch to the last evaluation, median (s) | train samples/s, median |",
                  "|---|---|---|---|---|---|---|---|---|"]
        base = s["cells"].get(f"{BASE}@1", {}).get("median_s")
        for cell, c in s["cells"].items():
            arm, hosts = cell.rsplit("@", 1)
            med = c["median_s"]
            sp = f"{base / med:.2f}x" if base and med else "-"
            times = " / ".join("never" if t is None else f"{t:.0f}" for t in c["times_s"])
            acc = " / ".join("-" if v is None else f"{100 * v:.1f}" for v in c["final_accuracy"])
            done = [r for r in res["runs"][task][cell] if r.get("evaluations")]
            end = statistics.median(r["evaluations"][-1]["after_s"] for r in done) if done else None
            sps = statistics.median(r["train_samples_per_s"] for r in done) if done else None
            lines.append(f"| {arm} | {hosts} | {','.join(map(str, c['seeds']))} | {times} | "
                         f"{'-' if med is None else f'{med:.0f}'} | {sp} | {acc} | "
                         f"{'-' if end is None else f'{end:.0f}'} | {'-' if sps is None else f'{sps:.1f}'} |")
        # the same work at every arm (the task's epochs): a run's speed without the seed's path to the target
        lines += ["", "The last two columns time the whole run (every arm trains the same epochs): its speed apart "
                  "from when its accuracy first crosses the target."]
        verdict = s["speedup_to_target_4_hosts"]
        lines += ["", f"4 hosts, best arm ({s['best_arm']}): "
                  f"{'-' if verdict is None else f'{verdict:.2f}x'} sooner than 1 host; goal {GOAL}x: "
                  f"{'met' if s['met'] else 'not met'}.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="MRPC, seed 42 for the target and the arms")
    ap.add_argument("--tasks", help="[default: mrpc,sst2; --quick: mrpc]")
    ap.add_argument("--arms", help=f"of: {', '.join(ARMS)} [default: all]")
    ap.add_argument("--target-seeds", help="1-host runs setting the target [default: 42-46; --quick: 42]")
    ap.add_argument("--seeds", help="seeds of each arm at 2 and 4 hosts [default: 42,43,44; --quick: 42]")
    ap.add_argument("--host-counts", default="2,4")
    ap.add_argument("--calibration-steps", type=int, default=10)
    ap.add_argument("--blog-calibration", type=Path, help="reuse S(bert-base, blog) from a scaling.py result JSON "
                    "of the halfcore layout on this CPU kind (its bert-base fp32 run takes ~26 s a step)")
    ap.add_argument("--calibration", type=Path, help="reuse all four speeds of one task from a JSON file (the "
                    "'# TASK calibration:' line an earlier run on this machine printed), the link with them")
    ap.add_argument("--train-rows", type=int, help="train on the first N rows and evaluate on N/4 (trying the "
                    "script; such a result answers nothing)")
    ap.add_argument("--lock-each", type=Path, help="hold this flock file around each run")
    ap.add_argument("--prefix", default="tta")
    ap.add_argument("--tag", default="", help="added to the result files' name (a partial plan: -mrpc-3-seeds)")
    ap.add_argument("--render", type=Path, help="print the markdown of a result JSON again, run nothing")
    ap.add_argument("--results-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    a = ap.parse_args()
    if a.render:
        print(markdown(json.loads(a.render.read_text())), flush=True)
        return
    tasks = (a.tasks or ("mrpc" if a.quick else "mrpc,sst2")).split(",")
    arms = a.arms.split(",") if a.arms else list(ARMS)
    if unknown := [x for x in [*arms] if x not in ARMS] + [t for t in tasks if t not in TASKS]:
        ap.error(f"unknown arms or tasks {unknown}: arms {', '.join(ARMS)}; tasks {', '.join(TASKS)}")
    target_seeds = [int(s) for s in (a.target_seeds or ("42" if a.quick else "42,43,44,45,46")).split(",")]
    seeds = [int(s) for s in (a.seeds or ("42" if a.quick else "42,43,44")).split(",")]
    host_counts = [int(n) for n in a.host_counts.split(",")]
    rows = (["--max-train-samples", str(a.train_rows), "--max-eval-samples", str(max(1, a.train_rows // 4))]
            if a.train_rows else [])
    command = "python benchmarks/time_to_accuracy.py " + " ".join(sys.argv[1:])
    kind = read_cpu().kind
    name = f"time-to-accuracy{'-quick' if a.quick else ''}{'-rows' if a.train_rows else ''}{a.tag}-{kind}"
    partial = a.results_dir / f"{name}.partial.json"
    layout = LAYOUTS["halfcore"]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {t: {} for t in tasks}
    calibrations: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="tta-") as tmp, miniature(layout, Path(tmp) / "cluster", a.prefix) as c:
        work = Path(tmp)
        # the links are shaped per task (its calibration's link and tbf), after this description
        cluster_text = json.dumps({**c.describe(), "link_gbps": "per task", "tbf": "per task"})
        ssh_setup(c)
        for task in tasks:
            cluster = shaped(c, None)  # calibrated per task: one host, the link unused
            cal = calibrations[task] = calibration(cluster, work, a, task)
            cluster = shaped_to(cluster, cal, task)
            cells = [(BASE, 1, (), s) for s in target_seeds]
            cells += [(arm, n, ARMS[arm], s) for s in seeds for n in host_counts for arm in arms]
            for arm, hosts, flags, seed in cells:  # seeds outside, arms alternating inside
                r = train(cluster, work, a.lock_each, task, hosts, flags, seed, rows)
                runs[task].setdefault(f"{arm}@{hosts}", []).append(r)
                seen = [(e["after_s"], e["accuracy"]) for e in r.get("evaluations", [])]
                print(f"# {task} {arm} x{hosts} seed {seed}: {seen}", file=sys.stderr, flush=True)
                partial.write_text(json.dumps({"command": command, "calibrations": calibrations, "runs": runs}) + "\n")
    first = next((r for t in runs.values() for rs in t.values() for r in rs if "cpu" in r), None)
    if first is None:
        raise SystemExit("every run failed: see the errors above")
    res = {"command": command, "cpu": first["cpu"], "cpu_kind": kind, "versions": first["versions"],
           "code": code_version(), "cluster_text": cluster_text, "layout": layout.name,
           "settings": {"quick": a.quick, "tasks": tasks, "arms": {arm: list(ARMS[arm]) for arm in arms},
                        "target_seeds": target_seeds, "seeds": seeds, "train_rows": a.train_rows,
                        "host_counts": host_counts, "batch": BATCH,
                        "lr": LR, "model": MODEL, "tasks_spec": {t: {k: str(v) for k, v in TASKS[t].items()}
                                                                 for t in tasks}},
           "calibrations": calibrations, "summary": {t: summarize(t, runs[t]) for t in tasks}, "runs": runs}
    out = a.results_dir / name
    out.with_suffix(".json").write_text(json.dumps(res, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(res) + "\n")
    partial.unlink(missing_ok=True)
    print(markdown(res), flush=True)


if __name__ == "__main__":
    main()
