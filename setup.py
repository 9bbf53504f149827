"""Only one thing pyproject.toml cannot say: the top-level ami/ recipe goes into the wheel as
cpudist/_ami."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithImageRecipe(build_py):
    """build_py, then a copy of ami/ (bootstrap.sh, README) beside the package, for
    `cpudist ami build`."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "cpudist" / "_ami"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(Path(__file__).parent / "ami", target)


setup(cmdclass={"build_py": BuildWithImageRecipe})
