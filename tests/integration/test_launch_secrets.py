"""`cpudist launch --secret NAME --env-file FILE` (cpudist/secrets.py, as `cpudist run`'s): the
values reach the script's environment through the node's 0600 file that the rank wrapper reads
first, and are in no launcher line, command.txt, run.json, log or dry run (a value the script prints
shows as ***); the file is gone when the run ends. One rank: the rank count does not matter here (a
run from the laptop is checked in test_launch_script_remote.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from cpudist.cli.main import cli
from tests.integration.helpers import cpudist

pytestmark = pytest.mark.slow
# what the rank's environment must hold, and nothing shown
TOKEN, KEY = "hf-tok-51c0ffee", "wandb-key-9d2b77"
SCRIPT = '''
import hashlib, os
for name in ("HF_TOKEN", "WANDB_API_KEY"):
    print(name, hashlib.sha256(os.environ.get(name, "").encode()).hexdigest(), flush=True)
# as a careless script
print("printed", os.environ.get("HF_TOKEN"), os.environ.get("WANDB_API_KEY"), flush=True)
'''


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def test_secrets_reach_the_scripts_environment_and_nothing_shown(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "show.py").write_text(SCRIPT)
    (tmp_path / "wandb.env").write_text(f"export WANDB_API_KEY='{KEY}'\n")
    home = tmp_path / "home"
    out = tmp_path / "run"
    args = ["launch", "--np", "1", "--secret", "HF_TOKEN", "--env-file",
            str(tmp_path / "wandb.env"), "--output-dir", str(out), "--ledger",
            str(tmp_path / "ledger.jsonl"), "--workdir", str(tmp_path), "--", "python", "show.py"]
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    dry = CliRunner().invoke(cli, [*args[:-3], "--dry-run", *args[-3:]])
    assert dry.exit_code == 0, dry.output
    assert ("CPUDIST_SECRETS" in dry.output and TOKEN not in dry.output
            and KEY not in dry.output), dry.output
    r = cpudist(*args, env={"HF_TOKEN": TOKEN, "HOME": str(home)}, timeout=240)
    assert r.returncode == 0, r.stderr
    assert (f"HF_TOKEN {digest(TOKEN)}" in r.stderr
            and f"WANDB_API_KEY {digest(KEY)}" in r.stderr), r.stderr
    shown = [r.stdout, r.stderr, *(p.read_text() for p in out.iterdir() if p.is_file()),
             (tmp_path / "ledger.jsonl").read_text()]
    # the file's path is what the launcher passes
    assert "CPUDIST_SECRETS" in (out / "command.txt").read_text()
    # what the script printed of them reaches the terminal and the logs masked
    assert "printed *** ***" in r.stderr and "printed *** ***" in (
        out / "ranks.log").read_text(), r.stderr
    assert not [text for text in shown if TOKEN in text or KEY in text]
    # the node's file went with the run
    assert list((home / ".cpudist" / "secrets").iterdir()) == []
