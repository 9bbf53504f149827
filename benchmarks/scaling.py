"""Scaling across nodes on the miniature c6i cluster: every sync strategy at 1, 2 and 4 hosts,
beside the blog.

    # ddp only, 8 steps, 1 repeat
    python benchmarks/scaling.py --quick --lock-each /tmp/cpudist-cpu.lock
    # every arm, 3 alternated repeats, accuracy
    python benchmarks/scaling.py --lock-each /tmp/cpudist-cpu.lock
    # the calibration of both layouts
    python benchmarks/scaling.py --calibrate-only
    python benchmarks/scaling.py --layouts halfcore --models minilm-l6 --arms ddp,local-sgd:8 \
        --repeats 1

Layouts (benchmarks/miniature.py): `1core`, two hosts of one core each (1 and 2 hosts measured), and
`halfcore`, four hosts of half a core (two per core, each held to half by a CFS quota: 1, 2, 4
hosts). For each: build the capped hosts, calibrate host 0 (bert-base fp32 samples/s -> the link
rate that gives the blog's compute/bandwidth ratio), shape every link to that rate, `cpudist hosts
ssh-setup`, then run `cpudist run --hostfile H --nodes N --ppn 1 --precision fp32 --batch-size 32`
on host 0 for every model, arm and host count, arms alternating inside every repeat. Speed arms
train the random-weight presets distilbert-base and minilm-l6 for --steps steps without evaluation
on 128-token rows (the `synthetic` task: the blog pads every MRPC row to 128, and the calibration is
measured on such rows, so compute per sample, and with it the compute/bandwidth ratio, is the blog's
and the same at every host count); the accuracy column fine-tunes the pretrained all-MiniLM-L6-v2 on
MRPC for 3 epochs (lr 5e-5, dev-set eval) at 1 host and, at the most hosts, with ddp, ddp with the
learning rate scaled by sqrt(hosts) (the global batch grows with the hosts) and the fastest arm on
minilm-l6 (one repeat). accuracy_scaling.py repeats such runs over seeds and learning rates.

Speedup of an arm at N hosts = its median steady samples/s over the 1-host run's (plain training on
one rank, no sync: the baseline of every arm); efficiency = speedup / N. The blog's 1.7x (2 nodes)
and 3.0x (4 nodes) stand beside ours. Communication columns come from result.json (comm_time_s:
collectives in flight; exposed_comm_s: training time spent waiting for them; bus bandwidth: the
busiest rank's bytes sent over comm time; bytes between nodes expected by cpudist/traffic.py vs
counted on the interfaces).

gloo's share of a node's CPU: the 2-host ddp run is repeated with the links unshaped (veth: the wire
then costs almost nothing; what is left is CPU time, gloo's copies and reductions and the kernel's
TCP work, all inside the node's cgroup, competing with the backward pass). share = 1 - t1' / t2u,
with t2u the unshaped 2-host steady step time and t1' the 1-host steady step time (compute only)
scaled by the two runs' tokens per sample (length-grouped batches of 32 and of 64 rows differ in
length; compute follows the tokens). The shaped 2-host step (the same batches) exceeds t2u by the
wait for the wire.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from miniature import (
    LAYOUTS,
    ROOT,
    Layout,
    calibrate,
    calibration_text,
    miniature,
    on_head,
    shaped,
    ssh_setup,
)

from cpudist.cpu import read_cpu
from cpudist.train.loop import WARMUP_STEPS_EXCLUDED

MRPC = ROOT.parent / "shared" / "data" / "glue" / "MRPC"
MRPC_TRAIN_ROWS = 3668
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
SPEED_MODELS = ("distilbert-base", "minilm-l6")
BLOG_SPEEDUP = {2: 1.7, 4: 3.0}  # the blog's c6i.16xlarge cluster, bert-base fp32 on MRPC
WARMUP = "{warmup}"  # replaced by ~10% of the run's steps
# Arms: `cpudist run` flags of each sync strategy (the 1-host baseline of them all is plain
# training).
ARMS: dict[str, tuple[str, ...]] = {
    "ddp": (),
    "ddp+bf16": ("--grad-compression", "bf16"),
    "ddp+powersgd:2": ("--grad-compression", "powersgd:2"),
    "ddp-bucket-100": ("--bucket-cap-mb", "100"),
    "allreduce": ("--sync", "allreduce"),
    "gather-scatter": ("--sync", "gather-scatter"),
    "local-sgd:8": ("--sync", "local-sgd", "--sync-every", "8"),
    "local-sgd:8+warmup": ("--sync", "local-sgd", "--sync-every", "8", "--local-sgd-warmup",
                           WARMUP),
    "diloco:8": ("--sync", "local-sgd", "--sync-every", "8", "--outer-optimizer", "nesterov"),
    "ddp+freeze-emb": ("--freeze-embeddings",),
    "ddp+bf16+freeze-emb": ("--grad-compression", "bf16", "--freeze-embeddings"),
    "local-sgd:8+freeze-emb": ("--sync", "local-sgd", "--sync-every", "8", "--freeze-embeddings"),
    "local-sgd:8+mv+bf16": ("--sync", "local-sgd", "--sync-every", "8", "--average-moments", "both",
                            "--grad-compression", "bf16"),
    "local-sgd:10+mv+bf16": ("--sync", "local-sgd", "--sync-every", "10", "--average-moments",
                             "both", "--grad-compression", "bf16"),
    "local-sgd:8+m+v/2+bf16": ("--sync", "local-sgd", "--sync-every", "8", "--average-moments",
                               "both", "--second-moment-every", "2", "--grad-compression", "bf16"),
    "ddp+lr-sqrt": ("--lr-scaling", "sqrt"),  # for the accuracy runs: the same speed as ddp
}
SPEED_SKIP = ("ddp+lr-sqrt",)  # arms that train at ddp's speed: accuracy runs only
QUICK_ARMS = ("ddp",)
BASE, UNSHAPED = "1 host", "ddp unshaped"
KEEP = ("steady_samples_per_s", "train_samples_per_s", "train_time_s", "steps", "wall_time_s",
        "world_size", "global_batch_size", "sync", "sync_options", "comm_time_s", "exposed_comm_s",
        "bus_bandwidth_gbps", "expected_tx_bytes_per_step", "measured_tx_bytes_per_step",
        "grad_bytes", "metrics", "threads_per_rank", "peak_rss_mb", "precision", "launcher",
        "nodes", "run_id")


def arm_flags(arm: str, steps: int) -> list[str]:
    return [f.replace(WARMUP, str(max(1, round(steps / 10)))) for f in ARMS.get(arm, ARMS["ddp"])]


def more_steps(settings: dict[str, Any]) -> str:
    """The arms whose speed runs took more steps than --steps (arm_steps), for the result's settings
    line."""
    more = {arm: n for arm, n in settings.get("arm_steps", {}).items() if n != settings["steps"]}
    return (f" ({', '.join(f'{arm}: {n}, to hold its averages' for arm, n in more.items())})"
            if more else "")


def arm_steps(arm: str, steps: int) -> int:
    """Steps of an arm's speed runs: `steps`, or more for local SGD when its averages would be rarer
    in the steady steps (past the first WARMUP_STEPS_EXCLUDED) than once per K: a K=10 run of 8
    steps holds none there and would read as fast as no sync at all. Averages fall on the multiples
    of K (a --local-sgd-warmup arm's synchronous steps only add exchanges)."""
    flags = ARMS.get(arm, ())
    if "--sync-every" not in flags:
        return steps
    k, n = int(flags[flags.index("--sync-every") + 1]), steps
    while (n // k - WARMUP_STEPS_EXCLUDED // k) * k < n - WARMUP_STEPS_EXCLUDED:
        n += 1
    return n


def tokens_per_sample(steps_jsonl: Path) -> float | None:
    """Real tokens per sample of the steps steady samples/s counts: length-grouped batches differ in
    length."""
    steps = [s for line in steps_jsonl.read_text().splitlines() if line.strip()
             for s in [json.loads(line)] if "tokens" in s and "samples" in s]
    kept = steps[WARMUP_STEPS_EXCLUDED:] if len(steps) > 2 * WARMUP_STEPS_EXCLUDED else steps
    return sum(s["tokens"] for s in kept) / sum(s["samples"] for s in kept) if kept else None


def train(cluster: Any, work: Path, lock: Path | None, model: str, nodes: int, flags: list[str],
          length: list[str], evaluate: bool, seed: int = 42) -> dict[str, Any]:
    """One `cpudist run` on the first `nodes` hosts: MRPC with evaluation, else 128-token synthetic
    rows; the result fields the tables need (or the error)."""
    out = Path(tempfile.mkdtemp(dir=work, prefix="run-"))
    steps = int(length[length.index("--max-steps") + 1]) if "--max-steps" in length else 0
    task = (["mrpc", "--data-dir", str(MRPC)] if evaluate
            else ["synthetic", "--synthetic-samples", str(32 * nodes * max(1, steps))])
    args = ["run", *task, "--hostfile", str(cluster.hostfile), "--nodes", str(nodes), "--ppn", "1",
            "--precision", "fp32", "--batch-size", "32", "--max-seq-len", "128",
            "--model", model, "--seed", str(seed), *length, *([] if evaluate else ["--no-eval"]),
            "--output-dir", str(out / out.name), "--ledger", str(work / "ledger.jsonl"), "--json",
            "--quiet", *flags]
    try:
        r = on_head(cluster, args, lock, used=nodes)
    except RuntimeError as e:
        print(f"# failed: {e}", file=sys.stderr, flush=True)
        return {"error": str(e)[-600:], "flags": flags}
    return {**{k: r.get(k) for k in KEEP}, "flags": flags, "seed": seed, "cpu": r["cpu"],
            "versions": r["versions"],
            "tokens_per_sample": tokens_per_sample(out / out.name / "steps.jsonl")}


def speed_cells(layout: Layout, arms: list[str], gloo_share: bool) -> list[tuple[str, int]]:
    """(arm, hosts) measured per model and repeat: the 1-host baseline, each arm at 2+ hosts, ddp
    unshaped."""
    cells = [(BASE, 1)] + [(arm, n) for arm in arms if arm not in SPEED_SKIP
                           for n in layout.host_counts if n > 1]
    return cells + ([(UNSHAPED, 2)] if gloo_share else [])


def speed_runs(cluster: Any, layout: Layout, a: argparse.Namespace, work: Path,
               link: float) -> dict[str, Any]:
    """Every cell of every model, alternated inside each repeat: {model: {"arm@N": [runs]}}."""
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {m: {} for m in a.models}
    for repeat in range(a.repeats):
        for model in a.models:
            # --quick: first model only
            share = not a.no_gloo_share and (not a.quick or model == a.models[0])
            for arm, n in speed_cells(layout, a.arms, share):
                if arm == UNSHAPED:
                    cluster = shaped(cluster, None)
                steps = arm_steps(arm, a.steps)
                flags = arm_flags("ddp" if arm in (BASE, UNSHAPED) else arm, steps)
                # Seeds differ per repeat, so medians also average over which batch lengths the
                # steps drew.
                r = train(cluster, work, a.lock_each, model, n, flags, ["--max-steps", str(steps)],
                          False, seed=42 + repeat)
                if arm == UNSHAPED:
                    cluster = shaped(cluster, link)
                runs[model].setdefault(f"{arm}@{n}", []).append(r)
                sps = r.get("steady_samples_per_s")
                print(f"# {layout.name} {model} {arm} x{n}: "
                      f"{sps if sps is None else round(sps, 3)} samples/s",
                      file=sys.stderr, flush=True)
    return runs


def median_of(runs: list[dict[str, Any]], value: Any) -> float | None:
    xs = [v for r in runs if "error" not in r for v in [value(r)] if v is not None]
    return statistics.median(xs) if xs else None


def per_step(key: str) -> Any:
    """Seconds per step of a total; None where the run recorded none (one host, or a cpudist that
    did not measure)."""
    return lambda r: r[key] / r["steps"] if r.get(key) and r.get("steps") else None


def megabytes(key: str) -> Any:
    return lambda r: r[key] / 1e6 if r.get(key) else None


def summarize(cells: dict[str, list[dict[str, Any]]], link: float) -> dict[str, dict[str, Any]]:
    """Median and min-max of each cell, speedup and efficiency against the 1-host cell."""
    base = median_of(cells.get(f"{BASE}@1", []), lambda r: r["steady_samples_per_s"])
    out = {}
    for cell, runs in cells.items():
        ok = [r["steady_samples_per_s"] for r in runs if "error" not in r]
        n = int(cell.rsplit("@", 1)[1])
        s: dict[str, Any] = {"hosts": n, "runs": len(runs),
                             "failed": [r["error"] for r in runs if "error" in r]}
        if ok:
            med = statistics.median(ok)
            bus = median_of(runs, lambda r: r.get("bus_bandwidth_gbps"))
            s |= {"samples_per_s": {"median": med, "min": min(ok), "max": max(ok)},
                  "step_time_s": median_of(runs, per_step("train_time_s")),
                  "tokens_per_sample": median_of(runs, lambda r: r.get("tokens_per_sample")),
                  "steady_step_time_s": median_of(
                      runs, lambda r: r["global_batch_size"] / r["steady_samples_per_s"]),
                  "comm_s_per_step": median_of(runs, per_step("comm_time_s")),
                  "exposed_comm_s_per_step": median_of(runs, per_step("exposed_comm_s")),
                  "bus_bandwidth_gbps": bus, "bus_over_link": bus / link if bus else None,
                  "expected_tx_mb_per_step": median_of(runs,
                                                       megabytes("expected_tx_bytes_per_step")),
                  "measured_tx_mb_per_step": median_of(runs,
                                                       megabytes("measured_tx_bytes_per_step")),
                  "speedup": med / base if base else None,
                  "efficiency": med / base / n if base else None,
                  "blog_speedup": BLOG_SPEEDUP.get(n)}
        out[cell] = s
    return out


def gloo_share(summary: dict[str, dict[str, Any]]) -> dict[str, float] | None:
    """Share of a node's step that the sync's CPU work takes, and the wire's wait (see the
    docstring)."""
    one, unshaped, shaped_ = (summary.get(c, {}) for c in (f"{BASE}@1", f"{UNSHAPED}@2", "ddp@2"))
    t1, t2u, t2 = (c.get("steady_step_time_s") for c in (one, unshaped, shaped_))
    if not (t1 and t2u):
        return None
    tokens = (unshaped.get("tokens_per_sample") or 1) / (one.get("tokens_per_sample") or 1)
    return {"t1_s": t1, "t1_same_tokens_s": t1 * tokens, "t2_unshaped_s": t2u, "t2_shaped_s": t2
            or math.nan,
            "share": 1 - t1 * tokens / t2u, "wire_wait_s": (t2 - t2u) if t2 else math.nan}


def best_arm(summary: dict[str, dict[str, Any]], hosts: int) -> str:
    """The arm with the highest speedup at `hosts` (ddp when nothing else ran)."""
    scored = [(s.get("speedup") or 0, cell.rsplit("@", 1)[0]) for cell, s in summary.items()
              if s["hosts"] == hosts and not cell.startswith((BASE, UNSHAPED))]
    return max(scored, default=(0, "ddp"))[1]


def accuracy_runs(cluster: Any, layout: Layout, arms: list[str], a: argparse.Namespace,
                  work: Path) -> dict[str, Any]:
    """Pretrained MiniLM on MRPC, 3 epochs with dev eval: 1 host, then each arm at the most
    hosts."""
    out: dict[str, Any] = {}
    for arm, n in [(BASE, 1)] + [(arm, layout.hosts) for arm in arms]:
        steps = 3 * math.ceil(MRPC_TRAIN_ROWS / (32 * n))
        flags = arm_flags("ddp" if arm == BASE else arm, steps)
        # --lr-scaling none as these arms ran before auto became the default (2026-11-28); an arm's
        # own wins (last)
        length = ["--epochs", "3", "--lr", "5e-5", "--lr-scaling", "none"]
        out[f"{arm}@{n}"] = train(cluster, work, a.lock_each, MINILM, n, flags, length, True)
    return out


def plan_check(ledger: Path, runs: dict[str, dict[str, list[dict[str, Any]]]],
               link: float) -> list[dict[str, Any]]:
    """`cpudist plan`'s prediction of every shaped multi-host speed run from its 1-host run and the
    link rate."""
    from cpudist.results.ledger import load_sources
    from cpudist.results.validation import validate

    unshaped = {r.get("run_id") for cells in runs.values() for r in cells.get(f"{UNSHAPED}@2", [])}
    results = [r for r in load_sources((ledger,)) if r.run_id not in unshaped
               and r.task == "synthetic"]
    # the 1-node run's model only
    pure = {row.run_id: row for row in validate(results, link, cpu_s_per_byte=0.0)}
    return [{"model": next(r.model for r in results if r.run_id == row.run_id),
             **dataclasses.asdict(row), "predicted_without_cpu": pure[row.run_id].predicted_speedup,
             "error_without_cpu": pure[row.run_id].error}
            for row in validate(results, link)]


def plan_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| model | sync | hosts | measured speedup | predicted | error | measured step s | "
             "predicted step s |"
             " overlap f | sync CPU c (s/GB) | without c: predicted (error) |", "|---" * 11 + "|"]
    lines += [f"| {r['model']} | {r['sync']} | {r['nodes']} | {r['measured_speedup']:.2f}x | "
              f"{r['predicted_speedup']:.2f}x | {r['error']:+.0%}{' !' if r['flagged'] else ''} | "
              f"{r['measured_step_s']:.2f} | {r['predicted_step_s']:.2f} | {r['overlap']:.2f} | "
              f"{r.get('cpu_s_per_byte', 0.0) * 1e9:.2f} | {without(r)} |" for r in rows]
    return lines


def without(r: dict[str, Any]) -> str:
    if "predicted_without_cpu" not in r:
        return "-"
    return f"{r['predicted_without_cpu']:.2f}x ({r['error_without_cpu']:+.0%})"


def fmt(x: Any, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:{spec}}{suffix}"


def why(error: str) -> str:
    """The line of a failed run's stderr that says what went wrong (cpudist prints it as `Error:
    ...`)."""
    lines = [x[x.find("Error:"):] for x in error.splitlines()
             if "Error:" in x] or error.strip().splitlines()[-1:]
    return (lines or ["?"])[0].split(" See '")[0].replace("|", "/")[:160]


def speed_table(summary: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["| arm | hosts | samples/s median (min-max) | tokens/sample | step s | comm s/step | "
             "exposed comm s/step | bus Gbit/s (of link) | MB/step between nodes: expected / "
             "measured | speedup | efficiency | blog |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for cell, s in summary.items():
        arm = cell.rsplit("@", 1)[0]
        if "samples_per_s" not in s:
            lines.append(f"| {arm} | {s['hosts']} | failed: {why(s['failed'][0])} |  |  |  |  |  | "
                         " |  |  |  |")
            continue
        sp = s["samples_per_s"]
        lines.append(
            f"| {arm} | {s['hosts']} | {sp['median']:.3f} ({sp['min']:.3f}-{sp['max']:.3f}) | "
            f"{fmt(s['tokens_per_sample'], '.1f')} | {fmt(s['step_time_s'])} | "
            f"{fmt(s['comm_s_per_step'])} | {fmt(s['exposed_comm_s_per_step'])} | "
            f"{fmt(s['bus_bandwidth_gbps'], '.3f')} ({fmt(s['bus_over_link'], '.0%')}) | "
            f"{fmt(s['expected_tx_mb_per_step'], '.1f')} / "
            f"{fmt(s['measured_tx_mb_per_step'], '.1f')} | {fmt(s['speedup'], '.2f', 'x')} | "
            f"{fmt(s['efficiency'], '.0%')} | {fmt(s['blog_speedup'], '.1f', 'x')} |")
    return lines


def accuracy_table(acc: dict[str, dict[str, Any]]) -> list[str]:
    base = acc.get(f"{BASE}@1", {}).get("metrics") or {}
    lines = ["| arm | hosts | accuracy | F1 | accuracy vs 1 host (points) | train s | samples/s |",
             "|---|---|---|---|---|---|---|"]
    for cell, r in acc.items():
        arm, n = cell.rsplit("@", 1)
        if "error" in r:
            lines.append(f"| {arm} | {n} | failed: {why(r['error'])} |  |  |  |  |")
            continue
        m = r["metrics"]
        delta = 100 * (m["accuracy"] - base["accuracy"]) if "accuracy" in base else None
        lines.append(f"| {arm} | {n} | {m['accuracy']:.4f} | {m.get('f1', math.nan):.4f} | "
                     f"{fmt(delta, '+.1f')} | "
                     f"{r['train_time_s']:.0f} | {r['train_samples_per_s']:.2f} |")
    return lines


def markdown(res: dict[str, Any]) -> str:
    c, s = res["cpu"], res["settings"]
    lines = [f"# Scaling on the miniature c6i cluster: {res['layout']} ({res['cpu_kind']})"
             + (" [quick]" if s["quick"] else ""), "", f"Made by: `{res['command']}`", "",
             f"CPU {c.get('model')} ({res['cpu_kind']}); torch {res['versions'].get('torch')}; "
             f"cpudist {res['versions'].get('cpudist')} at commit {res['code']['commit']}"
             + (" (with uncommitted edits)" if res["code"]["edited"] else "") + ".", "",
             calibration_text(res["calibration"], res["cluster"]), "",
             "Every number here comes from capped hosts that do not compete for cores (one rank "
             f"per host, cpusets and quotas above); links `{res['calibration']['tbf']}` unless "
             "marked unshaped.", "",
             "Settings: fp32, batch 32 per rank, every row 128 tokens (synthetic task: the blog "
             f"pads MRPC rows to 128), {s['steps']} steps without eval per speed "
             f"run{more_steps(s)}, {s['repeats']} alternated repeat(s); arms: "
             f"{', '.join(s['arms'])}. Speedup: median steady samples/s over the 1-host run's "
             "(plain training, one rank); efficiency = speedup / hosts; blog: the blog's c6i "
             "speedup at that node count.", ""]
    for model, summary in res["speed"].items():
        lines += [f"## {model} (random weights)", "", *speed_table(summary), ""]
        if not any(s.get("comm_s_per_step") for s in summary.values()):
            lines += ["Communication columns are empty: the cpudist that ran records no "
                      "communication times or bytes between nodes (result.json's comm_time_s, "
                      "exposed_comm_s, bus_bandwidth_gbps, *_tx_bytes_per_step come with the "
                      "--sync work).", ""]
        g = res["gloo_share"].get(model)
        if g:
            lines += [f"gloo's share of a {res['cluster']['cores_per_host']:g}-core node's CPU "
                      f"(ddp, 2 hosts, links unshaped): **{g['share']:.0%}** of the step "
                      f"({g['t2_unshaped_s']:.2f} s vs {g['t1_same_tokens_s']:.2f} s of compute "
                      f"for the same tokens on 1 host, {g['t1_s']:.2f} s measured); waiting for "
                      f"the shaped wire adds {fmt(g['wire_wait_s'])} s (shaped step "
                      f"{fmt(g['t2_shaped_s'])} s).", ""]
    if res.get("plan"):
        flagged = sum(r["flagged"] for r in res["plan"])
        lines += ["## `cpudist plan` against these runs", "",
                  "Each shaped multi-host run predicted from its 1-host run, the link rate, DDP's "
                  "overlap f and the sync's CPU cost c per byte on the busiest link, f and c "
                  "fitted on the other measured runs (c on those of the same strategy where there "
                  "are any), never on the run checked (cpudist/results/planner.py); the last "
                  "column is the model without c, from the 1-host run and the link alone; "
                  f"{flagged} of {len(res['plan'])} off by more than 15% (`!`).", "",
                  *plan_table(res["plan"]), ""]
    if res.get("accuracy"):
        lines += ["## MRPC dev accuracy: pretrained all-MiniLM-L6-v2, 3 epochs, lr 5e-5 "
                  "(ddp+lr-sqrt: x sqrt(hosts)), batch 32 per rank (fastest arm on minilm-l6: "
                  f"{res['best_arm']})", "",
                  *accuracy_table(res["accuracy"]), ""]
    else:
        lines += ["Accuracy column: not run in this form (`--accuracy` runs it).", ""]
    return "\n".join(lines)


def code_version() -> dict[str, Any]:
    """Which cpudist made the numbers: its folder, and the git commit (and whether edited) when it
    has one."""
    import cpudist

    folder = Path(cpudist.__file__).resolve().parent
    git = ["git", "-C", str(folder)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--", "."], capture_output=True,
                           text=True).stdout.strip()
    return {"cpudist": str(folder), "commit": head or None, "edited": bool(dirty) if head else None}


def run_layout(layout: Layout, a: argparse.Namespace, command: str,
               work: Path) -> dict[str, Any] | None:
    """Calibrate (or reuse), shape, ssh-setup, then the speed and accuracy runs of one layout."""
    with miniature(layout, work / "cluster", a.prefix) as cluster:
        reused = json.loads(a.calibration.read_text()).get(layout.name) if a.calibration else None
        cal = reused or calibrate(cluster, a.calibration_steps, work, a.lock_each)
        print(calibration_text(cal, cluster.describe()), flush=True)
        if a.calibrate_only:
            return {"layout": layout.name, "calibration": cal, "cluster": cluster.describe()}
        cluster = shaped(cluster, cal["link_gbps"])
        ssh_setup(cluster)
        runs = speed_runs(cluster, layout, a, work, cal["link_gbps"])
        speed = {m: summarize(cells, cal["link_gbps"]) for m, cells in runs.items()}
        partial = a.results_dir / f"scaling-{layout.name}-speed-runs.partial.json"
        # an hour of runs
        partial.write_text(json.dumps({"command": command, "runs": runs}, indent=2) + "\n")
        plan = plan_check(work / "ledger.jsonl", runs, cal["link_gbps"])
        best = best_arm(speed.get("minilm-l6", {}), layout.hosts)
        # a goal's arm
        acc_arms = ["ddp", "ddp+lr-sqrt", best] + [arm for arm in ("local-sgd:8",) if arm in a.arms]
        acc = accuracy_runs(cluster, layout, list(dict.fromkeys(acc_arms)), a,
                            work) if a.accuracy else {}
        partial.unlink()
        # every run's result.json line, for `cpudist report` / `cpudist plan --validate` on these
        # numbers
        shutil.copyfile(work / "ledger.jsonl",
                        a.results_dir / f"scaling-{layout.name}{'-quick' if a.quick else ''}"
                        f"{'-' + a.tag if a.tag else ''}-{read_cpu().kind}-ledger.jsonl")
        first = next((r for cells in runs.values() for rs in cells.values() for r in rs
                      if "cpu" in r), None)
        if first is None:
            raise RuntimeError(f"every run of {layout.name} failed: see the errors above")
        return {"layout": layout.name, "command": command, "cpu": first["cpu"],
                "cpu_kind": read_cpu().kind,
                "versions": first["versions"], "code": code_version(), "calibration": cal,
                "calibration_from": str(a.calibration or ""), "cluster": cluster.describe(),
                "settings": {"quick": a.quick, "steps": a.steps, "repeats": a.repeats,
                             "arms": a.arms, "models": a.models,
                             "arm_flags": {arm: arm_flags(arm, a.steps) for arm in a.arms},
                             "arm_steps": {arm: arm_steps(arm, a.steps) for arm in a.arms}},
                "speed": speed, "gloo_share": {m: gloo_share(s) for m, s in speed.items()},
                "best_arm": best, "accuracy": acc, "blog_speedup": BLOG_SPEEDUP, "plan": plan,
                "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="ddp only, 8 steps, 1 repeat, no accuracy runs")
    ap.add_argument("--layouts", default="1core,halfcore")
    ap.add_argument("--host-counts",
                    help="measure only these host counts of each layout (1 is always measured), "
                    "e.g. 4: the 1-host baseline and 4 hosts")
    ap.add_argument("--tag",
                    help="added to the result files' names (a focused run beside the full one)")
    ap.add_argument("--models", help=f"speed models [default: {','.join(SPEED_MODELS)}]")
    ap.add_argument("--arms",
                    help=f"of: {', '.join(ARMS)} [default: all; --quick: {','.join(QUICK_ARMS)}]")
    ap.add_argument("--steps", type=int,
                    help="optimizer steps per speed run [default: 16; --quick: 8]")
    ap.add_argument("--repeats", type=int, help="[default: 3; --quick: 1]")
    ap.add_argument("--accuracy", action=argparse.BooleanOptionalAction,
                    help="[default: on; --quick: off]")
    ap.add_argument("--no-gloo-share", action="store_true", help="skip the unshaped 2-host ddp run")
    ap.add_argument("--calibrate-only", action="store_true")
    ap.add_argument("--calibration", type=Path,
                    help="reuse a calibration JSON written by --calibrate-only")
    ap.add_argument("--calibration-steps", type=int,
                    help="[default: 10; --quick: 7] (steady samples/s leaves out "
                    "the first 3 steps only when there are more than 6: a 4-step run read 20%% "
                    "slow)")
    ap.add_argument("--lock-each", type=Path,
                    help="hold this flock file around each measurement (a shared "
                    "machine's CPU lock; do not also run the script under flock(1) on the same "
                    "file)")
    ap.add_argument("--prefix", default="mini", help="namespace and cgroup prefix of the hosts")
    ap.add_argument("--render", type=Path,
                    help="print the markdown of a result JSON again, run nothing")
    ap.add_argument("--results-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    a = ap.parse_args()
    a.models = a.models.split(",") if a.models else list(SPEED_MODELS)
    a.arms = a.arms.split(",") if a.arms else list(QUICK_ARMS if a.quick else ARMS)
    unknown = [arm for arm in a.arms if arm not in ARMS]
    if unknown:
        ap.error(f"unknown arms {unknown}: choose from {', '.join(ARMS)}")
    a.steps = a.steps or (8 if a.quick else 16)
    a.repeats = a.repeats or (1 if a.quick else 3)
    a.accuracy = (not a.quick) if a.accuracy is None else a.accuracy
    a.calibration_steps = a.calibration_steps or (7 if a.quick else 10)
    command = "python benchmarks/scaling.py " + " ".join(sys.argv[1:])
    kind, quick = read_cpu().kind, ("-quick" if a.quick else "") + (f"-{a.tag}" if a.tag else "")
    results = a.results_dir
    results.mkdir(parents=True, exist_ok=True)
    if a.render:
        print(markdown(json.loads(a.render.read_text())), flush=True)
        return
    calibrations = {}
    for name in a.layouts.split(","):
        layout = LAYOUTS[name]
        if a.host_counts:
            wanted = {1, *(int(n) for n in a.host_counts.split(","))}
            layout = dataclasses.replace(layout,
                                         host_counts=tuple(n for n in layout.host_counts
                                                           if n in wanted))
        with tempfile.TemporaryDirectory(prefix="mini-") as work:
            res = run_layout(layout, a, command, Path(work))
        assert res is not None
        if a.calibrate_only:
            calibrations[name] = {**res["calibration"], "cluster": res["cluster"]}
            continue
        path = results / f"scaling-{name}{quick}-{kind}"
        path.with_suffix(".json").write_text(json.dumps(res, indent=2) + "\n")
        path.with_suffix(".md").write_text(markdown(res) + "\n")
        print(markdown(res), flush=True)
    if a.calibrate_only:
        out = results / f"scaling-calibration{quick}-{kind}.json"
        out.write_text(json.dumps({"command": command, **calibrations}, indent=2) + "\n")
        print(f"calibration written to {out}", flush=True)


if __name__ == "__main__":
    main()
