"""One run, in order: where it goes, what would happen (dry run), or run it and record it; for every
payload (the trainer, a user's script: wire/payload.py).

    request (run/request.py) + where (run/where.py)
      here | hostfile | a scheduler: payloads.spec_of -> plan (launch/kinds.py) -> payloads.run_here
                                -> outcome.record
      head over SSH:            recovery.run_remote
                                -> remote.run (stage, agent on the head, follow, fetch)
                                -> outcome.record
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from cpudist import state
from cpudist.errors import Interrupted, Preempted
from cpudist.hostfile import render_hostfile
from cpudist.launch.kinds import plan, scheduled
from cpudist.launch.spec import SBATCH_FILE, check_layout, redacted
from cpudist.results.launched import Launched
from cpudist.results.schema import RunResult
from cpudist.run import payloads, recovery, script, script_remote
from cpudist.run.claim import claim
from cpudist.run.life import identity, runlog
from cpudist.run.outcome import given_data, record
from cpudist.run.prepare import check_ledger, make_output_dir
from cpudist.run.remote import copied_to, local_inputs
from cpudist.run.request import Callbacks, RunRequest, lr_note
from cpudist.run.stage_here import stage_here, staging_plan
from cpudist.run.stopped import StopSeen, after_stop, hint
from cpudist.run.where import Head, Where
from cpudist.train.resume import checkpoint_folder
from cpudist.wire import programs, stop_marker
from cpudist.wire.payload import Script
from cpudist.wire.stop_marker import Stop


def start(request: RunRequest, where: Where, ledger: Path, cb: Callbacks) -> RunResult | None:
    """Run it wherever it goes (with its id, run/life/identity.py), and record the result in its run
    folder and the ledger; run.json follows its state. None: detached (--detach), the run goes on on
    its head."""
    check_ledger(ledger)  # before training: a result that cannot reach the ledger would be lost
    make_output_dir(Path(request.train.output_dir))
    request = dataclasses.replace(request, train=identity.assign(request.train))
    claim(request.train, request.overwrite, cb.note)  # empty, its own, or told to replace a run
    # for `cpudist logs` elsewhere
    cb = runlog.tee(cb, Path(request.train.output_dir), request.train.run_id)
    # the user's stop leaves no marker: its checkpoint is in rank 0's event
    cb = (seen := StopSeen()).wrap(cb)
    # before staging moves the paths to the nodes' copies
    request = dataclasses.replace(request, launched=Launched(
        command=request.command, cluster=where.cluster, usd_per_hour=where.usd_per_hour,
        data=given_data(request.train)))
    note = lr_note(request.train, request.launch.np, request.payload)
    if where.head is not None:
        check_layout(request.launch.np, request.launch.ppn, where.head.inside.hosts,
                     request.launch.oversubscribe)
        if note:
            cb.note(note)
        if where.detach:
            _detached(request, where, ledger, cb)
            return None
        return tracked(request, where_name(request, where),
                       lambda: recovery.run_remote(request, where, ledger, cb), seen)
    if where.detach:  # a scheduler's batch job (the only detached run from here: cli/run.py)
        from cpudist.run.life import batch_detach

        batch_detach.start(request, ledger, cb)
        return None
    # on the head itself: its inputs to the other nodes (run/stage_here.py)
    if where.nodes is not None:
        request, staging = stage_here(request, cb.on_line)
        request = dataclasses.replace(
            request, launched=dataclasses.replace(request.launched, staging=staging))
    # refuses a fresh run into another run's checkpoints before run.json is touched
    spec = payloads.spec_of(request)
    launch = plan(spec)
    if note:
        cb.note(note)
    out = Path(request.train.output_dir)
    return tracked(request, where_name(request, where), lambda: record(
        out, ledger, payloads.run_here(request, spec, launch, cb)), seen)



def _detached(request: RunRequest, where: Where, ledger: Path, cb: Callbacks) -> None:
    """--detach: run.json says running (with the head's agent in it) once the ranks are up; failed
    if they do not start."""
    from cpudist.run.life import detach

    assert where.head is not None
    out = Path(request.train.output_dir)
    identity.begin(request.train, where_name(request, where), request.command)
    try:
        detach.start(request, where.head, ledger, cb)
    except BaseException as e:
        identity.mark(out, "interrupted" if isinstance(e, KeyboardInterrupt | Interrupted)
                      else "failed",
                      message=getattr(e, "message", None) or str(e) or type(e).__name__)
        raise


def where_name(request: RunRequest, where: Where) -> str:
    """run.json's `where`: cluster:NAME, head:HOST, hostfile:PATH, a scheduler's name (slurm) or
    here."""
    if where.cluster:
        return f"cluster:{where.cluster}"
    if where.head is not None:
        return f"head:{where.head.target.host}"
    if where.nodes is not None:
        return f"hostfile:{where.nodes.source}"
    return request.launch.launcher if scheduled(request.launch.launcher) else "here"


def tracked(request: RunRequest, where: str, run: Callable[[], RunResult],
            seen: Callable[[], Stop | None] = lambda: None) -> RunResult:
    """Run `run` with run.json saying running, then finished, preempted, interrupted or failed."""
    identity.begin(request.train, where, request.command)
    out = Path(request.train.output_dir)
    return settle(out, run, seen, checkpoint_folder(request.train, out))


def settle(out: Path, run: Callable[[], RunResult], seen: Callable[[], Stop | None] = lambda: None,
           checkpoints: Path | None = None) -> RunResult:
    """Run `run` (a run's end: all of it, or a detached run's landing), then record in run.json (and
    as the last line of cpudist.log) how it ended; after a stop, what it can be resumed from and the
    exact command."""
    try:
        result = run()
    except Preempted as e:
        _ended(out, "preempted", e.message)
        raise
    except (Interrupted, KeyboardInterrupt) as e:
        info = identity.read_run(out)
        what, resume = after_stop(stop_marker.read(out) or seen(), checkpoints, info.command
                                  if info else "", out)
        said = f"{e.what if isinstance(e, Interrupted) else 'interrupted'}; {what}"
        _ended(out, "interrupted", said, resume)
        raise Interrupted(said, hint(resume)) from None
    except BaseException as e:
        _ended(out, "failed", getattr(e, "message", None) or str(e) or type(e).__name__)
        raise
    identity.mark(out, "finished", metrics=result.metrics)
    return result


def _ended(out: Path, run_state: str, message: str, resume: str = "") -> None:
    """run.json's end, and the same words as cpudist.log's last line (what `cpudist logs` shows)."""
    identity.mark(out, run_state, message=message, resume=resume)
    runlog.append(out, f"[cpudist] run {run_state}: {message}"
                  + (f". Resume: {resume}" if resume else ""))


def describe(request: RunRequest, where: Where) -> str:
    """What `start` would do, as text to print (`--dry-run`): nothing is written, started or
    connected to."""
    note = lr_note(request.train, request.launch.np, request.payload)
    return (f"# {note}\n" if note else "") + _describe(request, where)


def _describe(request: RunRequest, where: Where) -> str:
    if where.head is not None and isinstance(request.payload, Script):
        return script_remote.describe_remote(request, request.payload, where.head)
    if where.head is not None:
        check_layout(request.launch.np, request.launch.ppn, where.head.inside.hosts,
                     request.launch.oversubscribe)
        return _describe_remote(request, where.head, where.detach)
    spec = redacted(payloads.spec_of(request, dry_run=True))  # --env values shown as ***
    launch = plan(spec)
    if launch.script is not None:
        return (f"# {Path(request.train.output_dir) / SBATCH_FILE} (written and submitted with "
                f"`{launch.shell()}`)\n"
                f"{launch.script}")
    first, then = (script.plan_lines(request, request.payload, spec, launch)
                   if isinstance(request.payload, Script)
                   # a trainer's run from the head: its inputs to the nodes first
                   else ([], staging_plan(request)))
    lines = [*first, "# environment of every rank",
             *(f"export {k}={v}" for k, v in launch.rank_env.items())]
    # torchrun across hosts runs one command per host instead
    if spec.hostfile and not launch.per_host:
        used = spec.hosts[: request.launch.nodes]
        lines += [f"# hostfile {spec.hostfile} (written when the run starts)",
                  render_hostfile(used, "openmpi" if spec.launcher == "openmpi" else "hydra",
                                  spec.ppn).rstrip("\n")]
    lines += then
    return "\n".join([*lines, "# command", launch.shell()]) + "\n"


def _describe_remote(request: RunRequest, head: Head, detach: bool = False) -> str:
    nodes = head.inside.hosts[: request.launch.nodes]
    shown = request.shown()
    user = f"{head.target.user}@" if head.target.user else ""
    lines = [f"# from this machine: ssh {user}{head.target.host} (port {head.target.port}, host "
             f"keys pinned in {head.known_hosts})"]
    targets = copied_to(request, nodes)
    then = (f"then on {', '.join(h.name for h in targets)}" if targets
            else "the only copy (--shared-fs: the nodes read it there)" if request.launch.shared_fs
            else "then on no other node")
    lines += [f"# stage {what} ({name}) {path} -> ~/{state.STAGE_DIR}/<sha256>/ on the head, {then}"
              for name, what, path in local_inputs(request)]
    lines += [f"# nodes (as they reach each other): {' '.join(h.name for h in nodes)}",
              f"# on the head: {programs.usage(programs.AGENT)}, with this request on stdin (--env "
              "values shown as ***)"
              if not detach
              else f"# --detach: on the head, setsid nohup {programs.usage(programs.AGENT)} "
                   "--detached "
              "<run dir>, this request in <run dir>/agent.request.json (--env values shown as "
              "***); this command returns once the ranks are up", shown.to_json()]
    return "\n".join(lines) + "\n"
