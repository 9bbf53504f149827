"""A run started outside the cluster: reach the head over SSH, stage, launch there, stream, fetch.

    laptop --ssh (public address, pinned host key)--> head
      --cluster ssh (private addresses)--> nodes

Inputs go to the head once and fan out from it over the private network; the head runs
`python -m cpudist.run.agent`, which launches the ranks as `cpudist run --hostfile` does on a head
node; the result, the steps and the rank log come back into the local run folder and ledger.
"""

from __future__ import annotations

import dataclasses
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cpudist
from cpudist import state
from cpudist.errors import BadInput, CpudistError, Interrupted, JobFailed, Preempted
from cpudist.hostfile import Host, Nodes
from cpudist.results.launched import RANK_REPORT, Launched
from cpudist.results.schema import RunResult
from cpudist.run import script_remote, stage
from cpudist.run.claim import COLLECTED
from cpudist.run.fetch_model import fetch_model
from cpudist.run.follow import follow
from cpudist.run.outcome import record
from cpudist.run.request import Callbacks, RunRequest
from cpudist.run.where import Head
from cpudist.ssh.client import Remote
from cpudist.ssh.known_hosts import KnownHosts
from cpudist.train.models import PRESETS, resolve_model, tokenizer_source
from cpudist.train.report_to import RUN_FOLDERS
from cpudist.wire import exits, names, programs, stop_marker
from cpudist.wire.payload import Script

FETCHED = (RANK_REPORT, names.STEPS, names.COMMAND, names.RANKS_LOG, names.HOSTFILE,
           stop_marker.NAME)
PYTHONS = ("/opt/cpudist/bin/python", "python3.11", "python3")


def local_inputs(request: RunRequest) -> list[tuple[str, str, Path]]:
    """(field, what, local path) of every input the trainer's ranks read from this machine's disk (a
    script's folder and --stage paths: run/script_remote.py)."""
    cfg = request.train
    if isinstance(request.payload, Script):
        return []
    found = []
    for name, what in (("data_dir", "data"), ("train_file", "data"), ("validation_file", "data")):
        value = getattr(cfg, name)
        if value:
            path = Path(value).expanduser()
            if not path.exists():
                raise BadInput(f"--{name.replace('_', '-')} {value} does not exist",
                               "Check the path")
            found.append((name, what, path))
    if cfg.model not in PRESETS and Path(resolve_model(cfg.model)).is_dir():
        found.append(("model", "model", Path(resolve_model(cfg.model))))
    if cfg.task != "synthetic":
        tok = Path(tokenizer_source(cfg.model, cfg.tokenizer))
        if tok.is_dir() and not (cfg.model not in PRESETS
                                 and tok == Path(resolve_model(cfg.model))):
            # the tokenizer's files only: see stage.item
            found.append(("tokenizer", "tokenizer", tok))
    return found


def fetch_tree(head: Remote, remote_dir: str, local_dir: Path) -> int:
    """Copy every file under the head's remote_dir (small ones: --report-to's event files and MLflow
    store) into local_dir, empty folders too (MLflow's file store finds a run only with its empty
    artifacts/)."""
    code, out, _ = head.run(f"cd {shlex.quote(remote_dir)} && find . -mindepth 1 \\( -type d "
                            "-printf '%P/\\n' \\) -o "
                            "-type f -printf '%P\\n'", timeout=120)
    lines = [n for n in out.splitlines() if n] if code == 0 else []
    for folder in (n for n in lines if n.endswith("/")):
        (local_dir / folder).mkdir(parents=True, exist_ok=True)
    names = [n for n in lines if not n.endswith("/")]
    for name in names:
        (local_dir / name).parent.mkdir(parents=True, exist_ok=True)
        head.fetch(f"{remote_dir}/{name}", local_dir / name)
    return len(names)


def _find_python(head: Remote, given: str | None) -> str:
    candidates = (given,) if given else PYTHONS
    script = "; ".join(f"if command -v {shlex.quote(p)} >/dev/null 2>&1 && {shlex.quote(p)} -c "
                       f"'import cpudist' 2>/dev/null; then command -v {shlex.quote(p)}; exit 0; fi"
                       for p in candidates) + "; exit 1"
    code, out, _ = head.run(script, timeout=60)
    if code != 0:
        raise BadInput(f"no Python with cpudist on the head node {head.target.host} (tried "
                       f"{', '.join(candidates)})",
                       "Boot the nodes from `cpudist ami build`'s image, or pass --remote-python "
                       "PATH")
    return out.strip().splitlines()[-1]


def build_wheel(folder: Path) -> Path:
    """A wheel of the running cpudist (from its source tree), cached by the code's fingerprint."""
    root = Path(cpudist.__file__).resolve().parents[1]
    if not (root / "pyproject.toml").is_file():
        raise BadInput(f"cpudist at {root} is not a source tree, so no wheel of it can be built",
                       "Install the same cpudist on the nodes and pass --stage-code never")
    out = folder / stage.code_fingerprint()[:32]
    wheels = sorted(out.glob("cpudist-*.whl"))
    if not wheels:
        out.mkdir(parents=True, exist_ok=True)
        p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "--no-build-isolation", "-q",
                            "-w", str(out), str(root)], capture_output=True, text=True,
                           stdin=subprocess.DEVNULL)
        wheels = sorted(out.glob("cpudist-*.whl"))
        if p.returncode != 0 or not wheels:
            raise CpudistError(f"building a wheel of cpudist failed: {p.stderr.strip()[-300:]}",
                               "Check `pip wheel --no-deps .` in the source tree")
    return wheels[-1]


def _stage_code(head: Remote, python: str, stager: stage.Stager, mode: str,
                wheels: Path) -> str | None:
    """The PYTHONPATH under which the nodes run this machine's cpudist, when theirs differs."""
    if mode == "never":
        return None
    if mode == "auto":
        code, out, _ = head.run(f"{shlex.quote(python)} -c 'from cpudist.run.stage import "
                                "code_fingerprint; print(code_fingerprint())'", timeout=60)
        if code == 0 and out.strip().splitlines()[-1:] == [stage.code_fingerprint()]:
            return None
    wheel = stage.item("cpudist", build_wheel(wheels))
    stager.put([wheel])
    site = f"{wheel.remote_dir(stager.home)}/site"
    head.check(f"[ -e {shlex.quote(site)}/.installed ] || ({shlex.quote(python)} -m pip install -q "
               f"--no-deps --no-index --disable-pip-version-check --target {shlex.quote(site)} "
               f"{shlex.quote(wheel.remote_path(stager.home))} && touch "
               f"{shlex.quote(site)}/.installed)", timeout=600)
    stager.fan_out([wheel])
    why = ("--stage-code always" if mode == "always"
           else f"the head's cpudist differs from this one ({cpudist.__version__})")
    stager.say(f"{why}: using this one's wheel")
    return site


@dataclass(frozen=True)
class Staged:
    """A run made ready on the head: its inputs there, its request for the agent, the command that
    starts it."""

    run_dir: str  # the run's folder on the head
    job: RunRequest  # the request as the head runs it (head paths)
    python: str
    pythonpath: str | None  # the staged wheel's, when the nodes run this machine's cpudist
    staging: dict[str, Any]  # result.json's staging, but for the model fetched home


def copied_to(request: RunRequest, nodes: Sequence[Host]) -> tuple[Host, ...]:
    """The nodes the head copies its staged items to: every other node of the run; none with
    --shared-fs (the nodes see the head's staging folder: it is the only copy)."""
    return () if request.launch.shared_fs else tuple(nodes[1:])


def stage_run(head: Remote, request: RunRequest, head_spec: Head, say: Any,
              started: float) -> Staged:
    """Connect-side preparation of a remote run: find the head's Python, stage code and inputs; the
    job the head runs (its paths, its nodes)."""
    cfg = request.train
    local_dir = Path(cfg.output_dir)
    home = head.check('printf %s "$HOME"').strip()
    connect_s = round(time.monotonic() - started, 2)  # result.json's startup: the laptop's phases
    python = _find_python(head, head_spec.python)
    nodes = head_spec.inside.hosts[: request.launch.nodes]
    stager = stage.Stager(head, home, copied_to(request, nodes), say)
    pythonpath = _stage_code(head, python, stager, head_spec.stage_code, state.wheels_dir())
    inputs = [(name, stage.item(what, path, stage.TOKENIZER_FILES if name == "tokenizer" else ()))
              for name, what, path in local_inputs(request)]
    stager.put([it for _, it in inputs])
    stager.fan_out([it for _, it in inputs])
    # One folder per run (its id): runs from folders of the same name (a sweep's nodesN) never share
    # one.
    run_dir = f"{home}/{state.RUNS_DIR}/{local_dir.name}-{cfg.run_id}" if cfg.run_id else \
        f"{home}/{state.RUNS_DIR}/{local_dir.name}"
    head.check(f"mkdir -p {shlex.quote(run_dir)}")
    moved = stage.moved_fields(cfg.model_given, inputs, home)
    env = request.launch.env + ((("PYTHONPATH", pythonpath),) if pythonpath else ())
    job = dataclasses.replace(request.with_train(output_dir=run_dir, **moved),
                              nodes=Nodes(tuple(nodes), head_spec.inside.source),
                              launch=dataclasses.replace(request.launch, env=env))
    extra: dict[str, Any] = {}
    # its folder and --stage paths, the command rewritten to their copies
    if isinstance(request.payload, Script):
        script, extra = script_remote.stage_script(stage.Stager(head, home, stager.others, say),
                                                   request.payload, Path(cfg.output_dir), run_dir)
        job = dataclasses.replace(job, payload=script)
    staging_s = round(time.monotonic() - started, 1)
    say(f"launching on {head_spec.target.host} ({len(nodes)} node(s)); staging took {staging_s}s, "
        f"sent {stager.sent_bytes / 1e6:.1f} MB")
    staging = {"sent_to_head_bytes": stager.sent_bytes, "copies_to_nodes": stager.copies,
               "remote_run_dir": run_dir, "head": head_spec.target.host,
               "code": "wheel" if pythonpath else "node's own", "seconds": staging_s,
               "connect_s": connect_s, "stage_s": round(staging_s - connect_s, 2), **extra}
    return Staged(run_dir, job, python, pythonpath, staging)


def python_words(python: str, pythonpath: str | None) -> str:
    """The shell words that run the head's Python with the staged wheel's PYTHONPATH, if any."""
    prefix = f"env PYTHONPATH={shlex.quote(pythonpath)} " if pythonpath else ""
    return f"{prefix}{shlex.quote(python)}"


def agent_command(python: str, pythonpath: str | None, args: str = "") -> str:
    """The shell words that run the agent on the head."""
    return f"{python_words(python, pythonpath)} -m {programs.AGENT}{args}"


def fetched_folders(request: RunRequest) -> tuple[str, ...]:
    """The folders of the head's run folder that come home whole: --report-to's, a script's
    --collect outputs."""
    if isinstance(request.payload, Script):
        return (COLLECTED,) if request.payload.collect else ()
    return RUN_FOLDERS if request.train.report_to else ()


def fetch_files(head: Remote, run_dir: str, local_dir: Path, folders: tuple[str, ...]) -> None:
    """Bring the run's files (rank report, steps, rank log, stop marker) and `folders`
    (fetched_folders) from the head."""
    local_dir.mkdir(parents=True, exist_ok=True)
    stop_marker.clear(local_dir)  # an earlier part's stop
    for name in FETCHED if not head.lost else ():  # a lost head's error is the one to show
        if not head.fetch(f"{run_dir}/{name}", local_dir / name) and name == RANK_REPORT:
            # an earlier run's, in a reused folder: not this one's
            (local_dir / name).unlink(missing_ok=True)
    for folder in folders if not head.lost else ():
        fetch_tree(head, f"{run_dir}/{folder}", local_dir / folder)


@dataclass(frozen=True)
class Landing:
    """What the end of a remote run needs to bring it home and record it (a detached run keeps it in
    run.json)."""

    run_dir: str  # on the head
    local_dir: Path
    fetch_model: bool
    staging: dict[str, Any]
    ledger: Path


def conclude(head: Remote, landing: Landing, status: dict[str, Any], say: Any) -> RunResult:
    """After fetch_files: the model home (when asked and the run went well), the agent's error as
    ours, or the run recorded in the run folder and the ledger."""
    local_dir = landing.local_dir
    fetched = (fetch_model(head, f"{landing.run_dir}/{names.MODEL}", local_dir / names.MODEL, say)
               if landing.fetch_model and status.get("status") == "ok" else {})
    stop = stop_marker.read(local_dir)
    if status.get("exit_code") == Preempted.exit_code and stop is not None:
        raise Preempted(stop.said(" on the head"),
                        f"Resume: the same command with --resume auto --output-dir {local_dir}, or "
                        "add --on-preemption resume to replace lost nodes and go on by itself")
    if status.get("exit_code") == Interrupted.exit_code:
        raise Interrupted(f"on the head node: {status.get('message', 'interrupted')}",
                          "Re-run the command to start over")
    if status.get("status") != "ok":
        cls = BadInput if status.get("exit_code") == exits.BAD_INPUT else JobFailed
        raise cls(f"on the head node: {status.get('message', 'the job failed')}")
    staging = {**landing.staging, **({"model": fetched} if fetched else {})}
    # the request's, with what the head's launch learnt
    launched = Launched.from_dict(status.get("launched", {}))
    return record(local_dir, landing.ledger, dataclasses.replace(
        launched, run_dir=str(local_dir), staging=staging,
        model_dir=str((local_dir / names.MODEL).resolve()) if fetched else ""))


def run(request: RunRequest, head_spec: Head, ledger_path: Path, cb: Callbacks) -> RunResult:
    """The whole remote run; the result as appended to this machine's ledger."""
    started = time.monotonic()
    local_dir = Path(request.train.output_dir)
    if isinstance(request.payload, Script):
        script_remote.check(request.payload)  # before connecting
    with Remote(head_spec.target, KnownHosts(head_spec.known_hosts)) as head:
        staged = stage_run(head, request, head_spec, cb.on_line, started)
        # From the home folder: Hydra starts every rank in the launcher's folder, which must exist
        # on all nodes.
        command = f"cd && exec {agent_command(staged.python, staged.pythonpath)}"
        try:
            status = follow(head, command, staged.job, cb)
        finally:
            fetch_files(head, staged.run_dir, local_dir, fetched_folders(request))
        fetch = head_spec.fetch_model and not isinstance(request.payload, Script)
        landing = Landing(staged.run_dir, local_dir.resolve(), fetch, staged.staging, ledger_path)
        return conclude(head, landing, status, cb.on_line)
