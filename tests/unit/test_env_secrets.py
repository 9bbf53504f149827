"""--env values stay off command lines and out of what is shown (issue 23: command.txt, --dry-run,
ps on every node)."""

from __future__ import annotations

from cpudist.config import TrainConfig
from cpudist.hostfile import Host, local_hosts
from cpudist.launch.env import redact_env_args, redact_pairs
from cpudist.launch.kinds import plan
from cpudist.launch.spec import RunSpec, inherited, redacted
from tests.unit.specs import run_spec

SECRET = "hunter2"


def spec(launcher: str, **kw: object) -> RunSpec:
    base = dict(train=TrainConfig(task="synthetic", output_dir="out"), np=2, ppn=2,
                hosts=local_hosts(4), launcher=launcher, launcher_path=f"/bin/{launcher}",
                python="/usr/bin/python3", master_addr="127.0.0.1", master_port=29500,
                physical_cores=4,
                env=(("HF_TOKEN", SECRET), ("OMP_NUM_THREADS", "1"), ("KMP_BLOCKTIME", "7")))
    return run_spec(**{**base, **kw})


def test_user_variables_pass_by_inheritance_own_ones_on_the_line() -> None:
    # cpudist sets KMP_BLOCKTIME itself with Intel OpenMP
    s = spec("mpich", iomp="/lib/libiomp5.so")
    assert inherited(s) == {"HF_TOKEN"}
    launch = plan(s)
    assert SECRET not in " ".join(launch.argv) and "HF_TOKEN" not in launch.argv
    # the launcher's own environment carries it (runner.execute)
    assert launch.rank_env["HF_TOKEN"] == SECRET
    # the user's value of a variable cpudist sets wins on the line
    i = launch.argv.index("KMP_BLOCKTIME")
    assert launch.argv[i - 1: i + 2] == ("-genv", "KMP_BLOCKTIME", "7")


def test_open_mpi_exports_the_name_only() -> None:
    argv = plan(spec("openmpi")).argv
    assert SECRET not in " ".join(argv)
    assert argv[argv.index("HF_TOKEN") - 1] == "-x" and "OMP_NUM_THREADS=1" in argv


def test_shown_launch_hides_values_but_thread_counts() -> None:
    across = spec("torchrun", np=2, ppn=1, hosts=(Host("a"), Host("b")), hostfile="/tmp/hosts")
    # torchrun across hosts: each host's ssh command (in `ps`) names the value, the tether reads it
    assert SECRET not in plan(across).shell() and "--from-secrets HF_TOKEN" in plan(across).shell()
    shown = plan(redacted(across)).shell()  # what command.txt and --dry-run show
    assert (SECRET not in shown and "--from-secrets HF_TOKEN" in shown
            and "OMP_NUM_THREADS=1" in shown)
    assert redact_pairs((("HF_TOKEN", SECRET), ("OMP_NUM_THREADS", "1"))) == (
        ("HF_TOKEN", "***"), ("OMP_NUM_THREADS", "1"))


def test_command_line_redacted_for_the_record() -> None:
    words = ["run", "mrpc", "--env", f"HF_TOKEN={SECRET}", f"--env=PW={SECRET}", "--env",
             "OMP_NUM_THREADS=2", "--model", "tiny"]
    assert redact_env_args(words) == ["run", "mrpc", "--env", "HF_TOKEN=***", "--env=PW=***",
                                      "--env", "OMP_NUM_THREADS=2", "--model", "tiny"]
