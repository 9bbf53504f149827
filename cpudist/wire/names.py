"""The names of a run folder's files, the same on the ranks' side and the launching side.

    run.json      the run's identity and state     result.json   the run's one RunResult
    steps.jsonl   one line per logged step         ranks.log     every rank's output
    cpudist.log   what the launching side showed   command.txt   the launch, secrets redacted
    hostfile      the hosts the launcher was given model/        the saved model and its card
    checkpoints/  step-N/ folders
"""

RUN = "run.json"
RESULT = "result.json"
STEPS = "steps.jsonl"
RANKS_LOG = "ranks.log"
LOG = "cpudist.log"
COMMAND = "command.txt"
HOSTFILE = "hostfile"
MODEL = "model"
CHECKPOINTS = "checkpoints"


def aside(name: str) -> str:
    """The name a file or folder is written under before it is renamed into place, whole."""
    return f"{name}.tmp"
