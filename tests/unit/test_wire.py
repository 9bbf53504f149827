"""The rank<->launcher contract is spelled once, in cpudist/wire/: outside it no module spells an
exit code of the contract, an event line, a rank's error line, a run folder's file name or a
node-side program's module; and wire/ imports nothing of cpudist but itself. Read with ast, so
docstrings and comments may name them."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import cpudist
from cpudist.wire import events, exits, names, programs, rank_errors

PACKAGE = Path(cpudist.__file__).resolve().parent
EXIT_CODES = {exits.PREEMPTED, exits.INTERRUPTED}  # 0, 1 and 2 are every program's
FILE_NAMES = (names.RUN, names.RESULT, names.STEPS, names.RANKS_LOG, names.LOG, names.COMMAND)
# Files another change holds today; each entry: (file, the literal it still spells).
ALLOWED = {
    ("launch/spec.py", programs.RANK),
    ("launch/tether.py",
     "usage: python -m cpudist.launch.tether [--from-secrets NAME,...] -- COMMAND [ARGS...]\n"),
}


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node,
                      (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef,
                       ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _why(value: object) -> str | None:
    """What a literal spells of the contract, or None."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return None
    if isinstance(value, int):
        return "an exit code (wire/exits.py)" if value in EXIT_CODES else None
    if value == events.KEY or value.startswith(events.MARKER):
        return "an event line (wire/events.py)"
    if "] error: " in value or rank_errors.LOST_PEER in value:
        return "a rank's error line (wire/rank_errors.py)"
    if any(value in (n, f"/{n}", names.aside(n)) or value.endswith(f"/{n}") for n in FILE_NAMES):
        return "a run folder's file name (wire/names.py)"
    if value in programs.PROGRAMS or "-m cpudist." in value:
        return "a node-side program (wire/programs.py)"
    return None


def spellings(root: Path = PACKAGE) -> Iterator[str]:
    """'file:line: literal: what it spells' for every literal of the contract outside wire/."""
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("wire/"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "emit"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                yield (f"{rel}:{node.lineno}: emit({node.args[0].value!r}): an event name "
                       "(wire/events.py)")
            if (not isinstance(node, ast.Constant) or id(node) in skip
                    or (rel, node.value) in ALLOWED):
                continue
            if (why := _why(node.value)) is not None:
                yield f"{rel}:{node.lineno}: {node.value!r}: {why}"


def test_the_contract_is_spelled_once() -> None:
    assert list(spellings()) == []


def test_every_allowance_is_still_needed() -> None:
    """A file that no longer spells its allowed literal leaves ALLOWED."""
    for rel, literal in ALLOWED:
        tree = ast.parse((PACKAGE / rel).read_text())
        assert any(isinstance(n, ast.Constant) and n.value == literal
                   for n in ast.walk(tree)), (rel, literal)


def test_wire_imports_nothing_of_cpudist_but_itself() -> None:
    for path in sorted((PACKAGE / "wire").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
                       else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for module in modules:
                assert not module.startswith("cpudist") or module.startswith("cpudist.wire"), (
                    path.name, module)


@pytest.mark.parametrize(("text", "expected"), [
    ("sys.exit(75)\n", "x.py:1: 75: an exit code (wire/exits.py)"),
    ("events.emit('progress', step=1)\n",
     "x.py:1: emit('progress'): an event name (wire/events.py)"),
    ("kind = event.get('event')\n", "x.py:1: 'event': an event line (wire/events.py)"),
    ("line = f'[{h}:{r}] error: {m}'\n",
     "x.py:1: '] error: ': a rank's error line (wire/rank_errors.py)"),
    ("path = out / 'result.json'\n",
     "x.py:1: 'result.json': a run folder's file name (wire/names.py)"),
    ("path = f'{out}/ranks.log'\n",
     "x.py:1: '/ranks.log': a run folder's file name (wire/names.py)"),
    ("argv = ['python', '-m', 'cpudist.rank']\n",
     "x.py:1: 'cpudist.rank': a node-side program (wire/programs.py)"),
    ('"""Writes result.json with exit code 75."""\n', None),
])
def test_a_scratch_spelling_is_caught(tmp_path: Path, text: str, expected: str | None) -> None:
    (tmp_path / "x.py").write_text(text)
    assert list(spellings(tmp_path)) == ([expected] if expected else [])


def test_a_rank_error_line_is_read_back() -> None:
    own = rank_errors.error_line("node1", 3, "out of memory")
    peer = rank_errors.lost_peer_line("node0", 0, "Connection reset by peer")
    assert own == "[node1:3] error: out of memory\n"
    assert [rank_errors.host_of(line) for line in (own, peer, "[node2] error: x", "ordinary")] == [
        "node1", "node0", "node2", None]
    assert rank_errors.is_lost_peer(peer) and not rank_errors.is_lost_peer(own)
    assert rank_errors.error_line("node2", None, "bad") == "[node2] error: bad\n"


def test_an_event_line_round_trips() -> None:
    line = events.line(events.PROGRESS, step=3)
    assert events.parse("[vm:0] " + line) == {"event": "progress", "step": 3}
    assert events.kind(events.parse(events.relay({"event": "x"})) or {}) == "x"
