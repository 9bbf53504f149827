"""A user's script on a cluster from outside it (`cpudist launch --cluster NAME | --head ADDR`): `run`'s remote
route (run/remote.py) with the script's folder and every `--stage PATH` staged in place of the trainer's inputs.

    laptop: snapshot the script's folder into <run folder>/script/ (the record of what ran; no .git, __pycache__ or
            the folder of runs), stage it and each --stage PATH on the head and fan them out (content-hashed:
            nothing is sent twice), the command's words naming a staged path rewritten to the nodes' path
    head:   python -m cpudist.run.script_agent (request and script on stdin): every node copies the staged folder
            into the run's own working folder, the ranks start there, --collect and the metric file are read there
    laptop: output streamed, Ctrl-C stops every rank; result.json, ranks.log and collected/ come home; the ledger
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from cpudist import state
from cpudist.errors import BadInput
from cpudist.launch.spec import check_layout
from cpudist.results.schema import RunResult
from cpudist.run import remote, stage
from cpudist.run.follow import follow
from cpudist.run.request import Callbacks, RunRequest
from cpudist.run.script import COLLECTED, Script, check_script
from cpudist.run.where import Head
from cpudist.ssh.client import Remote
from cpudist.ssh.known_hosts import KnownHosts
from cpudist.wire import programs

SNAPSHOT = "script"  # the local run folder's copy of the script's folder, as staged
WORK = "work"  # the run's working folder on every node, under the head's run folder
SKIPPED = (".git", "__pycache__", ".venv", "venv")


@dataclass(frozen=True)
class ScriptJob(RunRequest):
    """The request the head's script agent reads (one JSON line): a RunRequest and the script as the head runs it."""

    script: Script = dataclasses.field(default_factory=lambda: Script(()))

    @classmethod
    def parse(cls, text: str) -> tuple[RunRequest, Script]:
        data = json.loads(text)
        given = data.pop("script")
        script = Script(**{**given, **{k: tuple(given[k]) for k in ("command", "collect", "stage")}})
        return RunRequest.from_json(json.dumps(data)), script


def snapshot(folder: Path, out: Path) -> Path:
    """A copy of the script's folder in the run folder: what is staged, and what ran. The folder holding the run
    folder (runs/), version control and caches are left out."""
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
    """The command with each word naming a staged path (as given, or absolute; also `--opt=PATH`) as the nodes'."""
    def one(word: str) -> str:
        if word in paths:
            return paths[word]
        key, eq, value = word.partition("=")
        return f"{key}={paths[value]}" if eq and value in paths else word
    return tuple(one(w) for w in command)


def staged_paths(script: Script) -> list[tuple[str, Path]]:
    """(as given, local path) of every --stage PATH; one that is not there is refused before anything starts."""
    found = []
    for given in script.stage:
        path = Path(given).expanduser()
        path = path if path.is_absolute() else script.folder / path
        if not path.exists():
            raise BadInput(f"--stage {given}: {path} does not exist", "Give a file or folder to put on every node")
        found.append((given, path.resolve()))
    return found


def head_script(script: Script, folder: str, run_dir: str, paths: dict[str, str]) -> Script:
    """The script as the head runs it: in the run's working folder, copied from the staged folder on each node."""
    return Script(rewrite(script.command, paths), f"{run_dir}/{WORK}", script.metric_file, script.collect,
                  copy_of=folder, per_node=script.per_node)


def describe_remote(request: RunRequest, script: Script, head_spec: Head) -> str:
    """What run_remote would do, as text (`--dry-run`): nothing is copied, connected to or started."""
    check_layout(request.launch.np, request.launch.ppn, head_spec.inside, request.launch.oversubscribe)
    check_script(script)
    nodes = head_spec.inside[: request.launch.nodes]
    user = f"{head_spec.target.user}@" if head_spec.target.user else ""
    others = ", ".join(h.name for h in nodes[1:]) or "no other node"
    lines = [f"# from this machine: ssh {user}{head_spec.target.host} (port {head_spec.target.port})",
             f"# stage {script.folder} (as {Path(request.train.output_dir) / SNAPSHOT}: no {', '.join(SKIPPED)} "
             f"or runs folder) -> ~/{state.STAGE_DIR}/<sha256>/ on the head, then on {others}",
             *(f"# stage {path} -> ~/{state.STAGE_DIR}/<sha256>/ on every node (the command's `{given}` too)"
               for given, path in staged_paths(script)),
             f"# nodes (as they reach each other): {' '.join(h.name for h in nodes)}",
             f"# on the head: {programs.usage(programs.SCRIPT_AGENT)}; every node copies the staged folder "
             f"into the run's {WORK}/, and "
             f"{request.launch.np} rank(s) run `{shlex.join(script.command)}` there",
             *(f"# then: {p} -> {Path(request.train.output_dir) / COLLECTED}/ here" for p in script.collect)]
    return "\n".join(lines) + "\n"


def run_remote(request: RunRequest, script: Script, head_spec: Head, ledger: Path, cb: Callbacks) -> RunResult:
    """The whole remote script run; the result as appended to this machine's ledger."""
    started = time.monotonic()
    check_layout(request.launch.np, request.launch.ppn, head_spec.inside, request.launch.oversubscribe)
    check_script(script)
    local_dir = Path(request.train.output_dir)
    extras = staged_paths(script)
    folder = snapshot(script.folder, local_dir)
    with Remote(head_spec.target, KnownHosts(head_spec.known_hosts)) as head:
        # run's staging of the code and hostfile (a script run has no trainer inputs: remote.local_inputs); the
        # script's folder and --stage paths are ours to stage
        staged = remote.stage_run(head, request, head_spec, cb.note, started)
        home = head.check('printf %s "$HOME"').strip()
        stager = remote.Stager(head, home, head_spec.inside[: request.launch.nodes][1:], cb.note)
        items = [stage.item("script folder", folder), *(stage.item("staged", p) for _, p in extras)]
        stager.put(items)
        stager.fan_out(items)
        paths = {}
        for (given, path), it in zip(extras, items[1:], strict=True):
            paths[given] = paths[str(path)] = it.remote_path(home)
        run_dir = staged.run_dir
        job = ScriptJob(**{f.name: getattr(staged.job, f.name) for f in dataclasses.fields(RunRequest)},
                        script=head_script(script, items[0].remote_path(home), run_dir, paths))
        cb.note(f"running `{shlex.join(job.script.command)}` in {job.script.workdir} on every node")
        command = f"cd && exec {remote.python_words(staged.python, staged.pythonpath)} -m {programs.SCRIPT_AGENT}"
        try:
            status = follow(head, command, job, cb)
        finally:
            remote.fetch_files(head, run_dir, local_dir, False)
            if not head.lost and script.collect:
                remote.fetch_tree(head, f"{run_dir}/{COLLECTED}", local_dir / COLLECTED)
        staging = {**staged.staging, "script_sent_bytes": stager.sent_bytes, "script_copies": stager.copies,
                   "script_folder": items[0].remote_path(home)}
        landing = remote.Landing(run_dir, local_dir.resolve(), False, staging, ledger)
        return remote.conclude(head, landing, status, cb.note)
