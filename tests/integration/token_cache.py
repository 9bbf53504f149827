"""One token cache for the runs of a test module, each test keeping its own CPUDIST_HOME (ledger, runs, state).

Every rank tokenizes its rows unless its node's cache holds them (cpudist/train/token_cache.py), and each test's
home starts empty (tests/conftest.py), so a module of runs on the same rows tokenized them again in every rank of
every run. A module that links each test's cache folder to one of its own tokenizes them once. The cache's own
behaviour (a miss, then a hit) is checked where nothing is linked: test_run_local.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cpudist import state


def share_token_cache(shared: Path) -> None:
    """Link this test's $CPUDIST_HOME/cache/tokens to `shared` (call it after tests/conftest.py set the home)."""
    here = state.token_cache_dir()
    assert Path(os.environ["CPUDIST_HOME"]) in here.parents, here
    here.parent.mkdir(parents=True, exist_ok=True)
    here.symlink_to(shared, target_is_directory=True)


@pytest.fixture(scope="module")
def module_tokens(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The module's one token cache folder."""
    return tmp_path_factory.mktemp("tokens")


@pytest.fixture
def one_token_cache(_isolated_home: None, module_tokens: Path) -> None:
    """MRPC tokenized once for the module's runs: a module imports this fixture and `module_tokens`, then uses it
    (`pytest.mark.usefixtures("one_token_cache")`)."""
    share_token_cache(module_tokens)
