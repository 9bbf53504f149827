"""--report-to at the front door: the names it takes, what it refuses in one line, and its trip to
the ranks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cpudist.cli.main import cli
from cpudist.config import TrainConfig, from_argv, to_argv
from cpudist.errors import BadInput
from cpudist.train.report_to import parse_report_to

# Python's own way to make an installed package unimportable (importlib's find_spec then says None):
# the tensorboard of this environment stays installed, the process under test sees none.
WITHOUT_TENSORBOARD = "import sys; sys.modules['tensorboard'] = None; "


def test_names_parse_as_hf_report_to_does() -> None:
    assert parse_report_to("none") == () and parse_report_to(None) == ()
    assert parse_report_to("tensorboard") == ("tensorboard",)
    assert parse_report_to(" TensorBoard, tensorboard ,none") == ("tensorboard",)
    assert parse_report_to("mlflow, tensorboard") == ("mlflow", "tensorboard")
    with pytest.raises(BadInput,
                       match=r"--report-to wandb: unknown\. Use one of: tensorboard, mlflow, or "
                             r"none"):
        parse_report_to("tensorboard,wandb")


def test_the_ranks_receive_it() -> None:
    cfg = TrainConfig(task="mrpc", output_dir="run", report_to=("tensorboard",))
    assert "--report-to=tensorboard" in to_argv(cfg)
    assert from_argv(to_argv(cfg)).report_to == ("tensorboard",)
    assert not any(a.startswith("--report-to")
                   for a in to_argv(TrainConfig(task="mrpc", output_dir="run")))


@pytest.mark.parametrize(("args", "said"),
                         [(("--report-to", "bogus"), "--report-to bogus: unknown"),
                          (("--mlflow-uri", "http://x"), "--report-to does not name mlflow")])
def test_bad_names_are_one_line_exit_2(args: tuple[str, ...], said: str) -> None:
    out = subprocess.run([sys.executable, "-m", "cpudist.cli", "run", "mrpc", "--model", "tiny",
                          "--dry-run", *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert said in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "Traceback" not in out.stderr


def test_help_says_where_the_files_go() -> None:
    out = CliRunner().invoke(cli, ["run", "--help"], terminal_width=200)
    text = " ".join(out.output.split())
    assert ("--report-to TEXT" in text and "<run folder>/tensorboard/" in text
            and "cpudist[tensorboard]" in text)
    assert ("<run folder>/mlruns/" in text and "cpudist[mlflow]" in text
            and "--mlflow-uri TEXT" in text)


def test_missing_tensorboard_stops_the_launch_before_any_rank(tmp_path: Path,
                                                              shared_data: Path) -> None:
    """cpudist run's preflight (run/prepare.py) names the install in one line; no rank starts."""
    run = tmp_path / "RUN"
    code = WITHOUT_TENSORBOARD + "from cpudist.cli.main import main; main()"
    out = subprocess.run([sys.executable, "-c", code, "run", "mrpc", "--np", "2", "--model", "tiny",
                          "--data-dir", str(shared_data / "glue" / "MRPC"), "--max-steps", "1",
                          "--report-to", "tensorboard", "--output-dir", str(run), "--ledger",
                          str(tmp_path / "ledger.jsonl")],
                         capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'cpudist[tensorboard]'" in lines[0], out.stderr
    assert not (run / "ranks.log").exists() and "ready" not in out.stdout + out.stderr


def test_missing_tensorboard_stops_a_rank_before_it_joins(tmp_path: Path) -> None:
    """A rank started by hand (or on a node without the package) says the same and joins no process
    group: rank 1 of 2 returns at once instead of waiting for its peer."""
    code = WITHOUT_TENSORBOARD + "from cpudist.rank import main; sys.exit(main())"
    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "9"}
    out = subprocess.run([sys.executable, "-c", code, "--task", "synthetic", "--model", "tiny",
                          "--output-dir",
                          str(tmp_path), "--report-to", "tensorboard", "--dist-timeout-s", "5"],
                         capture_output=True, text=True, timeout=120, env=env,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and (":1] error: --report-to tensorboard needs the tensorboard package"
                                in lines[0]), lines
    assert "pip install 'cpudist[tensorboard]'" in lines[0]


def test_it_crosses_ssh_to_the_head() -> None:
    """The head's agent gets the run as JSON (run/request.py): the names come back a tuple, so its
    ranks get them."""
    from cpudist.run.request import LaunchOptions, RunRequest

    request = RunRequest(train=TrainConfig(task="mrpc", output_dir="run",
                                           report_to=("tensorboard",)),
                         launch=LaunchOptions(np=2, ppn=1))
    again = RunRequest.from_json(request.to_json())
    assert again == request and "--report-to=tensorboard" in to_argv(again.train)
