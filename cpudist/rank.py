"""Rank entry point: one process per rank, started by a launcher.

    mpirun -np 2 -ppn 2 -genv MASTER_ADDR 127.0.0.1 -genv MASTER_PORT 29500 \
        python -m cpudist.rank --task mrpc --data-dir glue/MRPC --model tiny --output-dir run
    torchrun --standalone --nproc-per-node 2 -m cpudist.rank --task synthetic --output-dir run

`cpudist run` builds these commands for you (see `cpudist run --dry-run`). This module wires the
trainer (cpudist/train, which imports no provider) to the provider's parts: the S3 object store of
the checkpoint mirror and the EC2 spot-notice poller (cpudist/cloud/aws).
"""

from __future__ import annotations

import os
import socket
import sys

from cpudist import secrets, state

# Inductor (--compile) fixes its cache folder when torch is imported: the user's, kept across runs
# and reboots.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(state.inductor_dir()))

from cpudist.cloud.aws.notice import NoticeWatcher, imds_endpoint
from cpudist.cloud.aws.objects import S3Objects
from cpudist.config import from_argv
from cpudist.errors import CpudistError
from cpudist.train.dist import discover_rank, exit_rank, shutdown_distributed
from cpudist.train.main import Provider, run
from cpudist.train.preempt import NoticePoller
from cpudist.train.startup import Startup
from cpudist.wire import exits, rank_errors


def spot_notices(setting: str) -> NoticePoller | None:
    """The poller of EC2's spot notices for --imds (auto: on EC2 only; off: none; else the URL
    given)."""
    endpoint = imds_endpoint(setting)
    return NoticeWatcher(endpoint) if endpoint else None


AWS = Provider(store=S3Objects, notices=spot_notices)
PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
             "Socket Timeout")
# gloo's words when a peer sent nothing for the group's timeout (--dist-timeout)
PEER_SILENT = "Timed out waiting"


def lost_peer(error: RuntimeError) -> bool:
    """Whether a collective failed because a peer rank is gone or silent (torch's DistError, or
    gloo's transport error or timeout)."""
    import torch.distributed as dist

    text = str(error)
    return isinstance(error, dist.DistError) or any(words in text
                                                    for words in (*PEER_GONE, PEER_SILENT))


def peer_line(error: RuntimeError, timeout_s: int) -> str:
    """What follows LOST_PEER on the rank's error line: a silent peer said as such, else gloo's
    first line."""
    text = str(error)
    if PEER_SILENT not in text:
        return text.splitlines()[0]
    # gloo's own words, without the callback wrappers
    said = text[text.find(PEER_SILENT):].splitlines()[0]
    return (f"no answer within --dist-timeout {timeout_s}s "
            f"(a rank that hangs, or a frozen host or link): {said}")


def main(argv: list[str] | None = None) -> int:
    """Run one rank; errors print one line prefixed with host:rank and set the exit code."""
    startup = Startup.at_entry(os.environ)  # first: the time to get here is one of its phases
    cfg = from_argv(sys.argv[1:] if argv is None else argv)
    rank = "?"
    try:
        # --secret/--env-file: from the node's 0600 file, never from argv
        secrets.load_into(os.environ)
        info = discover_rank(os.environ)
        rank = str(info.rank)
        return run(cfg, info, AWS, startup)
    except CpudistError as e:
        sys.stderr.write(rank_errors.error_line(socket.gethostname(), rank, e.message))
        sys.stderr.flush()
        return e.exit_code
    except OSError as e:  # e.g. a model or tokenizer that cannot be loaded
        sys.stderr.write(rank_errors.error_line(socket.gethostname(), rank, str(e)))
        sys.stderr.flush()
        return exits.FAILED
    except RuntimeError as e:
        if not lost_peer(e):
            raise  # a bug: its traceback is what a report needs
        # A peer that failed (its own error line says why) or died breaks this rank's next
        # collective.
        why = peer_line(e, cfg.dist_timeout_s)
        sys.stderr.write(rank_errors.lost_peer_line(socket.gethostname(), rank, why))
        sys.stderr.flush()
        return exits.FAILED
    finally:
        shutdown_distributed()


if __name__ == "__main__":
    exit_rank(main())
