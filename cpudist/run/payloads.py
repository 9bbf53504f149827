"""Each payload's part of the one route (wire/payload.py): its launch spec, how its ranks run from
here and leave their rank report. run/start.py (here, a hostfile's head, Slurm) and run/agent.py (a
head that runs for a laptop) call these; run/remote.py stages a script's folder in place of the
trainer's inputs.

    Trainer: prepare (model and data checked) -> local.execute; rank 0 writes the report
    Script:  script.script_spec -> script.run_ranks (local.execute, then --collect and the
             metric file)
    Probe:   prepare.resolve with the probe's program (`cpudist hosts bench` reads its event,
             hosts/bench.py)
"""

from __future__ import annotations

import dataclasses

from cpudist.errors import BadInput
from cpudist.launch.spec import Launch, RunSpec
from cpudist.results.launched import Launched
from cpudist.run import local, script
from cpudist.run.prepare import prepare, resolve
from cpudist.run.request import Callbacks, RunRequest
from cpudist.wire.payload import Probe, Script


def spec_of(request: RunRequest, dry_run: bool = False) -> RunSpec:
    """The checked launch spec of the request's payload."""
    p = request.payload
    if isinstance(p, Script):
        return script.script_spec(request, p, dry_run)
    if isinstance(p, Probe):
        if request.launch.np < 2:
            source = request.nodes.source if request.nodes else "the hostfile"
            raise BadInput(f"{source} names one host and --ppn is 1: nothing to all-reduce with",
                           "List at least two nodes in the hostfile (or raise --ppn to measure one "
                           "node's loopback)")
        spec = resolve(request, dry_run=dry_run)
        return dataclasses.replace(spec, program=p.program(request.train.output_dir))
    return prepare(request, dry_run)


def run_here(request: RunRequest, spec: RunSpec, launch: Launch, cb: Callbacks) -> Launched:
    """Launch the ranks from this machine to their end; what only the launching side knows, for the
    record."""
    if isinstance(request.payload, Script):
        return script.run_ranks(request, request.payload, (spec, launch), cb)
    return local.execute(spec, launch, cb, request.launch.timeout_s, request.launched)

