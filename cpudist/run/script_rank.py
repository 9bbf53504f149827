"""One rank of a user's script: torchrun's variables from whichever launcher started us, then the
script itself.

    mpiexec.hydra -np 2 ... python -m cpudist.run.script_rank --run-dir runs/x \\
        -- python train.py --lr 1e-4

`cpudist launch` (cli/launch.py, run/script.py) starts this module on every rank through the same
launchers as the trainer. MPI launchers number their ranks in PMI_*/OMPI_COMM_WORLD_* variables; a
script written for torchrun or `accelerate launch` reads RANK, WORLD_SIZE, LOCAL_RANK, ... and
MASTER_ADDR/MASTER_PORT (init_method env://). This wrapper sets those from the launcher's
(train/dist.py's table), sizes the rank's OpenMP threads where it runs (train/threads.py), says so
in one event line (the launching side records each rank's host and threads), and runs the script,
relaying its signals and its output as whole lines tagged with its rank (run/rank_lines.py), ending
with its exit code.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence

from cpudist import secrets
from cpudist.errors import BadInput, CpudistError
from cpudist.run.rank_lines import LineRelay, tag
from cpudist.train.dist import RankInfo, discover_rank
from cpudist.train.threads import allotted_cpus, my_share, pinned_threads, threads_for
from cpudist.wire import events, exits, programs, rank_errors

PR_SET_PDEATHSIG = 1  # prctl(2)
# run/stage.py's files in a staged folder: not the script's
STAGE_MARKS = (".complete", ".manifest")
ACCELERATE_MODULE = "accelerate.commands.launch"  # `accelerate launch`, under the rank's own Python
# accelerate launch's options that --per-node sets from cpudist's layout
ACCELERATE_SET = ("--num_machines", "--machine_rank", "--main_process_ip", "--main_process_port",
                  "--num_processes")
# --per-node: what a node's torchrun (or Accelerate) starts as each worker, before the script: this
# module again, tagging the worker's lines with its RANK (the workers share one stdout)
WORKER = (programs.SCRIPT_RANK, "--relay")


def torchrun_env(info: RankInfo) -> dict[str, str]:
    """The variables torchrun gives every worker (those scripts and Accelerate read), from the
    rank's place."""
    nodes = max(1, info.world_size // info.local_world_size)
    return {
        # torch.distributed's env:// init and every DDP/Trainer/Accelerate script read these four.
        "RANK": str(info.rank),
        "WORLD_SIZE": str(info.world_size),
        "LOCAL_RANK": str(info.local_rank),
        "LOCAL_WORLD_SIZE": str(info.local_world_size),
        # torchrun's node index and count: cpudist puts the same number of ranks on every node, in
        # rank order.
        "GROUP_RANK": str(info.rank // info.local_world_size),
        "GROUP_WORLD_SIZE": str(nodes),
        # torchrun's single role: some scripts log them.
        "ROLE_RANK": str(info.rank),
        "ROLE_WORLD_SIZE": str(info.world_size),
        "ROLE_NAME": "default",
    }


def rank_threads(env: Mapping[str, str], info: RankInfo) -> int:
    """This rank's compute threads: a pinned count (--env OMP_NUM_THREADS), else its node's usable
    cores shared among the node's ranks within this rank's own affinity mask and cgroup quota (no
    collective: the script has not joined a process group yet), at most a scheduler's CPUs per
    task."""
    pinned = pinned_threads(env)
    if pinned is not None:
        return pinned
    mine = my_share()
    return threads_for(mine, [mine] * info.local_world_size, allotted_cpus(env))


def script_env(env: Mapping[str, str], info: RankInfo, threads: int,
               run_dir: str) -> dict[str, str]:
    """The script's environment: the launcher's, torchrun's variables (a torchrun launch's own
    stay), threads."""
    out = {**env,
           **{k: v for k, v in torchrun_env(info).items() if k not in env or info.source != "RANK"}}
    out["OMP_NUM_THREADS"] = str(threads)  # torch sizes its intra-op pool from it when imported
    out["CPUDIST_RUN_DIR"] = run_dir  # where a script may write its metric file and outputs
    return out


def script_argv(command: list[str], python: str) -> list[str]:
    """The command to exec: a bare `train.py` runs under this rank's Python, as torchrun does."""
    return [python, *command] if command[0].endswith(".py") else command


def accelerate_words(command: Sequence[str]) -> list[str] | None:
    """What follows `accelerate launch` (or `python -m accelerate.commands.launch`) in the command;
    None when the command is not Accelerate's launcher."""
    if (len(command) >= 2 and os.path.basename(command[0]) == "accelerate"
            and command[1] == "launch"):
        return list(command[2:])
    if len(command) >= 3 and os.path.basename(command[0]).startswith("python") \
            and list(command[1:3]) == ["-m", ACCELERATE_MODULE]:
        return list(command[3:])
    return None


def check_accelerate(command: Sequence[str]) -> None:
    """Refuse, before anything starts, an `accelerate launch` option that cpudist sets from its own
    layout."""
    words = accelerate_words(command) or []
    script = next((i for i, w in enumerate(words) if not w.startswith("-") and w.endswith(".py")),
                  len(words))
    given = sorted({w.partition("=")[0] for w in words[:script]} & {*ACCELERATE_SET, "--cpu"})
    if given:
        raise BadInput(f"`accelerate launch {' '.join(given)}`: with --per-node cpudist sets "
                       f"{', '.join(ACCELERATE_SET)} from --np, --ppn and its nodes, and starts "
                       "Accelerate's multi-process launcher (--cpu would start one process)",
                       "Leave them out of the accelerate command (--ppn: processes per machine; "
                       "the workers run on "
                       "the CPU where there is no GPU, or with Accelerator(cpu=True))")


def per_node_argv(command: list[str], python: str, info: RankInfo, per_node: int,
                  env: Mapping[str, str]) -> list[str]:
    """--per-node: this node's torchrun (or `accelerate launch`, when the command is), its place
    from the launcher's numbering (one process per node), its rendezvous at cpudist's
    MASTER_ADDR/MASTER_PORT; it starts `per_node` workers of the script."""
    missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not env.get(v)]
    if missing:
        raise CpudistError(f"{' and '.join(missing)} not set for node {info.rank}",
                           "Start it with `cpudist launch`")
    accelerate = accelerate_words(command)
    if accelerate is not None:
        # Accelerate's multi-process launcher is torchrun's (`--multi_gpu`; on CPUs its workers are
        # MULTI_CPU); with one process in all it refuses that flag and runs the script itself.
        total = info.world_size * per_node
        return [python, "-m", ACCELERATE_MODULE, *(["--multi_gpu"] if total > 1 else []),
                "--num_machines", str(info.world_size), "--machine_rank", str(info.rank),
                "--main_process_ip", env["MASTER_ADDR"], "--main_process_port", env["MASTER_PORT"],
                "--num_processes", str(total), *accelerate_worker(accelerate, python)]
    script = command[1:] if os.path.basename(command[0]).startswith("python") and len(
        command) > 1 else command
    return [python, "-m", "torch.distributed.run", "--nnodes", str(info.world_size), "--node-rank",
            str(info.rank), "--nproc-per-node", str(per_node), "--master-addr", env["MASTER_ADDR"],
            "--master-port", env["MASTER_PORT"], "-m", *WORKER, python, "-u", *script]


def accelerate_worker(words: list[str], python: str) -> list[str]:
    """`accelerate launch`'s words with each worker started as WORKER running the script (as
    Accelerate would: `python -u SCRIPT`); unchanged when the script is a module or not Python (-m,
    --no_python)."""
    script = next((i for i, w in enumerate(words) if not w.startswith("-") and w.endswith(".py")),
                  None)
    if script is None or {"-m", "--module", "--no_python"} & set(words[:script]):
        return words
    return [*words[:script], "--module", *WORKER, python, "-u", *words[script:]]


def worker(command: list[str]) -> int:
    """--per-node: one worker of a node's torchrun, its script's lines tagged with torchrun's
    RANK."""
    rank = int(os.environ.get("RANK", "0"))
    try:
        return relay(command, dict(os.environ), None, tag(socket.gethostname(), rank))
    except OSError as e:
        sys.stderr.write(rank_errors.error_line(socket.gethostname(), rank,
                                                f"cannot start {command[0]}: {e.strerror}"))
        return 127


def main(argv: list[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == [WORKER[1]] and len(words) > 1:
        return worker(words[2:] if words[1] == "--" else words[1:])
    options: dict[str, str] = {}
    while words[:1] in (["--run-dir"], ["--workdir"], ["--copy-of"],
                        ["--per-node"]) and len(words) >= 2:
        options[words[0]] = words[1] if words[0] == "--per-node" else os.path.abspath(words[1])
        words = words[2:]
    command = words[1:] if words[:1] == ["--"] else words
    if not command:
        sys.stderr.write(f"usage: {programs.usage(programs.SCRIPT_RANK)} [--run-dir DIR] "
                         "[--copy-of SRC] "
                         "[--workdir DIR] -- COMMAND ...\n")
        return exits.BAD_INPUT
    run_dir = options.get("--run-dir", "")
    try:
        # --secret/--env-file: from the node's 0600 file, never from argv
        secrets.load_into(os.environ)
        info = discover_rank(os.environ)
        per_node = int(options.get("--per-node", "0"))
        threads = rank_threads(os.environ, info)
        if per_node > 1 and pinned_threads(os.environ) is None:
            threads = max(1, threads // per_node)  # the node's cores among torchrun's workers
        argv_, env = ((per_node_argv(command, sys.executable, info, per_node, os.environ),
                       {**os.environ, "OMP_NUM_THREADS": str(threads), "CPUDIST_RUN_DIR": run_dir})
                      if per_node
                      else (script_argv(command, sys.executable),
                            script_env(os.environ, info, threads, run_dir)))
        if "--copy-of" in options:
            copy_folder(options["--copy-of"], options.get("--workdir") or os.getcwd(), run_dir)
    except CpudistError as e:
        sys.stderr.write(rank_errors.error_line(socket.gethostname(), None, e.message))
        return e.exit_code
    events.emit(events.SCRIPT_RANK, rank=info.rank, host=socket.gethostname(), threads=threads,
                source=info.source)
    try:
        # --per-node: torchrun's workers tag their own lines (WORKER); its own lines are the node's
        code = relay(argv_, env, options.get("--workdir"), b"" if per_node
                     else tag(socket.gethostname(), info.rank))
    except OSError as e:
        where = f" in {options['--workdir']}" if "--workdir" in options else ""
        sys.stderr.write(rank_errors.error_line(socket.gethostname(), info.rank,
                                                f"cannot start {argv_[0]}{where}: {e.strerror}"))
        code = 127
    if code != 0:
        sys.stderr.write(rank_errors.error_line(socket.gethostname(), info.rank,
                                                f"`{' '.join(command)}` exited with code {code} on "
                                                f"rank {info.rank}"))
        sys.stderr.flush()
        if info.source == "PMI_RANK":
            # Hydra (MPICH, Intel MPI) waits for the other ranks after one exits with an error code,
            # but cleans them all up at once when one dies of a signal: fail fast, as torchrun, Open
            # MPI and srun do.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
    return code


def copy_folder(source: str, workdir: str, run_dir: str) -> None:
    """A run's own working folder on this node: a copy of the staged script folder (whose
    content-addressed copy the script must not write into), made once per node by whichever rank
    comes first (a temporary copy, then one rename: the others drop theirs)."""
    if os.path.isdir(workdir):
        return
    os.makedirs(run_dir or os.path.dirname(workdir), exist_ok=True)
    part = f"{workdir}.part.{socket.gethostname()}.{os.getpid()}"
    try:
        shutil.copytree(source, part, symlinks=True, ignore=shutil.ignore_patterns(*STAGE_MARKS))
        os.rename(part, workdir)
    except OSError as e:
        shutil.rmtree(part, ignore_errors=True)
        if not os.path.isdir(workdir):
            raise CpudistError(f"cannot copy the staged folder {source} to {workdir}: {e}",
                               "Check the node's free disk space") from None


def _die_with_parent() -> None:
    """In the script's process: SIGKILL when this wrapper dies, so a killed rank never leaves its
    script behind."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def relay(argv: list[str], env: dict[str, str], cwd: str | None, prefix: bytes) -> int:
    """Run the script, passing on the signals this rank gets, and its stdout and stderr as whole
    lines, each tagged with `prefix` (run/rank_lines.py). Returns its exit code (128 + N when signal
    N ended it)."""
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=_die_with_parent)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda number, frame: proc.send_signal(number))
    assert proc.stdout is not None and proc.stderr is not None
    sys.stdout.flush()  # the event line goes out before the script's first
    LineRelay(sys.stdout.fileno(), prefix).copy_all((proc.stdout, proc.stderr))
    code = proc.wait()
    return 128 - code if code < 0 else code

if __name__ == "__main__":
    sys.exit(main())
