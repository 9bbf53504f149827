"""Secrets for the ranks (`cpudist run --secret NAME`, `--env-file FILE`): never on a command line.

    cpudist run mrpc --secret HF_TOKEN --env-file ~/.config/wandb.env \\
        --hostfile H --np 2 --ppn 1 ...

The values travel as data only: in the request on the agent's stdin (a run from outside the
cluster), then into a 0600 file `~/.cpudist/secrets/<run>.json` on every node of the run (over ssh's
stdin), whose path alone (`CPUDIST_SECRETS`) is in the ranks' environment. The rank entry
(cpudist/rank.py) reads it into its own environment before anything else, so `ps`, command.txt,
job.sbatch and torchrun's per-host commands show the path, never a value. The files go when the
launch ends. With Slurm the file is written on the submitting machine only: the nodes read it
through the shared home that Slurm clusters mount; a batch script (job.sbatch, which outlives the
run) exports the --env values from it too, naming them only, and removes it when the job ends (a job
Slurm requeues keeps it for its next start). torchrun's per-host lines name the --env values in the
same way, and each host's tether (launch/tether.py) exports them from the file.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from cpudist import state
from cpudist.errors import BadInput

# the ranks' variable: where their node's secrets file is ("~/..." as written)
SECRETS_ENV = "CPUDIST_SECRETS"
FOLDER = str(state.SECRETS_DIR)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

Pairs = tuple[tuple[str, str], ...]


def from_environment(names: tuple[str, ...], environ: Mapping[str, str]) -> Pairs:
    """--secret NAME: each value from this machine's environment; a name that is not set is one
    line."""
    out = []
    for name in names:
        if not _NAME.fullmatch(name):
            raise BadInput(f"--secret {name}: not a variable name",
                           "Pass the variable's name: --secret HF_TOKEN")
        if name not in environ:
            raise BadInput(f"--secret {name}: {name} is not set in this shell's environment",
                           f"export {name}=... first (or put it in a file for --env-file)")
        out.append((name, environ[name]))
    return tuple(out)


def parse_env_file(path: Path) -> Pairs:
    """--env-file: `NAME=value` lines (`export ` allowed, `#` comments, one pair of surrounding
    quotes removed)."""
    try:
        text = path.read_text()
    except OSError as e:
        raise BadInput(f"--env-file {path}: {e.strerror}",
                       "Pass a readable file of NAME=value lines") from None
    out = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.removeprefix("export ").partition("=")
        name = name.strip()
        if not sep or not _NAME.fullmatch(name):
            raise BadInput(f"--env-file {path}, line {number}: not of the form NAME=value",
                           "Write one NAME=value per line")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out.append((name, value))
    return tuple(out)


def gather(env_files: tuple[Path, ...], names: tuple[str, ...],
           environ: Mapping[str, str]) -> Pairs:
    """--env-file's pairs, then --secret's (the later wins), as data: never on a command line."""
    return tuple(p for f in env_files for p in parse_env_file(f)) + from_environment(names, environ)


def file_for(run: str) -> str:
    """The secrets file of a run on every node, as the ranks' CPUDIST_SECRETS says it (under each
    node's home)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", run) or "run"
    return f"~/{FOLDER}/{safe}.json"


def render(pairs: Pairs) -> str:
    return json.dumps(dict(pairs))


def write_here(where: str, pairs: Pairs) -> Path:
    """The secrets file on this machine: created 0600 (never readable by others, not even for a
    moment)."""
    path = Path(where).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(fd, 0o600)  # an older file of the same name keeps its mode through O_CREAT
        f.write(render(pairs))
    return path


def write_command(where: str) -> str:
    """Shell (run on a node over ssh, the JSON on its stdin) that writes the node's secrets file,
    0600."""
    rel = where.removeprefix("~/")
    return f"umask 077 && mkdir -p \"$HOME/{FOLDER}\" && cat > \"$HOME/{rel}\""


def remove_command(where: str) -> str:
    return f"rm -f \"$HOME/{where.removeprefix('~/')}\""


def read(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of the file that CPUDIST_SECRETS names in `environ` (none without it)."""
    where = environ.get(SECRETS_ENV)
    if not where:
        return {}
    try:
        values = json.loads(Path(where).expanduser().read_text())
    except (OSError, ValueError) as e:
        raise BadInput(f"the run's secrets file {where} cannot be read on this node ({e})",
                       "Check the node's home folder (disk full?) and re-run") from None
    return {str(k): str(v) for k, v in values.items()}


def load_into(environ: MutableMapping[str, str]) -> None:
    """In a rank: the variables of the file that CPUDIST_SECRETS names, into its own environment."""
    environ.update(read(environ))
