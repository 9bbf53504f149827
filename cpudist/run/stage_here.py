"""A run started on the head itself (`--hostfile`, or `--cluster` from node 0): its inputs on this machine's disk
reach the other nodes as a run from outside stages them (run/stage.py), from here.

Each input lands in ~/.cpudist/stage/<digest>/ here (checked like any staging) and is fanned out to every other
node of the run over the launcher's ssh; the ranks then read that path on every node. `--shared-fs` says the
nodes see this machine's paths already, and nothing is staged.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cpudist import state
from cpudist.errors import BadInput, CpudistError, JobFailed
from cpudist.hostfile import check_resolvable, read_hostfile
from cpudist.launch.kinds import scheduled
from cpudist.launch.spec import check_layout
from cpudist.launch.tools import is_this_machine
from cpudist.run import stage
from cpudist.run.remote import local_inputs
from cpudist.run.request import RunRequest
from cpudist.ssh.reach import check_reachable


def _sh(script: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _receive_here(it: stage.StageItem, home: str) -> None:
    """Unpack the item into its staging folder on this machine, streamed through the same receive script."""
    p = subprocess.Popen(["sh", "-c", stage.receive_script(it.remote_dir(home))], stdin=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    assert p.stdin is not None and p.stderr is not None
    try:
        for chunk in stage.tar_chunks(it):
            p.stdin.write(chunk)
        p.stdin.close()
    except BrokenPipeError:
        pass  # the script ended early: its exit code and stderr say why
    err = p.stderr.read().decode()
    if p.wait() != 0:
        raise CpudistError(f"staging {it.local} in {it.remote_dir(home)} failed: {err.strip()[-300:]}",
                           "Check the free disk in your home folder, then re-run")


def stage_here(request: RunRequest, say: Callable[[str], None]) -> tuple[RunRequest, dict[str, Any]]:
    """The request with its local inputs at their staged paths, once every other node of the run has them; the
    request unchanged on one machine, under a scheduler (its nodes share the files), with --shared-fs, or without
    local inputs."""
    if request.hostfile is None or scheduled(request.launch.launcher) or request.launch.shared_fs:
        return request, {}
    every = read_hostfile(Path(request.hostfile))
    check_layout(request.launch.np, request.launch.ppn, every, request.launch.oversubscribe)  # its error first
    hosts = every[: request.launch.nodes]
    others = [h.name for h in hosts[1:] if not is_this_machine(h.name)]
    try:
        inputs = local_inputs(request)
    except BadInput:  # a path that does not exist: prepare's check says so, as for any run
        return request, {}
    if not others or not inputs or not is_this_machine(hosts[0].name):  # not the head: prepare says so
        return request, {}
    cluster_ssh = state.local_cluster_dir() / "ssh"
    ssh = request.launch.ssh or (str(cluster_ssh) if cluster_ssh.is_file() else "ssh")
    check_resolvable(hosts)
    check_reachable(hosts, ssh)  # a node that cannot be reached: the launch's own one line, before any copy
    home = state.node_home()
    items = [(name, stage.item(what, path, stage.TOKENIZER_FILES if name == "tokenizer" else ()))
             for name, what, path in inputs]
    dirs = [it.remote_dir(home) for _, it in items]
    missing = set(_sh(stage.missing_script(dirs), 600).stdout.splitlines())
    for _, it in items:
        if it.remote_dir(home) in missing:
            _receive_here(it, home)
    out = _sh(stage.fan_out_script(dirs, others, ssh)).stdout
    results = [line.split(" ", 2) for line in out.splitlines() if line.count(" ") >= 2]
    failed = sorted({host for kind, host, _ in results if kind == "fail"})
    if failed or len(results) != len(dirs) * len(others):
        raise JobFailed(f"copying the run's inputs from this node to {', '.join(failed) or 'the other nodes'} "
                        "failed", "Check that the nodes reach each other (`cpudist hosts doctor`) and have free disk, "
                        "or pass --shared-fs when they all see this node's paths")
    copies = sum(kind == "sent" for kind, _, _ in results)
    say(f"staged {len(items)} input(s) on {len(others)} other node(s) ({copies} copied; --shared-fs skips this)")
    moved = stage.moved_fields(request.train.model_given, items, home)
    return request.with_train(**moved), {"copies_to_nodes": copies, "from": "head"}


def staging_plan(request: RunRequest) -> list[str]:
    """--dry-run's lines for what stage_here would stage (nothing is hashed, copied or probed)."""
    if request.hostfile is None or scheduled(request.launch.launcher) or request.launch.shared_fs:
        return []
    hosts = read_hostfile(Path(request.hostfile))[: request.launch.nodes]
    others = [h.name for h in hosts[1:] if not is_this_machine(h.name)]
    try:
        inputs = local_inputs(request) if others else []
    except BadInput:
        return []
    return [f"# stage {what} ({name}) {path} -> ~/{state.STAGE_DIR}/<sha256>/ here, then on {', '.join(others)} "
            "(the ranks read it there; --shared-fs: not staged)" for name, what, path in inputs]
