"""`cpudist plan`: step time, speedup and cost at N nodes for every sync strategy, from a 1-node
run."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from cpudist import state
from cpudist.cli.options import output_options
from cpudist.errors import BadInput
from cpudist.hosts.bench import human, newest_bench, read_bench
from cpudist.results import catalogue, planner, validation
from cpudist.results.ledger import load_sources
from cpudist.results.planner import Baseline, Link, Prediction
from cpudist.results.schema import RunResult
from cpudist.results.validation import Row
from cpudist.traffic import payload_bytes


def _counts(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, ...]:
    try:
        counts = tuple(sorted({int(v) for v in value.split(",") if v.strip()}))
    except ValueError:
        counts = ()
    if not counts or counts[0] < 1:
        raise BadInput(f"--nodes {value!r} is not a list of node counts",
                       "Write it like --nodes 2,4,8")
    return counts


def _console() -> Console:
    c = Console()
    return c if c.is_terminal else Console(width=200)


def resolve_link(link_gbps: float | None, bench_file: Path | None,
                 latency_ms: float) -> tuple[Link, str]:
    """The link rate and where it came from: --link-gbps, a bench file, else the newest bench
    result."""
    latency = latency_ms / 1000
    if link_gbps is not None and bench_file is not None:
        raise BadInput("--link-gbps and --bench both give the link rate", "Pass one of them")
    if link_gbps is not None:
        return Link(link_gbps, latency), "--link-gbps"
    path = bench_file or newest_bench()
    if path is None:
        raise BadInput("no link rate: no --link-gbps and no `cpudist hosts bench` result",
                       "Pass --link-gbps X, or run `cpudist hosts bench --hostfile H` on the head "
                       "node first")
    b = read_bench(path)
    largest = max(b.points, key=lambda p: p.bytes).bytes
    return Link(b.link_gbps,
                latency), f"bus bandwidth at {human(largest)} on {', '.join(b.nodes)}, {path}"


def work(base: Baseline, steps: int | None, epochs: float | None) -> tuple[float, str]:
    """(samples to train, how that was decided)."""
    if steps is not None and epochs is not None:
        raise BadInput("--steps and --epochs both set the work", "Pass one of them")
    if steps is not None:
        samples = steps * base.samples_per_step
        return samples, f"{steps} steps of the measured run ({samples} samples)"
    if epochs is not None:
        if base.dataset_samples is None:
            raise BadInput(f"run {base.run_id} ran a number of steps, so its samples per epoch are "
                           "unknown",
                           "Pass --steps, or plan from a run that trained by --epochs")
        return (epochs * base.dataset_samples,
                f"{epochs:g} epochs of {base.dataset_samples:.0f} samples")
    return float(base.samples), f"the {base.samples} samples of the measured run"


def _cells(p: Prediction, priced: bool) -> list[str]:
    risk = ["-", "bf16 rounding", "changes the optimization"][catalogue.risk_level(p)]
    cells = [str(p.nodes), p.sync, f"{p.step_s:.3f}", f"{p.comm_s:.3f}", f"{p.speedup:.2f}x",
             f"{p.efficiency:.0%}", str(p.steps), catalogue.duration(p.time_s)]
    return [*cells, *([f"{p.cost_usd:.2f}"] if priced and p.cost_usd is not None else []), risk]


def print_plan(rows: list[Prediction], rec: catalogue.Recommendation, header: list[str]) -> None:
    for line in header:
        click.echo(line)
    priced = rows[0].cost_usd is not None
    columns = ["nodes", "sync", "step (s)", "comm t_m (s)", "speedup", "efficiency", "steps",
               "time", *(["$"] if priced else []), "accuracy risk"]
    table = Table(*columns, title="predicted (same per-rank batch)", title_justify="left")
    for p in rows:
        table.add_row(*_cells(p, priced))
    _console().print(table)
    click.echo(rec.line)


def print_validation(rows: list[Row], unchecked: int) -> None:
    table = Table("run", "sync", "nodes", "ranks", "measured", "predicted", "error",
                  "step measured (s)", "step predicted (s)", "f", "bytes vs expected", "",
                  title=f"measured vs predicted speedup (goal: within {validation.GOAL:.0%})",
                  title_justify="left")
    for r in rows:
        traffic = "-" if r.traffic_error is None else f"{r.traffic_error:+.1%}"
        table.add_row(r.run_id, r.sync, str(r.nodes), str(r.world_size),
                      f"{r.measured_speedup:.2f}x",
                      f"{r.predicted_speedup:.2f}x", f"{r.error:+.1%}", f"{r.measured_step_s:.3f}",
                      f"{r.predicted_step_s:.3f}", f"{r.overlap:.2f}", traffic, "OVER" if r.flagged
                      else "ok")
    _console().print(table)
    off = sum(r.flagged for r in rows)
    click.echo(f"validation: {len(rows) - off} of {len(rows)} measured points within "
               f"{validation.GOAL:.0%}"
               + (f"; {unchecked} multi-node run(s) have no comparable 1-node run and were not "
                  "checked"
                  if unchecked else ""))


CPU_NOTE = ("note: without measured multi-node runs in the sources the model leaves out the CPU "
            "time of gloo's copies and reductions and of PowerSGD's products (a 1-node run cannot "
            "show it): run a 2-node job and plan again with its ledger")


@click.command("plan")
@click.argument("sources", nargs=-1, type=click.Path(path_type=Path))
@click.option("--nodes", "node_counts", default="2,4,8", show_default=True, callback=_counts,
              help="Node counts to predict, comma-separated.")
@click.option("--link-gbps", type=click.FloatRange(min=0, min_open=True),
              help="Each node's link rate in Gbit/s [default: the newest `cpudist hosts bench` "
                   "result].")
@click.option("--bench", "bench_file", type=click.Path(path_type=Path),
              help="A `cpudist hosts bench` result file.")
@click.option("--latency-ms", type=click.FloatRange(min=0), default=0.1, show_default=True,
              help="Latency per collective call.")
@click.option("--price", type=click.FloatRange(min=0),
              help="USD per node-hour [default: the run's, if it has one].")
@click.option("--steps", type=click.IntRange(min=1),
              help="Work: as many samples as this many steps of the run.")
@click.option("--epochs", type=click.FloatRange(min=0, min_open=True),
              help="Work: epochs of the run's data.")
@click.option("--powersgd-rank", type=click.IntRange(min=1), default=2, show_default=True,
              help="PowerSGD: the rank of its low-rank gradient approximation.")
@click.option("--local-sgd-k", type=click.IntRange(min=1), default=8, show_default=True,
              help="Local SGD: steps between model averages.")
@click.option("--overlap", type=click.FloatRange(0, 1),
              help="Share of DDP's communication hidden under backward "
                   "[default: measured, else 0].")
@click.option("--sync-cpu-s-per-gb", "sync_cpu", type=click.FloatRange(min=0),
              help="Node CPU seconds the sync costs per GB on the busiest link [default: measured, "
                   "else 0].")
@click.option("--baseline", "--run-id", "run_id",
              help="Plan from this 1-node run: an id or a unique prefix [default: of the newest "
                   "1-node run's job, "
              "the 1-node run with the fewest ranks, plain DDP first, the newest; the plan says "
              "which and why].")
@click.option("--validate", "only_validate", is_flag=True,
              help="Only compare predicted with measured speedup of the multi-node runs in the "
                   "sources.")
@output_options()
def plan(sources: tuple[Path, ...], node_counts: tuple[int, ...], link_gbps: float | None,
         bench_file: Path | None, latency_ms: float, price: float | None, steps: int | None,
         epochs: float | None, powersgd_rank: int, local_sgd_k: int, overlap: float | None,
         sync_cpu: float | None, run_id: str | None, only_validate: bool, fmt: str) -> None:
    """Predict step time, speedup, time and cost at N nodes for each sync strategy, from a 1-node
    run.

    SOURCES (result.json files, run folders, ledgers) default to the ledger. The model is in
    cpudist/results/planner.py; multi-node runs in the sources are checked against it.
    """
    runs = load_sources(sources or (state.ledger_path(),))
    link, link_from = resolve_link(link_gbps, bench_file, latency_ms)
    f, f_runs = (overlap, ()) if overlap is not None else validation.measured_overlap(runs)
    given_c = None if sync_cpu is None else sync_cpu / 1e9
    checked = validation.validate(runs, link.gbps, link.latency_s, overlap, given_c)
    unchecked = sum(len(r.nodes) > 1 for r in runs) - len(checked)
    if only_validate:
        if not checked:
            raise BadInput("the sources hold no multi-node run with a comparable 1-node run",
                           "Pass the ledger or run folders of a 1-node run and multi-node runs of "
                           "the same job")
        if fmt == "json":
            click.echo(json.dumps([asdict(r) for r in checked], indent=2))
        else:
            print_validation(checked, unchecked)
        return
    chosen, why = planner.pick_baseline(runs, run_id)
    base = planner.baseline_of(chosen)
    if price is not None:
        base = dataclasses.replace(base, usd_per_node_hour=price)
    samples, what = work(base, steps, epochs)
    syncs = catalogue.strategies(powersgd_rank, local_sgd_k)
    fitted = {s.label: ((given_c, ()) if given_c is not None
                        else validation.measured_sync_cpu(runs, link, chosen, overlap, s))
              for s in syncs}
    c = {label: per_byte for label, (per_byte, _) in fitted.items()}
    c_runs = tuple(dict.fromkeys(i for _, ids in fitted.values() for i in ids))
    rows = planner.plan(base, node_counts, syncs, link, f, samples, c)
    rec = catalogue.recommend(rows)
    if fmt == "json":
        out = _as_json(chosen, why, base, link, link_from, f, f_runs, rows, rec, checked)
        click.echo(json.dumps({**out, "sync_cpu": {"s_per_byte": c, "runs": list(c_runs)}},
                              indent=2))
        return
    header = _header(chosen, why, base, link, link_from, f, f_runs, overlap is not None, what,
                     price)
    c_from = (f"median of measured multi-node runs {', '.join(c_runs)}" if c_runs
              else "--sync-cpu-s-per-gb"
              if given_c is not None
              else "no measured multi-node run on these nodes in the sources")
    values = sorted(set(c.values()))
    told = (f"c = {values[0] * 1e9:.2f}" if len(values) == 1
            else "c = " + ", ".join(f"{label} {v * 1e9:.2f}" for label, v in c.items()))
    header.insert(3,
                  f"sync CPU: {told} s per GB on the busiest link ({c_from}; each strategy from "
                  "runs of its own kind where there are any)")
    print_plan(rows, rec, header)
    if checked:
        print_validation(checked, unchecked)
    else:
        click.echo(CPU_NOTE)


def _header(r: RunResult, why: str, base: Baseline, link: Link, link_from: str, f: float,
            f_runs: tuple[str, ...], f_given: bool, what: str, price: float | None) -> list[str]:
    f_from = (f"median of measured multi-node DDP runs {', '.join(f_runs)}" if f_runs
              else "--overlap" if f_given
              else "default, conservative: no measured multi-node DDP run in the sources")
    price_from = ("--price" if price is not None else "the run's nodes"
                  if base.usd_per_node_hour is not None
                  else None)
    sync = (f" (sync={r.sync}: its exchange on the node counts as compute)"
            if r.world_size > 1 else "")
    lines = [f"base: {r.run_id} ({why}): {r.task} {r.model} {r.precision}, {r.world_size} rank(s) "
             f"on 1 node{sync}, {base.samples_per_step} samples/step, t_c = {base.compute_s:.3f} "
             f"s/step over {base.steps} steps",
             f"link: {link.gbps:.3f} Gbit/s per node ({link_from}); {link.latency_s * 1000:g} ms "
             "per collective",
             f"overlap: DDP hides f = {f:.2f} of its communication ({f_from}); explicit strategies "
             "hide none",
             f"work: {what}"]
    if r.peft:  # the wire carries the adapters' gradients only
        lines.append(f"trained: LoRA r {r.peft.get('r')} on {', '.join(r.peft.get('targets', ()))} "
                     f"and the head: {r.trainable_params:,} of {r.peft.get('total_params', 0):,} "
                     f"parameters, {payload_bytes(base.shapes) / 1e3:,.0f} kB per exchange (the "
                     "frozen base is never sent)")
    if not base.shapes_known:
        lines.append("note: the run recorded no parameter shapes, only its gradient size: PowerSGD "
                     "is left out")
    if price_from:
        lines.append(f"price: ${base.usd_per_node_hour:.4f} per node-hour ({price_from})")
    return lines


def _as_json(r: RunResult, why: str, base: Baseline, link: Link, link_from: str, f: float,
             f_runs: tuple[str, ...], rows: list[Prediction], rec: catalogue.Recommendation,
             checked: list[Row]) -> dict[str, Any]:
    return {"baseline": {"run_id": r.run_id, "why": why, **asdict(base), "peft": r.peft,
                         "trainable_params": r.trainable_params},
            "link": {"gbps": link.gbps, "latency_s": link.latency_s, "from": link_from},
            "overlap": {"f": f, "runs": list(f_runs)},
            "predictions": [asdict(p) for p in rows],
            "recommendation": {"nodes": rec.choice.nodes, "sync": rec.choice.sync,
                               "line": rec.line},
            "validation": [asdict(v) for v in checked]}
