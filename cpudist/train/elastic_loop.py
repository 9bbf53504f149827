"""The training loop of an elastic run (--elastic, cpudist/train/elastic.py): each step a quorum,
this node's share of the step's global batch, the average across the nodes that took part, and the
optimizer step only when every one of them got there.

Checkpoints are each node's own, in its own run folder, at the same committed steps: after losing
every node at once, each goes on from its newest (`--resume auto`), and a node whose newest is
older, or that has none, heals from the one at the most steps. It leaves out what the slice built
so far refuses (elastic_flags.check): accumulation, torch.compile. The rest is train/loop.py's: its
stats, log lines, evaluations and reports.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import torch

from cpudist.config import effective_lr, spec_of
from cpudist.elastic_flags import check
from cpudist.flops import shape_of, training_flops
from cpudist.train import elastic, sync, trainer_choices
from cpudist.train.checkpoint import Restored
from cpudist.train.checkpoint_meta import Position
from cpudist.train.features import collate
from cpudist.train.keep import Evaluations
from cpudist.train.loop import Pending, TrainStats, flush
from cpudist.train.optim import clip_and_step, optimizer
from cpudist.train.preempt import StopRequests
from cpudist.train.report_to import Reporters
from cpudist.train.sampling import plan_steps
from cpudist.train.saver import ELASTIC, Saver, Training, restore, save
from cpudist.train.setup import Job
from cpudist.train.steps_log import StepsLog
from cpudist.wire import events, names

WAIT_TICK_S = 1.0  # a node waiting at the start asks for a quorum again this often


def train_elastic(job: Job, saver: Saver, stop: StopRequests, restored: Restored | None = None,
                  evals: Evaluations | None = None, report: Reporters | None = None) -> TrainStats:
    """Train as one node of an elastic run until the run's last step is committed (or this node is
    asked to stop), from `restored` if given; what it measured, the membership changes with it."""
    cfg, model, data = job.cfg, job.model, job.train_data
    check(cfg)
    nodes = elastic.planned_nodes(os.environ)
    schedule = elastic.Schedule(cfg, data, nodes)
    total = plan_steps(cfg, schedule.per_epoch)
    # the global batch of `nodes` nodes (a checkpoint's config says so: Training below)
    opt = optimizer(cfg, model, effective_lr(cfg, nodes))
    sched = trainer_choices.scheduler(cfg, opt, total)
    stats = TrainStats(warmup_steps=trainer_choices.warmup_steps(cfg, total))
    # the node's own world of 1 exchanges nothing: a clock for the result, the sync as asked
    stats.strategy = sync.make(model, spec_of(cfg, total), 1)
    shape = shape_of(model)
    trained = [p for p in model.parameters() if p.requires_grad]
    # across nodes, as a ddp run across nodes sends: --grad-compression auto's wire, the word
    # embedding's touched rows
    wire, rows_at = elastic.wire_of(model, cfg.sync)

    # A node started again keeps the steps it logged before it left; the steps trained without it
    # come from the peer it heals from (state/load), so the head's steps.jsonl is the run's. A
    # resumed one keeps those up to its checkpoint.
    log = StepsLog(job.run_dir / names.STEPS, keep_through=restored.meta.step if restored else None)

    def state() -> dict[str, Any]:
        return {"model": model.state_dict(), "opt": opt.state_dict(),
                "sched": sched.state_dict(), "record": replica.record(), "steps": log.tail()}

    def load(sd: dict[str, Any]) -> None:  # a live peer's, when this node joins or falls behind
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["opt"])
        sched.load_state_dict(sd["sched"])
        replica.adopt(sd["record"])
        log.fill(sd["steps"])

    replica = elastic.Replica(state, load, os.environ, cfg.dist_timeout_s)

    def live() -> Training:  # what a checkpoint takes; lr_world: its lr is the planned nodes'
        return Training(cfg=dataclasses.replace(cfg, lr_world=nodes), model=model, opt=opt,
                        sched=sched, rank=0, world=1, evals=evals, elastic=replica.saved())

    if restored:
        restore(restored, live(), stats)
        replica.resume(restored.state[ELASTIC])
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=job.bf16)
    pending: list[Pending] = []
    waited = 0  # the nodes in when this node last said it waits for the others (WAITING)
    model.train()
    events.emit(events.START, total=total, batches_per_epoch=schedule.per_epoch, step=replica.step)
    looped = time.perf_counter()
    try:
        while replica.step < total and stop.pending() is None:
            t0 = time.perf_counter()
            share, n = replica.quorum()  # a node behind heals here
            quorum_s = time.perf_counter() - t0
            if replica.step >= total:
                break
            if replica.waits(n, nodes, cfg.dist_timeout_s):
                # the start: no step of fewer than the planned nodes until they are in, or
                # --dist-timeout has passed (then with whoever is); the others' exchange gets
                # this node's zeros, and nobody commits
                if n != waited:
                    events.emit(events.WAITING, nodes=n, planned=nodes,
                                timeout_s=cfg.dist_timeout_s)
                    waited = n
                opt.zero_grad(set_to_none=True)
                replica.average(trained, n, wire, rows_at)
                replica.commit(hold=True)
                time.sleep(WAIT_TICK_S)
                continue
            if (change := replica.note()) is not None:
                events.emit(events.NODES, step=change.step, nodes=n, planned=nodes,
                            members=list(change.nodes), left=list(change.left),
                            joined=list(change.joined))
            epoch, index, rows = schedule.at(replica.step)
            # A node that does not take part still runs the exchange (torchft zeroes its part):
            # one row keeps its forward pass well-formed, at weight 0.
            idx = rows[share::n] if share is not None else rows[:1]
            batch = collate(data, idx, job.regression)
            with autocast:
                loss = model(**batch).loss
            # Each row weighs 1/(rows of the global batch): the average divides by n.
            (loss * (len(idx) * n / len(rows) if share is not None else 0.0)).backward()
            t1 = time.perf_counter()
            exchange_s = replica.average(trained, n, wire, rows_at)
            t2 = time.perf_counter()
            committed = replica.commit()
            commit_s = time.perf_counter() - t2
            if not committed:  # a participant was lost mid-step: the same rows again
                opt.zero_grad(set_to_none=True)
                continue
            grad_norm = clip_and_step(model, opt, sched, cfg.max_grad_norm)
            dt = time.perf_counter() - t0
            stats.steps = replica.step
            # the wire's part: the quorum, the average's exchanges, the commit's agreement
            stats.anatomy.step(quorum_s + exchange_s + commit_s, t2 - t1 - exchange_s)
            stats.anatomy.parts(quorum_s=quorum_s, allreduce_s=exchange_s, commit_s=commit_s)
            stats.train_time_s += dt
            stats.step_times.append(dt)
            if share is not None:  # a step this node healed in trained none of its rows
                # the step's global batch (every participant's rows), its loss this node's share's
                loss_sum = loss.detach().double() * len(rows)
                pending.append(Pending(step=stats.steps, loss_sum=loss_sum, samples=len(rows),
                                       tokens=data.real_tokens(rows),
                                       flops=training_flops(shape, (len(data.input_ids[i])
                                                                    for i in rows)),
                                       dt=dt, lr=sched.get_last_lr()[0], grad_norm=grad_norm,
                                       waited=0.0, replicas=n, at=time.time()))
            if stats.steps % cfg.log_every == 0 or stats.steps == total:
                flush(pending, stats, log, 1, total, report)
                pending = []
            epoch_end = index == schedule.per_epoch - 1
            evaluated = evals is not None and evals.due(stats.steps, total, epoch_end)
            if evaluated and evals is not None:
                metrics, _ = evals.run(job, stats.steps, during=True)
                if report is not None:
                    report.log_eval(stats.steps, metrics)
            # at the same steps on every node, so that the nodes' newest checkpoints agree
            if saver.due(stats.steps, evaluated, epoch_end, stats.steps < total):
                flush(pending, stats, log, 1, total, report)
                pending = []
                save(saver, live(), stats, Position(epoch, index + 1), total)
            if evals is not None and evals.stopped is not None:
                break
        flush(pending, stats, log, 1, total, report)
        stats.stopped = stop.pending()
        stats.anatomy.loop_s = time.perf_counter() - looped
        stats.anatomy.eval_s = sum(e["seconds"] for e in evals.history) if evals else 0.0
        stats.membership = [dataclasses.asdict(c) for c in replica.changes]
    finally:
        log.close()
        replica.close()
    return stats
