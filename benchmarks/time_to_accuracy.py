"""Time to accuracy on the capped miniature cluster: how much sooner 4 hosts reach 1 host's model
quality, with cpudist and with what its users would run instead (HF Trainer under torchrun on the
same hosts).

    # the whole plan in miniature (minutes)
    python benchmarks/time_to_accuracy.py --quick
    # one stretch of the plan
    python benchmarks/time_to_accuracy.py --lock-each /tmp/cpudist-cpu.lock --hours 4
    python benchmarks/time_to_accuracy.py --render benchmarks/results/time-to-accuracy-amx-bf16.json

Hosts: benchmarks/miniature.py's `halfcore` layout (4 namespace hosts, half a core each by CFS
quota, two per core, so no two ranks compete for a core). What users pay for is a model of a given
quality sooner, so each run is timed from its launch on host 0 to its first evaluation at or above
the target; evaluations run every fixed number of samples (sharded over the ranks, their time
counted), each one's end read on the hosts' shared clock.

Tasks and budgets (samples a run trains on, the same at every host count: per-host batch 32, so 4
hosts take a quarter of the steps): MRPC 3 epochs (11,004 samples), SST-2 64,000 samples (under one
epoch of its 67,349 rows: no row seen twice; a 1-host run of MiniLM on a half-core host takes over
10 minutes at it unless it trains over 107 samples/s). Target per task: the median over
--target-seeds (3) of 1 host's final dev accuracy (lr 5e-5, 10% warm-up), minus 0.5 point.

Arms at 2 and 4 hosts: cpudist's defaults (what `cpudist run` picks across nodes: ddp,
word-embedding rows, a bf16 wire, lr 5e-5 x the hosts), the levers (the global batch kept: 32 /
hosts per host at 1 host's lr and steps; lr x sqrt(hosts); ddp with lr 1e-4 x the hosts, with and
without a bf16 wire or the dense embedding, local SGD K=8 with both AdamW moments averaged) and the
peer arm: benchmarks/tta_hf.py, a Trainer script with the CPU settings of benchmarks/hf_trainer.py
(bf16 autocast where the CPU has it, group_by_length, gloo), torchrun started by hand on the head
and over ssh on the other hosts, lr 5e-5 x the processes (Accelerate's guide for a larger global
batch); and the same script started by `cpudist launch` on the head (`hf trainer+cpudist launch`),
which sets each rank's threads, allocator and rendezvous. `summary[task]`:
`speedup_to_target_4_hosts` (1 host's median time over the best cpudist arm's at 4 hosts; a seed
that never reaches the target counts as never: the median is over reached runs only if more than
half reached) and `speedup_vs_hf_4_hosts` (HF's 4-host median over that arm's). Goals: >= 3.3x and
>= 2x. Each cell's `step_anatomy`: where rank 0's step goes.

The link is calibrated to OUR node on the task, not to the blog's work: cpudist trains real rows
(dynamic padding, the CPU's default precision), so a node finishes a sample several times sooner
than the blog's fp32 128-token rows, and the same network is relatively slower. Four speeds of one
miniature host (1 rank, steady samples/s): S(bert-base, blog) and S(model, blog) on 128-token
synthetic rows in fp32, S(bert-base, task) and S(model, task) as `cpudist run` trains the task. A
c6i.16xlarge running cpudist on the task would do 23.6 x S(bert-base, task) / S(bert-base, blog) x
S(model, blog) / S(bert-base, blog) samples/s, on 25 Gbit/s; the link gets 25 Gbit/s x S(model,
task) / that, so compute / bandwidth is the c6i's running cpudist.

Runs go to benchmarks/results/time-to-accuracy[-quick]TAG-KIND-ledger.jsonl as they finish
(tta_ledger.py: the key that decides what a re-run skips); the summary and result files are computed
from the ledger, so the same command gathers the plan over several stretches (--hours) and sessions
on one machine.
"""

from __future__ import annotations

import argparse
import json
import shlex
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
from tta_ledger import Cell, Ledger, code_hash, machine, speed_probe_s, total_s
from tta_runs import cpudist_run, hf_launch_run, hf_run
from tta_summary import BASE, HF, HF_LAUNCH, PEERS, markdown, summarize

GLUE = ROOT.parent / "shared" / "data" / "glue"
# pretrained; the same shape, random
MODEL, MODEL_PRESET = "sentence-transformers/all-MiniLM-L6-v2", "minilm-l6"
# budget: samples a run trains on (at every host count); eval_every: samples between evaluations
TASKS = {"mrpc": {"data": GLUE / "MRPC", "budget": 3 * 3668, "eval_every": 1024},
         "sst2": {"data": GLUE / "SST-2", "budget": 64_000, "eval_every": 4096}}
QUICK = {"budget": 256, "eval_every": 128, "rows": 512}  # --quick: every task, this small


def task_plan(task: str) -> dict[str, Any]:
    """A task's data, budget and evaluation spacing: TASKS' own, or for any other GLUE task in
    ../shared/data/glue 3 epochs of its train rows (at most SST-2's budget) with about 12
    evaluations, in whole 4-host steps."""
    if task in TASKS:
        return TASKS[task]
    from cpudist.train.tasks import GLUE_DIR_NAMES

    train = GLUE / GLUE_DIR_NAMES.get(task, task) / "train.tsv"
    if task not in GLUE_DIR_NAMES or not train.is_file():
        raise SystemExit(f"--tasks {task}: not a GLUE task with {train} (GLUE tasks: "
                         f"{', '.join(GLUE_DIR_NAMES)})")
    rows = sum(1 for line in train.read_text(encoding="utf-8-sig").splitlines()[1:] if line.strip())
    budget = min(3 * rows, TASKS["sst2"]["budget"])
    step = 4 * BATCH
    return {"data": train.parent, "budget": budget,
            "eval_every": max(step, budget // 12 // step * step)}
BATCH, LR = 32, "5e-5"
BF16_WIRE = ("--grad-compression", "bf16")
X2N = ("--lr", "1e-4", "--lr-scaling", "linear")
# DDP all-reduces all of the word embedding (cpudist before rows)
DENSE = ("--embedding-sync", "dense")
# what `cpudist run` picks: ddp, embedding rows, bf16 wire across nodes, lr x N
DEFAULTS = "cpudist defaults"
KEPT = "defaults global batch kept"
ARMS: dict[str, tuple[str, ...]] = {
    DEFAULTS: (),
    "ddp lr x2N": X2N,
    "ddp bf16 wire lr x2N": (*X2N, *BF16_WIRE),
    "ddp bf16 wire dense-emb lr x2N": (*X2N, *BF16_WIRE, *DENSE),
    "local-sgd:8+mv+bf16 lr x2N": ("--sync", "local-sgd", "--sync-every", "8", "--average-moments",
                                   "both", *BF16_WIRE, *X2N),
    # the parameters alone every 8 steps: a third of the bytes of the arm above (SST-2: its wire was
    # 0.33 s a step)
    "local-sgd:8+bf16 lr x2N": ("--sync", "local-sgd", "--sync-every", "8", *BF16_WIRE, *X2N),
    # at the defaults' lr (x N): local SGD at x2N never reached SST-2's target (seed 42, best 88.3%)
    "local-sgd:8+bf16 lr xN": ("--sync", "local-sgd", "--sync-every", "8", *BF16_WIRE),
    # DiLoCo: the averaged change applied by an outer Nesterov SGD (lr 0.7, momentum 0.9), inner
    # AdamW at lr x N
    "diloco:8+bf16 lr xN": ("--sync", "local-sgd", "--sync-every", "8", "--outer-optimizer",
                            "nesterov", *BF16_WIRE),
    # the global batch kept: BATCH / hosts per host, 1 host's optimizer steps and lr (item 4's first
    # lever)
    KEPT: ("--lr-scaling", "none"),
    "defaults lr sqrtN": ("--lr-scaling", "sqrt"),  # BATCH per host, lr x sqrt(hosts)
}
PER_HOST_BATCH = {KEPT: lambda hosts: BATCH // hosts}  # an arm's per-host batch, where not BATCH
QUICK_ARMS = [DEFAULTS, HF, HF_LAUNCH]
# the levers left to measure
PLAN_ARMS = [DEFAULTS, HF, "ddp bf16 wire lr x2N", "local-sgd:8+mv+bf16 lr x2N"]
# --quick shapes the links to this instead of calibrating (its numbers answer nothing)
QUICK_LINK_GBPS = 1.0
HF_HOW = ("benchmarks/tta_hf.py (HF Trainer: bf16 autocast where the CPU has it, group_by_length, "
          f"gloo, lr {LR} x the processes as Accelerate's guide says for a larger global batch), "
          "started by torchrun by hand on the head and over the cluster's ssh on the other hosts, "
          "or by `cpudist launch` on the head (the command is in each run)")


def speed(cluster: Any, work: Path, lock: Path | None, args: list[str], steps: int) -> float:
    """One host's steady samples/s for `cpudist run ARGS` (1 rank on host 0, no evaluation)."""
    out = Path(tempfile.mkdtemp(dir=work, prefix="speed-"))
    r = on_head(cluster,
                ["run", *args, "--hostfile", str(cluster.hostfile), "--nodes", "1", "--ppn", "1",
                 "--batch-size", str(BATCH), "--max-steps", str(steps), "--no-eval", "--save-model",
                 "none", "--output-dir", str(out / "run"), "--json", "--quiet"], lock, used=1)
    return float(r["steady_samples_per_s"])


def calibration(cluster: Any, work: Path, a: argparse.Namespace, task: str) -> dict[str, Any]:
    """The four speeds and the link they give (module docstring)."""
    # all four measured together by an earlier run on this machine (its "# TASK calibration:" line)
    if a.calibration:
        reused = json.loads(a.calibration.read_text())
        if reused["task"] != task:
            raise SystemExit(f"--calibration {a.calibration} is {reused['task']}'s, not {task}'s")
        return {**reused, "reused_from": str(a.calibration)}
    # S(bert-base, blog) measured by scaling.py on this layout and CPU kind (26 s a step)
    if a.blog_calibration:
        bb_blog = float(json.loads(a.blog_calibration.read_text())["calibration"]["samples_per_s"])
    else:
        bb_blog = float(calibrate(cluster, a.calibration_steps, work, a.lock_each)["samples_per_s"])
    steps = a.calibration_steps
    synthetic = ["synthetic", "--precision", "fp32", "--max-seq-len", "128", "--synthetic-samples",
                 str(BATCH * steps)]
    on_task = [task, "--data-dir", str(task_plan(task)["data"])]
    bb_task = speed(cluster, work, a.lock_each, [*on_task, "--model", "bert-base"], steps)
    m_blog = speed(cluster, work, a.lock_each, [*synthetic, "--model", MODEL_PRESET], steps)
    m_task = speed(cluster, work, a.lock_each, [*on_task, "--model", MODEL], steps)
    c6i_task = BLOG_SAMPLES_PER_S * (bb_task / bb_blog) * (m_blog / bb_blog)
    link = BLOG_LINK_GBPS * m_task / c6i_task
    return {"task": task, "bert_base_blog_samples_per_s": bb_blog,
            "bert_base_task_samples_per_s": bb_task, "model_blog_samples_per_s": m_blog,
            "model_task_samples_per_s": m_task, "cpudist_over_blog_bert_base": bb_task / bb_blog,
            "model_over_bert_base_blog": m_blog / bb_blog, "c6i_task_samples_per_s": c6i_task,
            "link_gbps": link, "steps": steps,
            "bert_base_blog_from": str(a.blog_calibration or "measured")}


def link(cluster: Any, work: Path, a: argparse.Namespace, task: str,
         ledger: Ledger) -> tuple[Any, dict[str, Any]]:
    """The hosts shaped to the task's link: the ledger's calibration, else --link-gbps / --quick's,
    else measured (and recorded, so later stretches use the same link)."""
    cal = ledger.calibration(task)
    if cal is None:
        given = a.link_gbps or (QUICK_LINK_GBPS if a.quick else None)
        if given:
            cal = {"task": task, "link_gbps": given,
                   "how": "given, not calibrated: its ratios answer nothing"}
        else:
            cal = calibration(shaped(cluster, None), work, a, task)  # one host, the link unused
        cluster = shaped_to(shaped(cluster, None), cal, task)
        ledger.append("calibration", task=task, calibration=cal)
        return cluster, cal
    return shaped_to(shaped(cluster, None), cal, task), cal


def cells_of(a: argparse.Namespace, tasks: list[str], arms: list[str]) -> list[Cell]:
    """The plan: the 1-host runs that set each target, then every arm at every host count, seeds
    outside."""
    target_seeds = [int(s)
                    for s in (a.target_seeds or ("42" if a.quick else "42,43,44")).split(",")]
    seeds = [int(s) for s in (a.seeds or ("42" if a.quick else "42,43,44")).split(",")]
    hosts = [int(n) for n in (a.host_counts or ("4" if a.quick else "2,4")).split(",")]
    return [c for t in tasks for c in [Cell(t, BASE, 1, s) for s in target_seeds]
            + [Cell(t, arm, n, s) for s in seeds for n in hosts for arm in arms]]


def job_of(cell: Cell, plan: dict[str, Any]) -> dict[str, Any]:
    batch = PER_HOST_BATCH.get(cell.arm, lambda hosts: BATCH)(cell.hosts)
    return {"task": cell.task, "data": task_plan(cell.task)["data"], "model": MODEL, "batch": batch,
            "lr": LR, "hosts": cell.hosts, "seed": cell.seed, "budget": plan["budget"],
            "eval_every": plan["eval_every"]}


def run_cell(cluster: Any, work: Path, a: argparse.Namespace, cell: Cell, plan: dict[str, Any],
             rows: list[str]) -> dict[str, Any]:
    job = job_of(cell, plan)
    if cell.arm == HF:
        return hf_run(cluster, work, a.lock_each, job, rows)
    if cell.arm == HF_LAUNCH:
        return hf_launch_run(cluster, work, a.lock_each, job, rows)
    return cpudist_run(cluster, work, a.lock_each, job, ARMS.get(cell.arm, ()), rows)


# the four speeds of one task, bert-base's fp32 steps the longest (a guess until measured)
CALIBRATION_S = 900


def say_plan(cells: list[Cell], todo: list[Cell], ledger: Ledger, plans: dict[str, Any],
             command: str, calibrating: bool) -> None:
    speeds = {t: (ledger.calibration(t) or {}).get("model_task_samples_per_s") for t in plans}
    uncalibrated = sum(1 for t in plans if ledger.calibration(t) is None) if calibrating else 0
    whole = total_s(cells, ledger, plans, speeds) + CALIBRATION_S * uncalibrated
    left = total_s(todo, ledger, plans, speeds) + CALIBRATION_S * uncalibrated
    print(f"# plan: {len(cells)} runs, about {whole / 3600:.1f} h on this machine; "
          f"{len(cells) - len(todo)} in "
          f"{ledger.path.name}, {len(todo)} to go (about {left / 3600:.1f} h). Next stretch:\n"
          f"#   {command}",
          file=sys.stderr, flush=True)


def write_results(a: argparse.Namespace, name: str, command: str, ledger: Ledger, tasks: list[str],
                  arms: list[str], plans: dict[str, Any], cluster_text: str) -> None:
    runs = {t: ledger.runs(t) for t in tasks}
    if not any(runs.values()):
        return
    res = {"command": command, **machine(), "code": ledger.code, "cluster_text": cluster_text,
           "layout": "halfcore", "hf_how": HF_HOW, "ledger": str(ledger.path),
           "plan": {t: {"budget": plans[t]["budget"], "eval_every": plans[t]["eval_every"]}
                    for t in tasks},
           "settings": {"quick": a.quick, "tasks": tasks, "arms": arms, "batch": BATCH, "lr": LR,
                        "model": MODEL},
           "calibrations": {t: ledger.calibration(t) or {"link_gbps": 0.0} for t in tasks},
           "summary": {t: summarize(runs[t], list(ARMS), t) for t in tasks}, "runs": runs}
    out = a.results_dir / name
    out.with_suffix(".json").write_text(json.dumps(res, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(res) + "\n")
    print(markdown(res), flush=True)


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="every task and the peer arm in miniature (1 seed, 4 hosts, "
                    f"{QUICK['budget']} samples, {QUICK_LINK_GBPS:g} Gbit/s uncalibrated): "
                    "minutes; answers nothing")
    ap.add_argument("--tasks",
                    help=f"{', '.join(TASKS)} or another GLUE task with data in {GLUE} (its "
                         "budget: 3 "
                    "epochs, at most SST-2's) [default: " + ",".join(TASKS) + "]")
    ap.add_argument("--arms",
                    help=f"of: {', '.join([*ARMS, *PEERS])} [default: {', '.join(PLAN_ARMS)}; "
                         "--quick: "
                    f"{', '.join(QUICK_ARMS)}]")
    ap.add_argument("--target-seeds",
                    help="1-host runs setting the target [default: 42,43,44; --quick: 42]")
    ap.add_argument("--seeds",
                    help="seeds of each arm at 2 and 4 hosts [default: 42,43,44; --quick: 42]")
    ap.add_argument("--host-counts", help="[default: 2,4; --quick: 4]")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the plan and its estimate, run nothing")
    ap.add_argument("--hours", type=float,
                    help="this stretch's length: no run starts that would end past it")
    ap.add_argument("--calibration-steps", type=int, default=10)
    ap.add_argument("--blog-calibration", type=Path,
                    help="reuse S(bert-base, blog) from a scaling.py result JSON "
                    "of the halfcore layout on this CPU kind (its bert-base fp32 run takes ~26 s a "
                    "step)")
    ap.add_argument("--calibration", type=Path,
                    help="reuse all four speeds of one task from a JSON file (the "
                    "'# TASK calibration:' line an earlier run on this machine printed), the link "
                    "with them")
    ap.add_argument("--link-gbps", type=float,
                    help="shape the links to this rate instead of calibrating")
    ap.add_argument("--train-rows", type=int,
                    help="train on the first N rows and evaluate on N/4 (trying the "
                    "script; such a result answers nothing)")
    ap.add_argument("--lock-each", type=Path, help="hold this flock file around each run")
    ap.add_argument("--prefix", default="tta")
    ap.add_argument("--tag", default="",
                    help="added to the result files' name (a partial plan: -mrpc-3-seeds)")
    ap.add_argument("--render", type=Path,
                    help="print the markdown of a result JSON again, run nothing")
    ap.add_argument("--results-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    return ap.parse_args()


def main() -> None:
    a = parse()
    if a.render:
        print(markdown(json.loads(a.render.read_text())), flush=True)
        return
    tasks = a.tasks.split(",") if a.tasks else list(TASKS)
    arms = a.arms.split(",") if a.arms else (QUICK_ARMS if a.quick else PLAN_ARMS)
    if unknown := [x for x in arms if x not in ARMS and x not in PEERS]:
        raise SystemExit(f"unknown arms {unknown}: arms {', '.join([*ARMS, *PEERS])}")
    train_rows = a.train_rows or (QUICK["rows"] if a.quick else None)
    rows = ["--max-train-samples", str(train_rows), "--max-eval-samples",
            str(max(1, train_rows // 4))] \
        if train_rows else []
    plans = {t: {**task_plan(t), **(QUICK if a.quick else {})} for t in tasks}
    command = "python benchmarks/time_to_accuracy.py " + shlex.join(
        x for x in sys.argv[1:] if x != "--dry-run")
    kind = machine()["cpu_kind"]
    name = (f"time-to-accuracy{'-quick' if a.quick else ''}{'-rows' if a.train_rows else ''}"
            f"{a.tag}-{kind}")
    ledger = Ledger(a.results_dir / f"{name}-ledger.jsonl", code_hash(), kind)
    cells = cells_of(a, tasks, arms)
    todo = [c for c in cells if ledger.done(c) is None]
    calibrating = not (a.quick or a.link_gbps or a.calibration)
    say_plan(cells, todo, ledger, plans, command, calibrating)
    if a.dry_run:
        return
    cluster_text = ""
    deadline = time.monotonic() + a.hours * 3600 if a.hours else None
    if todo:
        # before anything of the stretch computes
        print(f"# speed probe: {speed_probe_s():.3f} s", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(prefix="tta-") as tmp, \
                miniature(LAYOUTS["halfcore"], Path(tmp) / "cluster", a.prefix) as c:
            work = Path(tmp)
            cluster_text = json.dumps({**c.describe(), "link_gbps": "per task", "tbf": "per task"})
            ssh_setup(c)
            for task in dict.fromkeys(cell.task for cell in todo):
                cluster, cal = link(c, work, a, task, ledger)
                speeds = {task: cal.get("model_task_samples_per_s")}
                for cell in [x for x in todo if x.task == task]:
                    guess = total_s([cell], ledger, plans, speeds)
                    if deadline is not None and time.monotonic() + guess > deadline:
                        print(f"# stretch over: {cell.label()} would end past --hours",
                              file=sys.stderr, flush=True)
                        break
                    started = time.monotonic()
                    r = run_cell(cluster, work, a, cell, plans[task], rows)
                    seen = [(e["after_s"], e["accuracy"]) for e in r.get("evaluations", [])]
                    print(f"# {cell.label()}: {seen}", file=sys.stderr, flush=True)
                    if "error" not in r:  # a failed run is tried again by the next stretch
                        ledger.append("run", task=task, arm=cell.arm, hosts=cell.hosts,
                                      seed=cell.seed,
                                      elapsed_s=round(time.monotonic() - started, 1),
                                      calibration=cal, run=r)
    write_results(a, name, command, ledger, tasks, arms, plans, cluster_text)
    say_plan(cells, [c for c in cells if ledger.done(c) is None], ledger, plans, command,
             calibrating)


if __name__ == "__main__":
    main()
