"""One launch path for every payload, and a launcher kind as one object, read from the code with
ast:

- run/ and cli/ name no scheduler: what differs between launchers is asked of their kind
  (launch/kind.py), its flags included, so a new scheduler is one module and one row of
  launch/kinds.KINDS;
- every payload crosses to a head in the one request, read by the one agent (no second agent
  program);
- the probe of `cpudist hosts bench` gets its launch spec from the same resolve as a training run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from click.testing import CliRunner

import cpudist
from cpudist.cli.main import cli
from cpudist.config import TrainConfig
from cpudist.errors import BadInput
from cpudist.launch import kinds
from cpudist.launch.kind import Batch, Direct
from cpudist.run.request import LaunchOptions, RunRequest
from cpudist.wire import programs
from cpudist.wire.payload import Probe, Script, Trainer

PACKAGE = Path(cpudist.__file__).resolve().parent


def _code_words(path: Path) -> list[tuple[int, str]]:
    """(line, word) of every name, attribute, import and string literal but docstrings."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, ast.Module | ast.FunctionDef | ast.ClassDef) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            found.append((node.lineno, node.value))
        elif isinstance(node, ast.Name):
            found.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute):
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.ImportFrom):
            found.extend((node.lineno, f"{node.module}.{a.name}") for a in node.names)
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names)
    return found


@pytest.mark.parametrize("room", ["run", "cli"])
def test_run_and_cli_name_no_scheduler(room: str) -> None:
    said = [f"{path.relative_to(PACKAGE)}:{line}: {word!r}"
            for path in sorted((PACKAGE / room).rglob("*.py"))
            for line, word in _code_words(path) if "slurm" in word.lower()]
    assert said == []


def test_a_schedulers_flags_are_its_kinds_and_fill_its_options(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every flag a scheduler kind declares reaches the batch script through `cpudist run`; `launch`
    (a user's script, which does not checkpoint) is offered only those that are not the
    trainer's."""
    monkeypatch.chdir(tmp_path)
    for name in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        monkeypatch.delenv(name, raising=False)
    runner = CliRunner()
    given = ["--partition", "cpu", "--time", "30", "--account", "proj", "--exclusive",
             "--sbatch-arg=--mem=0", "--requeue", "--requeue-signal", "90"]
    out = runner.invoke(cli,
                        ["run", "synthetic", "--model", "tiny", "--launcher", "slurm", "--nodes",
                         "2", "--ppn", "1", *given, "--dry-run"])
    assert out.exit_code == 0, out.output
    for line in ("--partition=cpu", "--time=30", "--account=proj", "--exclusive", "--mem=0",
                 "--signal=B:USR1@90", "--requeue"):
        assert f"#SBATCH {line}\n" in out.output, line
    flags = [f.name for kind in kinds.batches() for f in kind.flags]
    assert set(flags) >= {"--partition", "--requeue"} and len(flags) == len(set(flags))
    helped = runner.invoke(cli, ["run", "--help"]).output
    assert "Slurm (--launcher slurm)" in helped and "--requeue-signal" in helped
    refused = runner.invoke(cli,
                            ["launch", "--launcher", "slurm", "--requeue", "--dry-run", "--",
                             "true"])
    assert refused.exit_code == 2 and "--requeue: not an option of cpudist launch" in refused.output


def test_every_kind_is_one_object_and_the_scheduler_is_a_batch_kind() -> None:
    for name, kind in kinds.KINDS.items():
        assert kind.name == name and callable(kind.build) and callable(kind.execute) and callable(
            kind.placed)
        assert kind.scheduled == (not isinstance(kind, Direct))
    batch = [name for name, kind in kinds.KINDS.items() if kind.scheduled]
    assert batch == ["slurm"] and kinds.batch_of("slurm") is kinds.KINDS["slurm"]
    assert all(hasattr(kinds.batch_of(n), m) for n in batch for m in Batch.__dict__
               if not m.startswith("_"))
    with pytest.raises(BadInput, match="--detach has nothing to leave running"):
        kinds.batch_of("torchrun")


@pytest.mark.parametrize("payload",
                         [Trainer(),
                          Script(command=("train.py", "--lr", "1"), collect=("out",), per_node=2),
                          Probe(sizes=(4096,), iters=3)])
def test_the_one_agent_reads_every_payload(payload: Trainer | Script | Probe) -> None:
    request = RunRequest(train=TrainConfig(task="mrpc", output_dir="/h/runs/r"),
                         launch=LaunchOptions(np=2, ppn=1), payload=payload)
    back = RunRequest.from_json(request.to_json())
    assert back == request and type(back.payload) is type(payload)
    assert not [p for p in programs.PROGRAMS if p.endswith("agent") and p != programs.AGENT]


def test_a_payload_names_its_rank_program() -> None:
    assert Trainer().program("/r") == ()  # the trainer: the rank module with the config's argv
    assert Script(command=("train.py",), per_node=2).program("/r")[:2] == (programs.SCRIPT_RANK,
                                                                   "--run-dir")
    assert Probe(sizes=(8,), iters=2, warmup=1).program("/r") == (
        programs.BENCH_RANK, "--sizes", "8", "--iters", "2", "--warmup", "1", "--timeout", "120")
