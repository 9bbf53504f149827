"""The summary and the markdown of benchmarks/time_to_accuracy.py, computed from its ledger's
runs."""

from __future__ import annotations

import statistics
from typing import Any

BASE = "1 host"
HF = "hf trainer+torchrun lr xN"
HF_LAUNCH = "hf trainer+cpudist launch lr xN"  # the same script, started by `cpudist launch`
PEERS = (HF, HF_LAUNCH)  # arms that are not `cpudist run`
# issue 42's goals: 4 hosts against 1 host's time to target, by task (other tasks: SST-2's), and
# against HF Trainer + torchrun on the same 4 hosts
GOALS, GOAL, GOAL_VS_HF = {"sst2": 3.3, "mrpc": 3.0}, 3.3, 2.0
PARTS = ("compute_s", "sync_cpu_s", "wire_s", "wait_s", "eval_s")


def time_to(run: dict[str, Any], target: float) -> float | None:
    """Seconds from launch to the first evaluation at or above the target (None: never, or the run
    failed)."""
    return next((e["after_s"] for e in run.get("evaluations", []) if e["accuracy"] >= target), None)


def median_time(times: list[float | None]) -> float | None:
    """The median over seeds, a never-reached seed counting as longer than any: none when half or
    more never did."""
    reached = sorted(t for t in times if t is not None)
    if not times or len(reached) * 2 <= len(times):
        return None
    ordered = reached + [float("inf")] * (len(times) - len(reached))
    return statistics.median(ordered)


def anatomy(runs: list[dict[str, Any]]) -> dict[str, float] | None:
    """The median of each part of rank 0's step over the runs that recorded one."""
    seen = [r["step_anatomy"] for r in runs if r.get("step_anatomy")]
    if not seen:
        return None
    return {k: statistics.median(float(a[k]) for a in seen) for k in (*PARTS, "sum_s", "step_s")}


FULL_SEEDS = 3  # seeds an arm needs before its median can be the verdict


def summarize(runs: dict[str, list[dict[str, Any]]], arms: list[str],
              task: str = "") -> dict[str, Any]:
    """Target from the 1-host runs, every cell's times to it, and the verdicts (`task`'s goal)."""
    finals = [r["metrics"]["accuracy"] for r in runs.get(f"{BASE}@1", []) if "metrics" in r]
    target = statistics.median(finals) - 0.005 if finals else None
    cells = {}
    for cell, rs in runs.items():
        times = [time_to(r, target) for r in rs] if target is not None else []
        cells[cell] = {"seeds": [r["seed"] for r in rs], "times_s": times,
                       "median_s": median_time(times),
                       "final_accuracy": [r.get("metrics", {}).get("accuracy") for r in rs],
                       "errors": [r["error"] for r in rs if "error" in r],
                       # the machine's speed when each ran (tta_ledger.speed_probe_s; None: before
                       # the probe)
                       "speed_probe_s": [r.get("speed_probe_s") for r in rs],
                       "step_anatomy": anatomy(rs)}
    base = cells.get(f"{BASE}@1", {}).get("median_s")
    speedups = {arm: base / cells[f"{arm}@4"]["median_s"] for arm in arms
                if f"{arm}@4" in cells and base and cells[f"{arm}@4"]["median_s"]}
    # the verdict is a median of >= 3 seeds: an arm with fewer is shown, not crowned (unless no arm
    # has 3)
    counted = {arm: v for arm, v in speedups.items()
               if len(cells[f"{arm}@4"]["seeds"]) >= FULL_SEEDS}
    full = counted or speedups
    best = max(full, key=lambda arm: full[arm]) if full else None
    hf = cells.get(f"{HF}@4", {}).get("median_s")
    best_s = cells[f"{best}@4"]["median_s"] if best else None
    vs_hf = hf / best_s if hf and best_s else None
    goal = GOALS.get(task, GOAL)
    return {"target": target, "one_host_final_accuracy": finals,
            "seeds": sorted({s for c in cells.values() for s in c["seeds"]}), "cells": cells,
            "speedup_to_target_4_hosts": speedups.get(best) if best else None, "best_arm": best,
            "speedups_4_hosts": speedups, "best_of_full_seeds": bool(counted),
            "goal": goal, "met": bool(best and speedups[best] >= goal),
            # HF's 4-host median time to target over the best cpudist arm's (None: either never
            # reached it)
            "speedup_vs_hf_4_hosts": vs_hf, "goal_vs_hf": GOAL_VS_HF,
            "met_vs_hf": bool(vs_hf and vs_hf >= GOAL_VS_HF)}


def _times_row(arm: str, hosts: str, c: dict[str, Any], done: list[dict[str, Any]],
               base: float | None) -> str:
    med = c["median_s"]
    sp = f"{base / med:.2f}x" if base and med else "-"
    times = " / ".join("never" if t is None else f"{t:.0f}" for t in c["times_s"])
    acc = " / ".join("-" if v is None else f"{100 * v:.1f}" for v in c["final_accuracy"])
    end = statistics.median(r["evaluations"][-1]["after_s"] for r in done) if done else None
    sps = statistics.median(r["train_samples_per_s"] or 0.0 for r in done) if done else None
    probes = " / ".join("-" if p is None else f"{p:.2f}" for p in c.get("speed_probe_s", []))
    return (f"| {arm} | {hosts} | {','.join(map(str, c['seeds']))} | {times} | "
            f"{'-' if med is None else f'{med:.0f}'} | {sp} | {acc} | "
            f"{'-' if end is None else f'{end:.0f}'} | {'-' if sps is None else f'{sps:.1f}'} | "
            f"{probes or '-'} |")


def task_markdown(task: str, s: dict[str, Any], cal: dict[str, Any], spec: dict[str, Any],
                  runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    lines = [f"## {task}", "",
             f"Budget {spec['budget']} samples a run, evaluated every {spec['eval_every']} "
             f"samples; link {cal['link_gbps']:.3f} Gbit/s (`{cal.get('tbf', '?')}`; "
             f"{cal.get('how', 'calibrated')}).", "",
             f"Target: {s['target']:.4f} (1-host final accuracy {s['one_host_final_accuracy']} "
             "median - 0.5 pt)"
             if s["target"] is not None else "Target: none (no 1-host run yet)", "",
             "| arm | hosts | seeds | time to target per seed (s) | median (s) | speedup vs 1 host "
             "| final acc "
             "| launch to the last evaluation, median (s) | train samples/s, median "
             "| speed probe per seed (s) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    base = s["cells"].get(f"{BASE}@1", {}).get("median_s")
    for cell, c in s["cells"].items():
        arm, hosts = cell.rsplit("@", 1)
        lines.append(_times_row(arm, hosts, c, [r for r in runs[cell] if r.get("evaluations")],
                                base))
    lines += ["", probe_said(s), "",
              "Where rank 0's step goes (seconds per step, median over seeds; "
              "cpudist/train/anatomy.py):", "",
              "| arm | hosts | step | compute | sync CPU | wire not hidden | wait for slowest | "
              "evaluation | sum |",
              "|---|---|---|---|---|---|---|---|---|"]
    for cell, c in s["cells"].items():
        a = c["step_anatomy"]
        if a:
            arm, hosts = cell.rsplit("@", 1)
            lines.append(f"| {arm} | {hosts} | {a['step_s']:.3f} | "
                         + " | ".join(f"{a[k]:.3f}" for k in PARTS)
                         + f" | {a['sum_s']:.3f} |")
    sp, vs = s["speedup_to_target_4_hosts"], s["speedup_vs_hf_4_hosts"]
    best = s["best_arm"] or "no arm reached the target"
    partial = "" if s.get("best_of_full_seeds", True) or not s["best_arm"] else \
        f", fewer than {FULL_SEEDS} seeds: no verdict yet"
    lines += ["", f"4 hosts, best arm of those with {FULL_SEEDS} seeds or more ({best}{partial}): "
              f"{'-' if sp is None else f'{sp:.2f}x'} sooner than 1 host (goal {s['goal']}x: "
              f"{'met' if s['met'] else 'not met'}); against HF Trainer + torchrun on the same 4 "
              f"hosts: {hf_said(s) if vs is None else f'{vs:.2f}x'} (goal {GOAL_VS_HF}x: "
              f"{verdict_vs_hf(s)}).", ""]
    return lines


PROBE_SPREAD = 1.10  # probes further apart than this: runs of machines of other speeds


def probe_said(s: dict[str, Any]) -> str:
    """What the speed probes say of the cells' machines: one speed, or how far apart."""
    probes = [p for c in s["cells"].values() for p in c.get("speed_probe_s", []) if p]
    unprobed = sum(p is None for c in s["cells"].values() for p in c.get("speed_probe_s", []))
    how = ("Speed probe: one MiniLM-shaped training step at one thread, timed at the start of the "
           "stretch that ran each seed (benchmarks/tta_ledger.py)")
    if not probes:
        return f"{how}: none recorded (every run predates it)."
    spread = max(probes) / min(probes)
    verdict = (f"the slowest machine {spread:.2f}x the fastest: runs of machines of other speeds, "
               "whose times do not compare" if spread > PROBE_SPREAD
               else f"within {PROBE_SPREAD:.2f}x: one speed")
    return (f"{how}: {min(probes):.2f}-{max(probes):.2f} s, {verdict}"
            + (f"; {unprobed} run(s) predate it." if unprobed else "."))


def verdict_vs_hf(s: dict[str, Any]) -> str:
    """The goal against HF: met, not met, or no ratio (HF's median never reached the target)."""
    if s["speedup_vs_hf_4_hosts"] is None and hf_said(s) != "-":
        return "no ratio"
    return "met" if s["met_vs_hf"] else "not met"


def hf_said(s: dict[str, Any]) -> str:
    """Why a summary has no ratio against HF: HF's median never reached the target, or no HF run."""
    hf = s["cells"].get(f"{HF}@4")
    return "- (HF's median never reached the target)" if hf and hf["median_s"] is None else "-"


def markdown(res: dict[str, Any]) -> str:
    lines = [f"# Time to accuracy on the miniature cluster ({res['cpu_kind']})", "",
             f"`{res['command']}`", "",
             f"CPU: {res['cpu_model']} (flags {res['cpu_flags']}); commit {res['commit']}, "
             f"benchmark code {res['code']}. Hosts: {res['cluster_text']}", "",
             f"Peer arm: {res['hf_how']}", ""]
    for task, s in res["summary"].items():
        lines += task_markdown(task, s, res["calibrations"][task], res["plan"][task],
                               res["runs"][task])
    lines += ["The last two columns time the whole run (every arm trains the same budget): its "
              "speed apart from when its accuracy first crosses the target.", ""]
    return "\n".join(lines)
