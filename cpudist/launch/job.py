"""A job from options to ledger: check inputs, plan, launch, collect the result."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from cpudist.cpu import read_cpu
from cpudist.errors import BadInput, JobFailed
from cpudist.hosts.hostfile import local_hosts
from cpudist.launch import runner
from cpudist.launch.plan import Launch, RunSpec
from cpudist.launch.tools import free_port, resolve_launcher
from cpudist.results import ledger
from cpudist.results.schema import RunResult
from cpudist.train.config import TrainConfig
from cpudist.train.models import is_local_model, resolve_model, tokenizer_source

HUB_PROBE_TIMEOUT_S = 5.0


def default_output_dir(cfg: TrainConfig, np: int) -> str:
    """runs/<task>-<model>-np<N>-<time>: one folder per run, never overwritten."""
    model = Path(cfg.model).name or cfg.model.replace("/", "-")
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    return str(Path("runs") / f"{cfg.task}-{model}-np{np}-{stamp}")


def check_hub(what: str) -> None:
    """Fail at once, naming the local alternatives, when the Hub cannot be reached."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        urllib.request.urlopen(f"{endpoint}/api/models/bert-base-uncased", timeout=HUB_PROBE_TIMEOUT_S)
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise BadInput(f"the Hugging Face Hub is unreachable ({reason}) and {what} comes from it",
                       "Use local sources: --data-dir DIR (GLUE TSV layout) or --train-file, and "
                       "--model with a local folder or a preset (tiny, minilm-l6, bert-base, ...)") from None


def preflight(cfg: TrainConfig) -> bool:
    """Check model and data before any rank starts; True when every source is local."""
    from cpudist.train.__main__ import load_task  # parsing only: cheap, and errors are one line

    resolve_model(cfg.model)
    if cfg.backend == "ccl" and importlib.util.find_spec("oneccl_bindings_for_pytorch") is None:
        raise BadInput("backend 'ccl' needs oneccl_bindings_for_pytorch, which is not installed",
                       "Install Intel's torch-ccl wheel matching your torch, or use --backend gloo")
    data_local = cfg.task == "synthetic" or bool(cfg.data_dir or cfg.train_file or cfg.task == "custom")
    if data_local and cfg.task != "synthetic":
        load_task(cfg)
    model_local = is_local_model(cfg.model) and (
        cfg.task == "synthetic" or Path(tokenizer_source(cfg.model, cfg.tokenizer)).exists())
    if data_local and model_local:
        return True
    if os.environ.get("HF_HUB_OFFLINE") != "1":  # offline mode: the user relies on the Hub cache
        remote = [what for what, ok in (("the data", data_local), ("the model", model_local)) if not ok]
        check_hub(" and ".join(remote))
    return False


def prepare(cfg: TrainConfig, np: int, ppn: int, launcher: str,
            env_overrides: tuple[tuple[str, str], ...], oversubscribe: bool) -> RunSpec:
    """A checked RunSpec for this machine as the cluster."""
    hub_offline = preflight(cfg)
    cpu = read_cpu()
    name, path = resolve_launcher(launcher)
    return RunSpec(train=cfg, np=np, ppn=ppn, hosts=local_hosts(cpu.logical_cpus), launcher=name,
                   launcher_path=path, python=sys.executable, master_addr="127.0.0.1",
                   master_port=free_port(), physical_cores=cpu.physical_cores,
                   hub_offline=hub_offline, env_overrides=env_overrides, oversubscribe=oversubscribe)


@dataclass(frozen=True)
class Callbacks:
    """Where a running job reports: events (progress) and rank output lines."""

    on_event: Callable[[dict[str, Any]], None]
    on_line: Callable[[str], None]


def run_job(spec: RunSpec, launch: Launch, ledger_path: Path, cb: Callbacks,
            timeout_s: float | None) -> RunResult:
    """Launch the ranks, wait, then record the result in the run folder and the ledger."""
    out = Path(spec.train.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "command.txt").write_text(launch.shell() + "\n")
    outcome = runner.execute(launch, os.environ, cb.on_event, cb.on_line, timeout_s)
    if outcome.timed_out:
        raise JobFailed(f"the job ran past --timeout {timeout_s:g}s and was stopped",
                        "Raise --timeout, or lower --max-steps/--epochs")
    if outcome.returncode != 0:
        last = next((line for line in reversed(outcome.last_lines) if "error" in line.lower()), None)
        detail = f": {last}" if last else ""
        raise JobFailed(f"the job failed (launcher exit code {outcome.returncode}){detail}",
                        "See the rank output above; the first failing rank is named in it")
    result_file = out / "result.json"
    if not result_file.is_file():
        raise JobFailed(f"the job ended without writing {result_file}", "See the rank output above")
    result = ledger.read_result(result_file).with_updates(launcher=spec.launcher)
    result_file.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    ledger.append(ledger_path, result)
    return result
