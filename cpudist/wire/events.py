"""The ranks' events on stdout: one marked JSON line each, printed by the rank programs and read
by the launching side (the progress bar, cpudist.log, a stop's checkpoint)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

MARKER = "@@cpudist "
KEY = "event"

# rank 0 of a training run
START = "start"  # total, batches_per_epoch, step
PROGRESS = "progress"  # step, total, loss, samples_per_s; --elastic: nodes
# --elastic: step, nodes, planned, members, left, joined: from that step on, nodes of planned
# train; their names, and those of the nodes that left and joined since the last change
NODES = "nodes"
# --elastic, at the start: nodes of planned are in, and the first step waits for the others up to
# timeout_s
WAITING = "waiting"
SAVING = "saving"  # step: it starts writing the checkpoint of that step
CHECKPOINT = "checkpoint"  # step, path: ... and it is whole
EVAL = "eval"  # rows
EVALUATED = "evaluated"  # step, metrics
MODEL = "model"  # path, step, bytes, seconds
MODEL_S3 = "model_s3"  # url, files, bytes, seconds, or url, error
DONE = "done"  # result
STOPPED = "stopped"  # the user's stop after a checkpoint: step, checkpoint, reason, host
PREEMPTED = "preempted"  # anything else's: the same fields
STOPS = (STOPPED, PREEMPTED)
# the other rank programs
SCRIPT_RANK = "script_rank"  # a user's script's rank, before it starts: rank, host, threads, source
ROWS = "rows"  # a predict worker: rank, rows done
BENCH = "bench"  # hosts bench: hosts, sizes, medians, iters, warmup


def emit(event: str, **fields: Any) -> None:
    """Print one event line."""
    sys.stdout.write(line(event, **fields) + "\n")
    sys.stdout.flush()


def line(event: str, **fields: Any) -> str:
    """An event as the line a rank prints (without its newline)."""
    return relay({KEY: event, **fields})


def relay(event: dict[str, Any]) -> str:
    """An event already parsed, as its line again (an agent passing the ranks' events on)."""
    return MARKER + json.dumps(event)


def parse(text: str) -> dict[str, Any] | None:
    """The event on a line of rank output, or None for ordinary output."""
    at = text.find(MARKER)
    if at < 0:
        return None
    try:
        value = json.loads(text[at + len(MARKER):])
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def progress_text(event: dict[str, Any]) -> str:
    """A PROGRESS event's figures as the progress line shows them."""
    nodes = f"  {event['nodes']} node(s)" if "nodes" in event else ""
    return f"loss {event['loss']:.4f}  {event['samples_per_s']:.1f} samples/s{nodes}"


def nodes_text(event: dict[str, Any]) -> str:
    """A NODES event as one line: an elastic run's membership from a step on, and who changed."""
    who = who_text(event.get("left", ()), event.get("joined", ()))
    return (f"from step {event['step']}: training on {event['nodes']} of {event['planned']} "
            f"node(s)" + (f" ({who})" if who else ""))


def waiting_text(event: dict[str, Any]) -> str:
    """A WAITING event as one line."""
    return (f"{event['nodes']} of {event['planned']} node(s) in: the first step waits for the "
            f"others, {event['timeout_s']} s at most (--dist-timeout)")


def who_text(left: Sequence[str], joined: Sequence[str]) -> str:
    """Who left and who joined at an elastic run's membership change, in words ("" when not
    known: a record from before they were kept). A node in both was started again before the
    others went on without it."""
    words = [f"{n} left" for n in left if n not in joined]
    words += [f"{n} {'started again' if n in left else 'joined'}" for n in joined]
    return ", ".join(words)


def kind(event: dict[str, Any]) -> str | None:
    """Which event it is (one of the names above)."""
    value = event.get(KEY)
    return value if isinstance(value, str) else None
