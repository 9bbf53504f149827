"""The package's layering (docs: the Layers of issue #21's spine), read from every module's imports
with ast.

    cli, rank (entry points) -> run, predict -> launch | hosts | cloud -> ssh -> train -> leaves

Imports point down this list (lazy imports inside functions count too); hosts/ may also use launch/;
cloud/ imports neither ssh/ nor hosts/ (its caller passes SSH in, cpudist/cloud/access.py); leaves
import only leaves; launch/ and cloud/ take nothing from train/ (what they share with the ranks is a
leaf); no module over 300 lines; no cycle between top-level folders. A new folder or leaf must be
placed in LAYER. The imports in KNOWN break these rules today; each says why, and one that is fixed
must leave the list.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import cpudist

PACKAGE = Path(cpudist.__file__).resolve().parent
LEAVES = ("errors", "state", "cpu", "hostfile", "traffic", "flops", "interrupts", "validate",
          "waits", "results", "config", "objects", "slurm_counts", "strategies", "sync_flags",
          "elastic_flags", "secrets", "wire")
LAYER = {"cli": 1, "rank": 1, "run": 2, "predict": 2, "launch": 3, "hosts": 3, "cloud": 3, "ssh": 4,
         "train": 5, **dict.fromkeys(LEAVES, 6)}
SIBLINGS = {("hosts", "launch")}  # node tools (bench) run a launch
# below cloud/ in the list, kept out all the same
FORBIDDEN = {("cloud", "ssh"), ("cloud", "hosts")}
# Issue #21: nothing from train/ into launch/ or cloud/. What both sides read (the ranks' config and
# command line, the event lines, Slurm's count lists, the object store interface) are leaves.
NOT_FROM_TRAIN = ("launch", "cloud")
# Issue #21: cli/ and run/ reach a cloud through its verbs (cloud/provider.py, cloud/connect.py),
# never a provider's own folder: a second cloud is then one folder beside cloud/aws.
PROVIDER_FOLDERS = ("cloud.aws",)
NOT_INTO_PROVIDERS = ("cli", "run")
MAX_LINES = 300
# Imports known to break the layers, each with why it is not fixed yet; a fixed one must leave this
# list.
KNOWN: set[str] = set()


def _modules(root: Path) -> Iterator[tuple[str, Path]]:
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        yield ".".join((root.name, *parts)), path


def _imports(name: str, path: Path, root: Path) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import of the package in a module, lazy ones included."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((a.name, node.lineno) for a in node.names
                        if a.name.split(".")[0] == root.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[:len(package.split(".")) - node.level + 1],
                                 *filter(None, [base])])
            if base.split(".")[0] != root.name:
                continue
            targets = set()
            # `from cpudist import cluster` names a module; `from x import y` may too
            for a in node.names:
                sub = root.parent / f"{base}.{a.name}".replace(".", "/")
                targets.add(f"{base}.{a.name}" if sub.with_suffix(".py").is_file() or sub.is_dir()
                            else base)
            yield from ((t, node.lineno) for t in sorted(targets))


def _top(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None  # None: the package itself (__version__)


def violations(root: Path = PACKAGE, known: set[str] | None = None,
               known_seen: set[str] | None = None) -> list[str]:
    """Every import that breaks the layering, as 'file:line: what', less the `known` ones (noted in
    `known_seen`)."""
    found: list[str] = []
    known_seen = set() if known_seen is None else known_seen
    for name, path in _modules(root):
        src = _top(name)
        if src is None:
            continue
        if src not in LAYER:
            if not any(f.startswith(f"{root.name}/{src}") for f in found):
                found.append(f"{root.name}/{src}: no place in LAYER")
            continue
        for target, line in _imports(name, path, root):
            dst = _top(target)
            if dst is None or dst == src:
                continue
            where = f"{path.relative_to(root.parent)}:{line}: {src} -> {target}"
            if known is not None and f"{path.relative_to(root.parent)} -> {target}" in known:
                known_seen.add(f"{path.relative_to(root.parent)} -> {target}")
                continue
            if dst not in LAYER:
                found.append(f"{where} ({dst} has no place in LAYER)")
            elif (src, dst) in FORBIDDEN:
                found.append(f"{where} (forbidden: {src}/ gets it from its caller)")
            elif LAYER[dst] < LAYER[src] or (LAYER[dst] == LAYER[src] and LAYER[src] != 6
                                              and (src, dst) not in SIBLINGS):
                found.append(f"{where} (points up or sideways)")
            elif dst == "train" and src in NOT_FROM_TRAIN:
                found.append(f"{where} ({src}/ takes nothing from train/: a shared part is a leaf)")
            elif src in NOT_INTO_PROVIDERS and any(target.startswith(f"{root.name}.{p}")
                                                   for p in PROVIDER_FOLDERS):
                found.append(f"{where} ({src}/ reaches a cloud through cloud/provider.py's verbs "
                             "only)")
    return found


def long_modules(root: Path = PACKAGE) -> list[str]:
    return [f"{p.relative_to(root.parent)}: {n} lines" for _, p in _modules(root)
            if (n := len(p.read_text().splitlines())) > MAX_LINES]


def folder_cycle(root: Path = PACKAGE, known: set[str] | None = None) -> list[str] | None:
    """A cycle between top-level folders or modules (as the list of its names), or None; `known`
    imports left out."""
    edges: dict[str, set[str]] = {}
    for name, path in _modules(root):
        src = _top(name)
        for target, _ in _imports(name, path, root):
            dst = _top(target)
            if f"{path.relative_to(root.parent)} -> {target}" in (known or set()):
                continue
            if src and dst and dst != src:
                edges.setdefault(src, set()).add(dst)
    state: dict[str, int] = {}  # 1 on the path, 2 done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt] if nxt in path else [*path, nxt]
            if nxt not in state and (cycle := visit(nxt, [*path, nxt])):
                return cycle
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (cycle := visit(start, [start])):
            return cycle
    return None


def test_imports_follow_the_layers() -> None:
    seen: set[str] = set()
    assert violations(known=KNOWN, known_seen=seen) == []
    assert seen == KNOWN, f"fixed, so take them out of KNOWN: {sorted(KNOWN - seen)}"


def test_no_module_over_300_lines() -> None:
    assert long_modules() == []


def test_no_cycle_between_folders() -> None:
    assert folder_cycle(known=KNOWN) is None


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "cpudist"
    for rel, text in {"__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    for folder in {p.parent for p in root.rglob("*.py")}:
        (folder / "__init__.py").touch()
    return root


@pytest.mark.parametrize(("files", "expected"), [
    ({"train/loop.py": "def f():\n    from cpudist.launch import runner\n", "launch/runner.py": ""},
     "cpudist/train/loop.py:2: train -> cpudist.launch.runner (points up or sideways)"),
    ({"cloud/up.py": "from cpudist.ssh.client import Remote\n", "ssh/client.py": ""},
     "cpudist/cloud/up.py:1: cloud -> cpudist.ssh.client (forbidden: cloud/ gets it from its "
     "caller)"),
    ({"cloud/up.py": "from cpudist import hosts\n", "hosts/doctor.py": ""},
     "cpudist/cloud/up.py:1: cloud -> cpudist.hosts (forbidden: cloud/ gets it from its caller)"),
    ({"errors.py": "from cpudist.train.models import PRESETS\n", "train/models.py": ""},
     "cpudist/errors.py:1: errors -> cpudist.train.models (points up or sideways)"),
    ({"launch/env.py": "from cpudist.train.loop import train\n", "train/loop.py": ""},
     "cpudist/launch/env.py:1: launch -> cpudist.train.loop (launch/ takes nothing from train/: a "
     "shared part is a leaf)"),
    ({"cloud/aws/objects.py": "from cpudist.train.durable import Mirror\n", "train/durable.py": ""},
     "cpudist/cloud/aws/objects.py:1: cloud -> cpudist.train.durable (cloud/ takes nothing from "
     "train/: a shared part is a leaf)"),
    ({"launch/env.py": "from ..cloud.aws import client\n", "cloud/aws/client.py": ""},
     "cpudist/launch/env.py:1: launch -> cpudist.cloud.aws.client (points up or sideways)"),
    ({"gadgets/x.py": "", "gadgets/y.py": ""}, "cpudist/gadgets: no place in LAYER"),
    ({"cli/cluster.py": "from cpudist.cloud.aws.client import ec2_client\n",
      "cloud/aws/client.py": ""},
     "cpudist/cli/cluster.py:1: cli -> cpudist.cloud.aws.client (cli/ reaches a cloud through "
     "cloud/provider.py's verbs only)"),
    ({"run/where.py": "def f():\n    from cpudist.cloud.aws import client\n",
      "cloud/aws/client.py": ""},
     "cpudist/run/where.py:2: run -> cpudist.cloud.aws.client (run/ reaches a cloud through "
     "cloud/provider.py's verbs only)"),
])
def test_a_scratch_violation_is_caught(tmp_path: Path, files: dict[str, str],
                                       expected: str) -> None:
    assert violations(_package(tmp_path, files)) == [expected]


def test_scratch_cycle_and_length_are_caught(tmp_path: Path) -> None:
    root = _package(tmp_path, {"hosts/bench.py": "from cpudist.launch import kinds\n",
                               "launch/kinds.py": "import cpudist.hosts.bench\n" + "x = 1\n" * 300})
    assert folder_cycle(root) == ["hosts", "launch", "hosts"]
    assert long_modules(root) == ["cpudist/launch/kinds.py: 301 lines"]
    assert folder_cycle(_package(tmp_path / "fine",
                                 {"hosts/bench.py": "from cpudist.launch import kinds\n",
                                  "launch/kinds.py": ""})) is None
