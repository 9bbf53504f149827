"""Dataclasses of more than MAX_POSITIONAL fields are built by keyword only (`kw_only=True`): a call
that lists a dozen values in order reads as nothing and breaks silently when a field moves.

Read from every module's source with ast, as tests/unit/test_layers.py reads the imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

import cpudist

PACKAGE = Path(cpudist.__file__).resolve().parent
MAX_POSITIONAL = 5


def positional_dataclasses(source: str) -> list[tuple[str, int]]:
    """(name, fields) of each dataclass in `source` with more than MAX_POSITIONAL init fields that
    may still be built positionally."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        decorators = [ast.unparse(d) for d in node.decorator_list]
        if not any(d == "dataclass" or d.startswith("dataclass(") for d in decorators):
            continue
        fields = [s for s in node.body if isinstance(s, ast.AnnAssign)
                  and "ClassVar" not in ast.unparse(s.annotation)
                  and "init=False" not in (ast.unparse(s.value) if s.value else "")]
        if len(fields) > MAX_POSITIONAL and not any("kw_only=True" in d for d in decorators):
            found.append((node.name, len(fields)))
    return found


def test_wide_dataclasses_are_keyword_only() -> None:
    wide = [f"{path.relative_to(PACKAGE)}: {name} ({n} fields)"
            for path in sorted(PACKAGE.rglob("*.py"))
            for name, n in positional_dataclasses(path.read_text())]
    assert wide == []


def test_the_check_catches_a_wide_positional_dataclass() -> None:
    six = "\n".join(f"    f{i}: int = 0" for i in range(6))
    five = "\n".join(f"    f{i}: int = 0" for i in range(5))
    assert positional_dataclasses(f"@dataclass(frozen=True)\nclass Wide:\n{six}\n") == [("Wide", 6)]
    assert positional_dataclasses(f"@dataclass(kw_only=True)\nclass Wide:\n{six}\n") == []
    assert positional_dataclasses(f"@dataclass\nclass Narrow:\n{five}\n") == []
