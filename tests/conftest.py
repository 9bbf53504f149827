"""Shared fixtures: where the shared GLUE and emotion data live (beside the repository)."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA} (it lies beside the repository in CI)")
    return SHARED_DATA


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test gets its own ledger, never the user's ~/.cpudist."""
    monkeypatch.setenv("CPUDIST_HOME", str(tmp_path / "cpudist-home"))
