"""A user's script on a cluster from outside it (`cpudist launch --cluster NAME | --head ADDR`):
`run`'s remote route (run/remote.py), which stages the script's folder and every `--stage PATH` here
in place of the trainer's inputs.

    laptop: snapshot the script's folder into <run folder>/script/ (the record of what ran; no .git,
            __pycache__ or the folder of runs), stage it and each --stage PATH on the head and fan
            them out (content-hashed: nothing is sent twice), the command's words naming a staged
            path rewritten to the nodes' path
    head:   python -m cpudist.run.agent (the request, its Script payload rewritten, on stdin): every
            node copies the staged folder into the run's own working folder, the ranks start there,
            --collect and the metric file are read there
    laptop: output streamed, Ctrl-C stops every rank; result.json, ranks.log and collected/ come
            home; the ledger
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path
from typing import Any

from cpudist import state
from cpudist.errors import BadInput
from cpudist.launch.spec import check_layout
from cpudist.run import stage
from cpudist.run.claim import COLLECTED
from cpudist.run.request import RunRequest
from cpudist.run.script import check_script
from cpudist.run.where import Head
from cpudist.wire import programs
from cpudist.wire.payload import Script

SNAPSHOT = "script"  # the local run folder's copy of the script's folder, as staged
WORK = "work"  # the run's working folder on every node, under the head's run folder
SKIPPED = (".git", "__pycache__", ".venv", "venv")


def snapshot(folder: Path, out: Path) -> Path:
    """A copy of the script's folder in the run folder: what is staged, and what ran. The folder
    holding the run folder (runs/), version control and caches are left out."""
    out_abs = out.resolve()
    inside = out_abs.is_relative_to(folder) and out_abs != folder

    def ignore(where: str, names: list[str]) -> set[str]:
        left = {n for n in names if n in SKIPPED}
        if inside and Path(where) == folder:
            left.add(out_abs.relative_to(folder).parts[0])
        return left

    dest = out / SNAPSHOT
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(folder, dest, ignore=ignore)
    return dest


def rewrite(command: tuple[str, ...], paths: dict[str, str]) -> tuple[str, ...]:
    """The command with each word naming a staged path (as given, or absolute; also `--opt=PATH`) as
    the nodes'."""
    def one(word: str) -> str:
        if word in paths:
            return paths[word]
        key, eq, value = word.partition("=")
        return f"{key}={paths[value]}" if eq and value in paths else word
    return tuple(one(w) for w in command)


def staged_paths(script: Script) -> list[tuple[str, Path]]:
    """(as given, local path) of every --stage PATH; one that is not there is refused before
    anything starts."""
    found = []
    for given in script.stage:
        path = Path(given).expanduser()
        path = path if path.is_absolute() else script.folder / path
        if not path.exists():
            raise BadInput(f"--stage {given}: {path} does not exist",
                           "Give a file or folder to put on every node")
        found.append((given, path.resolve()))
    return found


def head_script(script: Script, folder: str, run_dir: str, paths: dict[str, str]) -> Script:
    """The script as the head runs it: in the run's working folder, copied from the staged folder on
    each node."""
    return Script(command=rewrite(script.command, paths), workdir=f"{run_dir}/{WORK}",
                  metric_file=script.metric_file,
                  collect=script.collect, copy_of=folder, per_node=script.per_node)


def describe_remote(request: RunRequest, script: Script, head_spec: Head) -> str:
    """What run_remote would do, as text (`--dry-run`): nothing is copied, connected to or
    started."""
    check_layout(request.launch.np, request.launch.ppn, head_spec.inside.hosts,
                 request.launch.oversubscribe)
    check_script(script)
    nodes = head_spec.inside.hosts[: request.launch.nodes]
    user = f"{head_spec.target.user}@" if head_spec.target.user else ""
    others = ", ".join(h.name for h in nodes[1:]) or "no other node"
    lines = [f"# from this machine: ssh {user}{head_spec.target.host} (port "
             f"{head_spec.target.port})",
             f"# stage {script.folder} (as {Path(request.train.output_dir) / SNAPSHOT}: no "
             f"{', '.join(SKIPPED)} "
             f"or runs folder) -> ~/{state.STAGE_DIR}/<sha256>/ on the head, then on {others}",
             *(f"# stage {path} -> ~/{state.STAGE_DIR}/<sha256>/ on every node (the command's "
               f"`{given}` too)"
               for given, path in staged_paths(script)),
             f"# nodes (as they reach each other): {' '.join(h.name for h in nodes)}",
             f"# on the head: {programs.usage(programs.AGENT)}; every node copies the staged "
             f"folder into the run's {WORK}/, and {request.launch.np} rank(s) run "
             f"`{shlex.join(script.command)}` there",
             *(f"# then: {p} -> {Path(request.train.output_dir) / COLLECTED}/ here"
               for p in script.collect)]
    return "\n".join(lines) + "\n"


def check(script: Script) -> None:
    """Refuse, before connecting, a script file, working folder or --stage path that is not here."""
    check_script(script)
    staged_paths(script)


def stage_script(stager: stage.Stager, script: Script, local_dir: Path,
                 run_dir: str) -> tuple[Script, dict[str, Any]]:
    """Snapshot the script's folder into the run folder, put it and every --stage path on the head
    and the nodes; the script as the head runs it, and result.json's staging fields of its own."""
    extras = staged_paths(script)
    folder = snapshot(script.folder, local_dir)
    items = [stage.item("script folder", folder), *(stage.item("staged", p) for _, p in extras)]
    stager.put(items)
    stager.fan_out(items)
    paths = {}
    for (given, path), it in zip(extras, items[1:], strict=True):
        paths[given] = paths[str(path)] = it.remote_path(stager.home)
    on_head = head_script(script, items[0].remote_path(stager.home), run_dir, paths)
    stager.say(f"running `{shlex.join(on_head.command)}` in {on_head.workdir} on every node")
    return on_head, {"script_sent_bytes": stager.sent_bytes, "script_copies": stager.copies,
                     "script_folder": items[0].remote_path(stager.home)}
