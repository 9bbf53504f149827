"""The elastic run's contract (--elastic): what the launch tells each node's rank through its
environment, the Lighthouse the head runs, and where each node writes (what such a run takes:
cpudist/elastic_flags.py).

Each node is one rank in a world of its own (a torchft replica group); the Lighthouse on the head
admits and drops the nodes step by step (cpudist/train/elastic.py, cpudist/launch/elastic.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

LIGHTHOUSE = "TORCHFT_LIGHTHOUSE"  # http://HEAD:PORT: torchft's own variable
REPLICA_ID = "CPUDIST_REPLICA_ID"  # this node's name in the quorum: node<i>, i its hostfile line
REPLICAS = "CPUDIST_REPLICAS"  # the node count the global batch is planned for
ADVERTISE = "CPUDIST_ADVERTISE"  # the address peers reach this node at (default: its host name)

# A node that stops heartbeating leaves the quorum after HEARTBEAT_MS; a quorum waits JOIN_MS for
# nodes that heartbeat but have not asked yet. A step's exchange gives up on a silent peer (a cut
# link) after at most EXCHANGE_TIMEOUT_S, which bounds what a node loss costs the others.
# JOIN_MS must outlast a heal: a node that healed (or served a heal) asks for the next quorum late;
# left out, it heals again, slowing its source, which is left out next, and the run never gets its
# nodes back. A lost node is not waited for: it stops heartbeating.
HEARTBEAT_MS, JOIN_MS, EXCHANGE_TIMEOUT_S = 5000, 30000, 30
# torchft's Rust side logs every quorum at INFO: a line per node and step
QUIET = {"RUST_LOG": "warn"}

def lighthouse_argv(python: str, port: int) -> list[str]:
    """torchft's Lighthouse from the venv of `python`, on every address at `port`."""
    return [str(Path(python).parent / "torchft_lighthouse"), "--bind", f"[::]:{port}",
            "--min_replicas", "1", "--quorum_tick_ms", "100", "--join_timeout_ms", str(JOIN_MS),
            "--heartbeat_timeout_ms", str(HEARTBEAT_MS)]


def node_folder(output_dir: str, index: int) -> str:
    """Where node `index` writes its steps and model: the run folder for the head, a folder of it
    for the others (apart on a shared file system; the head's are the run's)."""
    return output_dir if index == 0 else str(Path(output_dir) / "nodes" / node_name(index))


def node_name(index: int) -> str:
    """Node `index`'s name in the quorum and the record (its hostfile line, from 0)."""
    return f"node{index}"


def node_index(env: Mapping[str, str]) -> int:
    """This node's index, from the name the launch gave it (REPLICA_ID; 0 without one)."""
    name = env.get(REPLICA_ID, "")
    digits = name.removeprefix("node")
    return int(digits) if name.startswith("node") and digits.isdigit() else 0
