"""Every program that runs on the nodes, as the module `python -m` starts: the one table that
launchers and command builders read."""

RANK = "cpudist.rank"  # a training rank
SCRIPT_RANK = "cpudist.run.script_rank"  # a rank of a user's script (`cpudist launch`)
AGENT = "cpudist.run.agent"  # on the head: a run (any payload) started from another machine
TETHER = "cpudist.launch.tether"  # a command that dies with its SSH session (torchrun per host)
BENCH_RANK = "cpudist.hosts.bench_rank"  # a rank of `cpudist hosts bench`
PROBE = "cpudist.hosts.probe"  # a node's facts for `cpudist hosts doctor`
PREDICT_WORKER = "cpudist.predict.worker"  # one `cpudist predict --np N` process

PROGRAMS = (RANK, SCRIPT_RANK, AGENT, TETHER, BENCH_RANK, PROBE, PREDICT_WORKER)


def usage(module: str) -> str:
    """How a person starts `module` by hand (its argparse prog)."""
    return f"python -m {module}"
