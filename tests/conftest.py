"""Shared fixtures: where the shared GLUE and emotion data live (beside the repository)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

# Property tests check results, not speed: hypothesis's 200 ms deadline failed a collate example on a
# busy 2-core machine, and CI machines differ in speed.
settings.register_profile("cpudist", deadline=None)
settings.load_profile("cpudist")

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
