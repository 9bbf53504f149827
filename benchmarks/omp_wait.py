"""OpenMP's wait policy for cpudist's ranks: GNU OpenMP's default spin against waiting asleep
(PASSIVE).

    python benchmarks/omp_wait.py [--model minilm-l6] [--steps 20] [--shared-steps 10] [--repeats 3]

Torch's CPU wheels run their intra-op threads on GNU OpenMP (libgomp), whose waiting threads spin
GOMP_SPINCOUNT pauses (300,000 when OMP_WAIT_POLICY is unset) before they sleep. Two situations, the
arms alternated within each repeat, medians over --repeats:

- own: one `cpudist run` on this machine, one rank with a thread per core (the layout cpudist picks
  for a node of its own): steady samples/s and the CPU seconds of the whole run.
- shared: cores + 1 such runs at once (a node shared with other work, or the test suite's workers on
  2 cores): the wall time of the set and the CPU seconds it used (getrusage of the reaped children,
  ranks included).

Arms: `spin` (OMP_WAIT_POLICY unset, libgomp's default) and `passive` (OMP_WAIT_POLICY=PASSIVE). The
results go to benchmarks/results/omp-wait-<cpu kind>.{json,md}, with the command.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MRPC = HERE.parents[1] / "shared" / "data" / "glue" / "MRPC"
ARMS: dict[str, dict[str, str]] = {"spin": {}, "passive": {"OMP_WAIT_POLICY": "PASSIVE"}}
OURS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")  # the variables the arms decide


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def start(model: str, steps: int, folder: str, arm: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in OURS} | ARMS[arm]
    cmd = ["cpudist", "run", "mrpc", "--data-dir", str(MRPC), "--model", model, "--np", "1",
           "--max-steps", str(steps), "--max-train-samples", str(32 * steps), "--no-eval",
           "--save-model", "none", "--json", "--quiet", "--output-dir", f"{folder}/run", "--ledger",
           f"{folder}/ledger.jsonl"]
    print(f"$ {' '.join(f'{k}={v}' for k, v in ARMS[arm].items())} {shlex.join(cmd)}",
          file=sys.stderr, flush=True)
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(
            f"{shlex.join(map(str, proc.args))} exited {proc.returncode}")  # type: ignore[arg-type]
    return json.loads(out)


def runs_at_once(model: str, steps: int, arm: str, count: int) -> dict[str, Any]:
    """`count` runs started together; the set's wall time, CPU seconds and each run's steady
    samples/s."""
    with tempfile.TemporaryDirectory() as tmp:
        cpu0, started = children_cpu(), time.perf_counter()
        procs = [start(model, steps, f"{tmp}/{i}", arm) for i in range(count)]
        results = [finish(p) for p in procs]
        wall, cpu = time.perf_counter() - started, children_cpu() - cpu0
    return {"wall_s": wall, "cpu_s": cpu,
            "steady_samples_per_s": [r["steady_samples_per_s"] for r in results],
            "train_time_s": [r["train_time_s"] for r in results],
            "threads_per_rank": results[0]["threads_per_rank"],
            "precision": results[0]["precision"], "cpu": results[0]["cpu"]}


def median_of(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
    values = [statistics.median(r[key]) if isinstance(r[key], list) else r[key] for r in rows]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def markdown(res: dict[str, Any]) -> str:
    own, shared = res["own"], res["shared"]
    lines = [f"# OpenMP wait policy on {res['cpu']['kind']}", "", f"Made by: `{res['command']}`",
             "",
             f"CPU {res['cpu']['model']} ({res['cores']} cores); model {res['model']} (random "
             f"init), {res['precision']}, one rank of {res['threads_per_rank']} threads per run; "
             f"{res['repeats']} alternated repeats (median, min-max). own: one run alone, "
             "{own_steps} steps; shared: {n} runs at once, {shared_steps} steps "
             "each.".format(own_steps=res["steps"], n=res["shared_runs"],
                                                  shared_steps=res["shared_steps"]), "",
             "| arm | own: steady samples/s | own: CPU-s | shared: wall s | shared: CPU-s | "
             "shared: steady samples/s per run |", "|---|---|---|---|---|---|"]

    def cell(d: dict[str, float]) -> str:
        return f"{d['median']:.2f} ({d['min']:.2f}-{d['max']:.2f})"

    for arm in ARMS:
        lines.append(f"| {arm} | {cell(own[arm]['steady_samples_per_s'])} | "
                     f"{cell(own[arm]['cpu_s'])} | "
                     f"{cell(shared[arm]['wall_s'])} | {cell(shared[arm]['cpu_s'])} | "
                     f"{cell(shared[arm]['steady_samples_per_s'])} |")
    r = res["ratios"]
    lines += ["",
              f"passive / spin: own samples/s {r['own_samples_per_s']:.2f}x, own CPU-s "
              f"{r['own_cpu_s']:.2f}x; "
              f"shared wall {r['shared_wall_s']:.2f}x, shared CPU-s {r['shared_cpu_s']:.2f}x.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="minilm-l6")
    ap.add_argument("--steps", type=int, default=20, help="steps of the run alone")
    ap.add_argument("--shared-steps", type=int, default=10,
                    help="steps of each run sharing the cores")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    own: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    shared: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    for _ in range(args.repeats):
        for arm in ARMS:
            own[arm].append(runs_at_once(args.model, args.steps, arm, 1))
            shared[arm].append(runs_at_once(args.model, args.shared_steps, arm, cores + 1))
    first = own["spin"][0]
    summary = {where: {arm: {k: median_of(rows, k)
                             for k in ("steady_samples_per_s", "cpu_s", "wall_s")}
                       for arm, rows in runs.items()}
               for where, runs in (("own", own), ("shared", shared))}

    def ratio(where: str, key: str) -> float:  # passive over spin, medians
        return summary[where]["passive"][key]["median"] / summary[where]["spin"][key]["median"]

    ratios = {"own_samples_per_s": ratio("own", "steady_samples_per_s"),
              "own_cpu_s": ratio("own", "cpu_s"),
              "shared_wall_s": ratio("shared", "wall_s"), "shared_cpu_s": ratio("shared", "cpu_s")}
    res = {"command": shlex.join([sys.executable.rsplit("/", 1)[-1], *sys.argv]),
           "cpu": first["cpu"], "cores": cores, "model": args.model,
           "precision": first["precision"], "threads_per_rank": first["threads_per_rank"],
           "steps": args.steps, "shared_steps": args.shared_steps, "shared_runs": cores + 1,
           "repeats": args.repeats, "ratios": ratios, **summary,
           "raw": {"own": own, "shared": shared}}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"omp-wait-{first['cpu']['kind']}"
    stem.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")
    stem.with_suffix(".md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
