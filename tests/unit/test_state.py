"""state.py is the one map of cpudist's files: every local path under CPUDIST_HOME (the same layout
as ever without it), node-side names relative to a node's home, and no other module of the package
spelling either."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable
from pathlib import Path

import pytest

import cpudist
from cpudist import state
from cpudist.hostfile import Host
from cpudist.ssh.setup import setup_plan

PACKAGE = Path(cpudist.__file__).parent


def local_paths() -> dict[str, Callable[[], Path]]:
    """Every public function of state.py that returns a path, found by signature (a new one is
    checked too)."""
    found: dict[str, Callable[[], Path]] = {}
    for name, fn in inspect.getmembers(state, inspect.isfunction):
        if name.startswith("_") or fn.__module__ != state.__name__ or inspect.signature(
            fn).return_annotation != "Path":
            continue
        params = list(inspect.signature(fn).parameters)
        if not params:
            found[name] = fn
        elif params == ["name"]:
            found[name] = lambda fn=fn: fn("team-a")
    return found


@pytest.fixture
def homes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(the login's home, CPUDIST_HOME): two unrelated folders."""
    monkeypatch.setenv("HOME", str(tmp_path / "login"))
    monkeypatch.setenv("CPUDIST_HOME", str(tmp_path / "elsewhere"))
    return tmp_path / "login", tmp_path / "elsewhere"


def test_every_local_path_follows_cpudist_home(homes: tuple[Path, Path]) -> None:
    login, elsewhere = homes
    paths = local_paths()
    assert {"home", "ledger_path", "bench_dir", "wheels_dir", "inductor_dir", "clusters_dir",
            "images_dir", "cluster_dir", "image_dir", "local_cluster_dir"} <= set(paths)
    for name, fn in paths.items():
        assert fn() == elsewhere or elsewhere in fn().parents, \
            f"state.{name}() is {fn()}, not under CPUDIST_HOME"
    plan = "\n".join(setup_plan([Host("n1")], None, None))  # what ssh-setup would write, and where
    assert f"# key: {elsewhere}/cluster/id_ed25519" in plan and str(login) not in plan


def test_without_cpudist_home_the_layout_is_the_one_users_have(
        homes: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    login, _ = homes
    monkeypatch.delenv("CPUDIST_HOME")
    dot = login / ".cpudist"
    assert state.ledger_path() == dot / "results.jsonl" and state.bench_dir() == dot / "bench"
    assert state.cluster_dir(
        "team-a") == dot / "clusters" / "team-a" and state.clusters_dir() == dot / "clusters"
    assert state.image_dir(
        "team-a") == dot / "images" / "team-a" and state.wheels_dir() == dot / "wheels"
    assert state.inductor_dir() == dot / "inductor" and state.local_cluster_dir() == dot / "cluster"


def test_an_on_prem_key_made_before_cpudist_home_counted_is_still_found(
        homes: tuple[Path, Path]) -> None:
    """ssh-setup wrote ~/.cpudist/cluster whatever CPUDIST_HOME said (and installs it there on every
    node): a key only there is used, so re-running ssh-setup does not mint a second cluster key; one
    under CPUDIST_HOME wins."""
    login, elsewhere = homes
    assert state.local_cluster_dir() == elsewhere / "cluster"
    old = login / state.CLUSTER_DIR
    old.mkdir(parents=True)
    (old / "id_ed25519").write_text("old key")
    assert state.local_cluster_dir() == old
    (elsewhere / "cluster").mkdir(parents=True)
    (elsewhere / "cluster" / "id_ed25519").write_text("new key")
    assert state.local_cluster_dir() == elsewhere / "cluster"


def test_node_side_names_are_relative_to_a_nodes_home(homes: tuple[Path, Path]) -> None:
    for name in ("CLUSTER_DIR", "STAGE_DIR", "RUNS_DIR", "UPLOAD_DIR"):
        value = getattr(state, name)
        assert not value.is_absolute() and value.parts[0] == ".cpudist", (name, value)
    assert str(state.CLUSTER_DIR) == ".cpudist/cluster"  # what every node set up so far has


def _strings(tree: ast.AST) -> list[ast.Constant]:
    """String constants of a module, without docstrings and `help=` texts (they describe the
    default)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node,
                      (ast.Module, ast.ClassDef, ast.FunctionDef,
                       ast.AsyncFunctionDef)) and body and \
                isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            skip.add(id(body[0].value))
        if isinstance(node, ast.keyword) and node.arg == "help":
            skip |= {id(n) for n in ast.walk(node.value)}
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in skip]


def test_no_other_module_spells_a_state_path() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "state.py":
            continue
        source = path.read_text()
        tree = ast.parse(source)
        for node in _strings(tree):
            if ".cpudist" in node.value or "CPUDIST_HOME" in node.value:
                offenders.append(
                    f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {node.value!r}")
        # Path.home(): the login's home is state's to combine with a name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "home" \
                    and isinstance(node.value, ast.Name) and node.value.id == "Path":
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: Path.home()")
    assert offenders == [], "use cpudist.state for these:\n" + "\n".join(offenders)
