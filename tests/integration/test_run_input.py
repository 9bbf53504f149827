"""`cpudist run --env` secrets and bad input, end to end on this machine: a real launcher and real
ranks (issue 23)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from tests.integration.helpers import cpudist

pytestmark = pytest.mark.slow

SECRET = "hunter2-s3cret"
# Python imports sitecustomize at start: the rank writes the value it got and every ancestor's
# command line
SPY = """import os
if "CPUDIST_T_SECRET" in os.environ:
    lines, pid = [], os.getpid()
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            lines.append(f.read().replace(b"\\0", b" ").decode(errors="replace"))
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    with open(os.path.join(os.environ["CPUDIST_T_SPY_DIR"], f"seen-{os.getpid()}.json"), "w") as f:
        import json
        json.dump({"secret": os.environ["CPUDIST_T_SECRET"], "cmdlines": lines}, f)
"""


def test_env_values_reach_the_ranks_off_every_command_line(shared_data: Path,
                                                           tmp_path: Path) -> None:
    spy = tmp_path / "spy"
    spy.mkdir()
    (spy / "sitecustomize.py").write_text(SPY)
    run = tmp_path / "RUN"
    r = cpudist("run", "mrpc", "--data-dir", shared_data / "glue" / "MRPC", "--model", "tiny",
                "--max-steps", "1", "--max-train-samples", "32", "--max-eval-samples", "16",
                "--save-model", "none", "--quiet", "--output-dir", run, "--env",
                f"PYTHONPATH={spy}", "--env", f"CPUDIST_T_SPY_DIR={spy}", "--env",
                f"CPUDIST_T_SECRET={SECRET}", timeout=120)
    assert r.returncode == 0, r.stderr
    # --quiet: no ready line, no bar, no notes
    assert r.stderr == "" and r.stdout.startswith("done: mrpc tiny")
    assert "ready:" in (run / "ranks.log").read_text()  # (the rank output is kept)
    seen = [json.loads(p.read_text()) for p in spy.glob("seen-*.json")]
    assert seen and all(s["secret"] == SECRET for s in seen)  # the rank got the value...
    ranks = [s for s in seen if any("cpudist.rank" in c for c in s["cmdlines"])]
    # (the launcher is among its ancestors)
    assert ranks and any("mpiexec" in c for c in ranks[0]["cmdlines"])
    # ...and no command line between `cpudist run` (where the user typed it) and the rank held it
    for s in seen:
        launched = s["cmdlines"][: next(i for i, c in enumerate(s["cmdlines"])
                                        if "cpudist.cli run" in c)]
        assert launched and all(SECRET not in c for c in launched), launched
    command = run / "command.txt"
    assert stat.S_IMODE(command.stat().st_mode) == 0o600 and SECRET not in command.read_text()
    for name in ("run.json", "result.json", "cpudist.log", "ranks.log"):
        assert SECRET not in (run / name).read_text(), name
    assert "CPUDIST_T_SECRET=***" in json.loads((run / "result.json").read_text())["command"]


def test_dry_run_shows_env_names_not_values(shared_data: Path, tmp_path: Path) -> None:
    r = cpudist("run", "mrpc", "--data-dir", shared_data / "glue" / "MRPC", "--model", "tiny",
                "--dry-run", "--output-dir", tmp_path / "RUN", "--env", f"HF_TOKEN={SECRET}",
                "--env", "OMP_NUM_THREADS=1", timeout=60)
    assert r.returncode == 0, r.stderr
    assert "export HF_TOKEN=***" in r.stdout and "export OMP_NUM_THREADS=1" in r.stdout
    assert SECRET not in r.stdout + r.stderr
    # through a head: the request it would send (no ssh)
    (tmp_path / "hosts").write_text("10.1.0.1\n10.1.0.2\n")
    remote = cpudist("run", "mrpc", "--data-dir", shared_data / "glue" / "MRPC", "--model", "tiny",
                     "--dry-run", "--head", "10.9.9.9", "--hostfile", tmp_path / "hosts", "--np",
                     "2", "--ppn", "1", "--env", f"HF_TOKEN={SECRET}", timeout=60)
    assert remote.returncode == 0, remote.stderr
    assert '["HF_TOKEN", "***"]' in remote.stdout and SECRET not in remote.stdout + remote.stderr


def test_bad_input_is_one_line_before_any_rank(shared_data: Path, tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    ledger = tmp_path / "ledger-folder"
    ledger.mkdir()
    base: list[str | Path] = ["run", "mrpc", "--data-dir", shared_data / "glue" / "MRPC", "--model",
                              "tiny", "--max-steps", "2"]
    cases: tuple[tuple[list[str | Path], str],
                 ...] = ((["--output-dir", tmp_path / "afile"], "is a file"),
                        (["--output-dir", tmp_path / "R1", "--ledger", ledger], "is a folder"),
                        (["--output-dir", tmp_path / "R2", "--env", "OMP_NUM_THREADS=zero"],
                         "positive number"))
    for extra, said in cases:
        r = cpudist(*base, *extra, timeout=60)
        assert r.returncode == 2 and said in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
        assert not list(tmp_path.glob("R*/ranks.log"))  # no rank started


def test_quiet_shows_the_failing_ranks_lines(shared_data: Path, tmp_path: Path) -> None:
    """--quiet (its success: above) and a failed job: the rank lines its error points at, then the
    error."""
    spy = tmp_path / "spy"
    spy.mkdir()
    (spy / "sitecustomize.py").write_text("import os, sys\nif os.environ.get('CPUDIST_T_FAIL'):\n"
                                          "    print('rank says: boom', file=sys.stderr, "
                                          "flush=True)\n"
                                          "    os._exit(3)\n")
    bad = cpudist("run", "mrpc", "--data-dir", shared_data / "glue" / "MRPC", "--model", "tiny",
                  "--max-steps", "1", "--quiet", "--output-dir", tmp_path / "BAD", "--env",
                  f"PYTHONPATH={spy}", "--env", "CPUDIST_T_FAIL=1", timeout=120)
    assert bad.returncode == 1
    lines = bad.stderr.strip().splitlines()
    assert "rank says: boom" in bad.stderr and lines[-1].startswith(
        "Error: the job failed"), bad.stderr
