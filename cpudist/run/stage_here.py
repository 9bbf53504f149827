"""A run started on the head itself (`--hostfile`, or `--cluster` from node 0): its inputs on this
machine's disk reach the other nodes as a run from outside stages them (run/stage.py), from here.

Each input lands in ~/.cpudist/stage/<digest>/ here (checked like any staging) and is fanned out to
every other node of the run over the launcher's ssh; the ranks then read that path on every node.
`--shared-fs` says the nodes see this machine's paths already, and nothing is staged.
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from typing import Any

from cpudist import state
from cpudist.errors import BadInput, CpudistError
from cpudist.hostfile import check_resolvable
from cpudist.launch.kinds import scheduled
from cpudist.launch.spec import check_layout
from cpudist.launch.tools import is_this_machine
from cpudist.run import stage
from cpudist.run.remote import local_inputs
from cpudist.run.request import RunRequest
from cpudist.ssh.reach import check_reachable


class Here:
    """This machine as the head that items are staged on (stage.Shell): its shell, the item streamed
    to stdin."""

    def check(self, command: str, stdin: Iterable[bytes] | None = None,
              timeout: float = 3600) -> str:
        """The command's stdout; its output goes to files, so a chatty command never blocks the
        item's stream."""
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            p = subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE, stdout=out,
                                 stderr=err, bufsize=0)
            assert p.stdin is not None
            # an early end: its exit code and stderr say why
            with contextlib.suppress(BrokenPipeError):
                for chunk in stdin or ():
                    p.stdin.write(chunk)
            p.stdin.close()
            p.wait(timeout=timeout)
            out.seek(0), err.seek(0)
            if p.returncode != 0:
                raise CpudistError(f"`{command[:60]}...` failed here: "
                                   f"{err.read().decode().strip()[-300:]}",
                                   "Check the free disk in your home folder, then re-run")
            return out.read().decode()


def stage_here(request: RunRequest,
               say: Callable[[str], None]) -> tuple[RunRequest, dict[str, Any]]:
    """The request with its local inputs at their staged paths, once every other node of the run has
    them; the request unchanged on one machine, under a scheduler (its nodes share the files), with
    --shared-fs, or without local inputs."""
    if request.nodes is None or scheduled(request.launch.launcher) or request.launch.shared_fs:
        return request, {}
    every = request.nodes.hosts
    # its error first
    check_layout(request.launch.np, request.launch.ppn, every, request.launch.oversubscribe)
    hosts = every[: request.launch.nodes]
    others = [h.name for h in hosts[1:] if not is_this_machine(h.name)]
    try:
        inputs = local_inputs(request)
    except BadInput:  # a path that does not exist: prepare's check says so, as for any run
        return request, {}
    # not the head: prepare says so
    if not others or not inputs or not is_this_machine(hosts[0].name):
        return request, {}
    cluster_ssh = state.local_cluster_dir() / "ssh"
    ssh = request.launch.ssh or (str(cluster_ssh) if cluster_ssh.is_file() else "ssh")
    check_resolvable(hosts)
    # a node that cannot be reached: the launch's own one line, before any copy
    check_reachable(hosts, ssh)
    home = state.node_home()
    items = [(name, stage.item(what, path, stage.TOKENIZER_FILES if name == "tokenizer" else ()))
             for name, what, path in inputs]
    stager = stage.Stager(Here(), home, tuple(h for h in hosts[1:] if h.name in others), say, ssh)
    stager.put([it for _, it in items])
    stager.fan_out([it for _, it in items])
    copies = stager.copies
    say(f"staged {len(items)} input(s) on {len(others)} other node(s) ({copies} copied; "
        "--shared-fs skips this)")
    moved = stage.moved_fields(request.train.model_given, items, home)
    return request.with_train(**moved), {"copies_to_nodes": copies, "from": "head"}


def staging_plan(request: RunRequest) -> list[str]:
    """--dry-run's lines for what stage_here would stage (nothing is hashed, copied or probed)."""
    if request.nodes is None or scheduled(request.launch.launcher) or request.launch.shared_fs:
        return []
    hosts = request.nodes.hosts[: request.launch.nodes]
    others = [h.name for h in hosts[1:] if not is_this_machine(h.name)]
    try:
        inputs = local_inputs(request) if others else []
    except BadInput:
        return []
    return [f"# stage {what} ({name}) {path} -> ~/{state.STAGE_DIR}/<sha256>/ here, then on "
            f"{', '.join(others)} "
            "(the ranks read it there; --shared-fs: not staged)" for name, what, path in inputs]
