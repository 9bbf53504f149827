"""--elastic across a hostfile's nodes: each node one rank in a world of its own (a torchft replica
group), started over ssh under a tether as torchrun's agents are; the head also runs torchft's
Lighthouse, which admits and drops the nodes step by step (cpudist/wire/elastic.py).

    # the Lighthouse's and each node's command
    cpudist run mrpc --hostfile hosts --np 4 --ppn 1 --elastic --dry-run

A node whose command ends early (its ranks killed, its link cut, a spot notice) leaves the run; the
others go on. Its command is started again every RETRY_S while the run lasts: once it answers, it
joins and takes the current weights from a live peer. The run ends when a node has trained the last
step and the others have left; losing every node at once, or the head's Lighthouse, ends it.
"""

from __future__ import annotations

import dataclasses
import queue
import time
from collections.abc import Callable, Mapping
from typing import Any

from cpudist.errors import Interrupted
from cpudist.launch.per_host import Hosts, host_line
from cpudist.launch.runner import Outcome, stop_launcher
from cpudist.launch.spec import Launch, RunSpec, filed_env, trainer_argv
from cpudist.wire import events
from cpudist.wire.elastic import (
    ADVERTISE,
    LIGHTHOUSE,
    QUIET,
    REPLICA_ID,
    REPLICAS,
    lighthouse_argv,
    node_folder,
)

RETRY_S = 10.0  # a node that left is started again this often, until the run ends
# once a node has trained the last step, the others' grace to end theirs: one that joined too late
# to heal would find no peer left and train the run again alone
FINISH_GRACE_S = 60.0
HOUSE = "lighthouse"  # the Lighthouse's key among the hosts' processes


def hosts_launch(spec: RunSpec, env: dict[str, str], nodes: int) -> Launch:
    """The Lighthouse on the head, and each node's rank as node i of `nodes` (a world of 1 whose
    store is at the node's own address, which the quorum hands its peers)."""
    hosts = [h.name for h in spec.hosts[:nodes]]
    port, from_file = spec.master_port, tuple(k for k, _ in filed_env(spec))
    commands = []
    for i, host in enumerate(hosts):
        address = spec.master_addr if i == 0 else host  # the head's toward the nodes
        own = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
               "MASTER_ADDR": address, "MASTER_PORT": str(port + 1 + i),
               LIGHTHOUSE: f"http://{spec.master_addr}:{port}", REPLICA_ID: f"node{i}",
               REPLICAS: str(nodes), ADVERTISE: address, **QUIET}
        train = dataclasses.replace(spec.train, output_dir=node_folder(spec.train.output_dir, i))
        line = host_line(spec.python, spec.cwd, {**env, **own},
                         trainer_argv(dataclasses.replace(spec, train=train)), from_file)
        commands.append((host, ("sh", "-c", line) if i == 0 else (spec.ssh, host, line)))
    house = host_line(spec.python, spec.cwd, QUIET, lighthouse_argv(spec.python, port))
    return Launch(commands[0][1], env, per_host=tuple(commands),
                  lighthouse=(hosts[0], ("sh", "-c", house)))


def execute_elastic(launch: Launch, base_env: Mapping[str, str],
                    on_event: Callable[[dict[str, Any]], None], on_line: Callable[[str], None],
                    say: Callable[[str], None], timeout_s: float | None = None,
                    on_late_line: Callable[[str], None] | None = None,
                    on_stop: Callable[[], None] | None = None) -> Outcome:
    """Run the Lighthouse and every node; a node that leaves is started again while the run lasts.

    The head's events drive the progress (the other nodes print the same steps); every node's
    lines are shown `[host]`-tagged. The outcome is the head's node's (it writes the run's record).
    """
    assert launch.lighthouse is not None
    hosts, commands = Hosts(base_env), dict(launch.per_host)
    head = launch.per_host[0][0]
    hosts.start(HOUSE, launch.lighthouse[1])
    for host, argv in launch.per_host:
        hosts.start(host, argv)
    running, again, finished = set(commands), dict[str, float](), set[str]()
    codes: dict[str, int] = {}
    house_up, interrupted, expired, done_at = True, False, False, None
    failed: tuple[str, int] | None = None
    tail: list[str] = []
    deadline = time.monotonic() + timeout_s if timeout_s else None
    try:
        while running or again or house_up:
            try:
                now = time.monotonic()
                if deadline is not None and now > deadline and not expired:
                    expired = True
                    again.clear()
                    hosts.stop()
                if not running and house_up and hosts.stopping_since is None:
                    if not finished and again:  # every node lost at once: nothing to join
                        failed = failed or (head, codes.get(head, 1))
                        say("every node left the run at once: it cannot go on (an elastic run "
                            "keeps its state on the nodes)")
                    again.clear()
                    hosts.stop()  # the Lighthouse's work is done
                if done_at is not None and now - done_at > FINISH_GRACE_S and running \
                        and hosts.stopping_since is None:
                    say(f"the last step is in: stopping {', '.join(sorted(running))}, still "
                        "running after it")
                    hosts.stop()
                hosts.overdue()
                for host, at in list(again.items()):
                    if now >= at and hosts.stopping_since is None:
                        del again[host]
                        say(f"starting {host} again: it joins and takes the weights from a peer")
                        hosts.start(host, commands[host])
                        running.add(host)
                try:
                    host, line = hosts.lines.get(timeout=0.5)
                except queue.Empty:
                    continue
                if line is None:
                    code = hosts.procs[host].wait()
                    if host == HOUSE:
                        house_up = False
                        if running and hosts.stopping_since is None:  # the head's node is gone
                            failed = failed or (f"{launch.lighthouse[0]}'s Lighthouse", code or 1)
                            say("the Lighthouse on the head ended: the run cannot go on")
                            again.clear()
                            hosts.stop()
                        continue
                    running.discard(host)
                    codes[host] = code
                    if code == 0:
                        finished.add(host)
                        done_at = done_at or now
                        again.clear()  # the last step is in: nothing left to join
                    elif hosts.stopping_since is None and not finished:
                        say(f"{host} left the run (exit {code}); the other nodes go on, and it is "
                            f"started again every {RETRY_S:.0f} s while the run lasts")
                        again[host] = now + RETRY_S
                    continue
                event = events.parse(line)
                if event is not None:
                    if host == head:  # the others' are copies of the same steps
                        on_event(event)
                elif hosts.stopping_since is not None and on_late_line is not None:
                    on_late_line(f"[{host}] {line}")
                else:
                    tail = [*tail, f"[{host}] {line}"][-20:]
                    on_line(tail[-1])
            except KeyboardInterrupt:
                if on_stop is not None and not interrupted:
                    on_stop()
                interrupted = True
                again.clear()
                hosts.stop()
    finally:
        for proc in hosts.procs.values():
            if proc.poll() is None:  # any other way out must not leave a node's rank running
                stop_launcher(proc)
    if interrupted:
        raise Interrupted("interrupted: all ranks were stopped on every node",
                          "Re-run the command to start over")
    if failed is None and head not in finished:
        failed = (head, codes.get(head, 1) or 1)
    return Outcome(failed[1] if failed else 0, expired, tuple(tail),
                   failed[0] if failed else None)
