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
from collections.abc import Callable, Mapping
from typing import Any

from cpudist.launch.per_host import Hosts, Rules, host_line
from cpudist.launch.runner import Outcome
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
    node_name,
)

RETRY_S = 10.0  # a node that left is started again this often, until the run ends
# once a node has trained the last step, the others' grace to end theirs: one that joined too late
# to heal would find no peer left and train the run again alone (one the head's last quorum did
# not hold is stopped without waiting: _Elastic.unjoined)
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
               LIGHTHOUSE: f"http://{spec.master_addr}:{port}", REPLICA_ID: node_name(i),
               REPLICAS: str(nodes), ADVERTISE: address, **QUIET}
        train = dataclasses.replace(spec.train, output_dir=node_folder(spec.train.output_dir, i))
        line = host_line(spec.python, spec.cwd, {**env, **own},
                         trainer_argv(dataclasses.replace(spec, train=train)), from_file)
        commands.append((host, ("sh", "-c", line) if i == 0 else (spec.ssh, host, line)))
    house = host_line(spec.python, spec.cwd, QUIET, lighthouse_argv(spec.python, port))
    return Launch(commands[0][1], env, per_host=tuple(commands),
                  lighthouse=(hosts[0], ("sh", "-c", house)))


class _Elastic(Rules):
    """The nodes of an elastic run and its Lighthouse: a node that leaves is started again while
    the run lasts; the run ends with the nodes, or at once with every node lost or the Lighthouse
    (the head's) gone."""

    failed: tuple[str, int] | None
    done_at: float | None

    def __init__(self, hosts: Hosts, launch: Launch, say: Callable[[str], None]) -> None:
        assert launch.lighthouse is not None
        super().__init__(hosts)
        self.say, self.house = say, launch.lighthouse[0]
        self.commands, self.head = dict(launch.per_host), launch.per_host[0][0]
        # the nodes: the Lighthouse is not waited for (busy: house_up), it ends with them
        self.running, self.finished = set(self.commands), set[str]()
        self.again, self.codes = dict[str, float](), dict[str, int]()
        self.house_up, self.failed, self.done_at = True, None, None
        # the hosts of the last quorum the head's rank told of (its NODES events): once the last
        # step is in and none of them runs, the hosts still running never joined it
        self.node_host = {node_name(i): host for i, (host, _) in enumerate(launch.per_host)}
        self.members: set[str] | None = None

    def busy(self) -> bool:
        return bool(self.running or self.again or self.house_up)

    def tick(self, now: float) -> None:
        hosts, stopping = self.hosts, self.hosts.stopping_since is not None
        if not self.running and self.house_up and not stopping:
            if not self.finished and self.again:  # every node lost at once: nothing to join
                self.failed = self.failed or (self.head, self.codes.get(self.head, 1))
                self.say("every node left the run at once: it cannot go on (an elastic run keeps "
                         "its state on the nodes)")
            self.halt()
            hosts.stop()  # the Lighthouse's work is done
        elif self.done_at is not None and self.running and not stopping and (
                self.unjoined() or now - self.done_at > FINISH_GRACE_S):
            why = ("which had not joined the last quorum" if self.unjoined()
                   else "still running after it")
            self.say(f"the last step is in: stopping {', '.join(sorted(self.running))}, {why}")
            hosts.stop()
        for host, at in list(self.again.items()):
            if now >= at and hosts.stopping_since is None:
                del self.again[host]
                self.say(f"starting {host} again: it joins and takes the weights from a peer")
                hosts.start(host, self.commands[host])
                self.running.add(host)

    def ended(self, host: str, code: int, now: float) -> None:
        stopping = self.hosts.stopping_since is not None
        if host == HOUSE:
            self.house_up = False
            if self.running and not stopping:  # the head's node is gone
                self.failed = self.failed or (f"{self.house}'s Lighthouse", code or 1)
                self.say("the Lighthouse on the head ended: the run cannot go on")
                self.halt()
                self.hosts.stop()
            return
        self.running.discard(host)
        self.codes[host] = code
        if code == 0:
            self.finished.add(host)
            self.done_at = self.done_at or now
            self.halt()  # the last step is in: nothing left to join
        elif not stopping and not self.finished:
            self.say(f"{host} left the run (exit {code}); the other nodes go on, and it is "
                     f"started again every {RETRY_S:.0f} s while the run lasts")
            self.again[host] = now + RETRY_S

    def shows(self, host: str) -> bool:
        return host == self.head  # the others' events are copies of the same steps

    def unjoined(self) -> bool:
        """Whether no host still running was in the last quorum the head told of."""
        return self.members is not None and not self.running & self.members

    def saw(self, host: str, event: dict[str, Any]) -> None:
        if host == self.head and events.kind(event) == events.NODES and "members" in event:
            self.members = {self.node_host.get(n, n) for n in event["members"]}

    def halt(self) -> None:
        self.again.clear()


def execute_elastic(launch: Launch, base_env: Mapping[str, str],
                    on_event: Callable[[dict[str, Any]], None], on_line: Callable[[str], None],
                    say: Callable[[str], None], timeout_s: float | None = None,
                    on_late_line: Callable[[str], None] | None = None,
                    on_stop: Callable[[], None] | None = None) -> Outcome:
    """Run the Lighthouse and every node; a node that leaves is started again while the run lasts.

    The head's events drive the progress; every node's lines are shown `[host]`-tagged. The
    outcome is the head's node's (it writes the run's record).
    """
    assert launch.lighthouse is not None
    hosts = Hosts(base_env)
    hosts.start(HOUSE, launch.lighthouse[1])
    for host, argv in launch.per_host:
        hosts.start(host, argv)
    rules = _Elastic(hosts, launch, say)
    expired, tail = hosts.follow(rules, on_event, on_line, timeout_s, on_late_line, on_stop)
    failed = rules.failed
    if failed is None and rules.head not in rules.finished:
        failed = (rules.head, rules.codes.get(rules.head, 1) or 1)
    return Outcome(failed[1] if failed else 0, expired, tail, failed[0] if failed else None)
