"""The image recipe: valid shell that always powers off, shipped in the wheel, read back from the
console."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from cpudist.cloud.images import bootstrap_result, recipe_dir


def test_bootstrap_is_valid_bash_that_powers_off_on_every_way_out() -> None:
    script = recipe_dir() / "bootstrap.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert "trap finish EXIT" in text and "shutdown -h now" in text
    steps = [line.split("=", 1)[1] for line in text.splitlines() if line.startswith("STEP=")]
    assert steps == ["start", "packages", "python", "torch", "upload", "cpudist", "manifest",
                     "done"]
    assert ("3.11" in text and "download.pytorch.org/whl/cpu" in text
            and "cpudist[offline]" not in text)


def test_the_failing_step_is_read_from_the_console() -> None:
    console = "boot...\ncpudist-bootstrap: FAILED at step torch (exit 1)\n[  OK  ] Power off.\n"
    assert bootstrap_result(console) == (False, "torch")
    assert bootstrap_result("x\ncpudist-bootstrap: OK\n") == (True, None)
    assert bootstrap_result("no bootstrap line at all") == (False, None)


def test_the_wheel_carries_the_recipe(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path), str(root)], check=True)
    names = zipfile.ZipFile(next(tmp_path.glob("cpudist-*.whl"))).namelist()
    assert "cpudist/_ami/bootstrap.sh" in names and "cpudist/_ami/README.md" in names
