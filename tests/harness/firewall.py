"""Security groups as iptables rules: what the EC2 emulator holds, turned into each host's INPUT
chain.

Pure functions over moto's in-process backend objects; `world.World.sync` applies the result with
`iptables-restore` in each host's network namespace. AWS semantics kept: a rule naming a group
admits the PRIVATE addresses of that group's live members only; a CIDR rule admits that source;
tracked (established) connections outlive a revoked rule; no live instance, no inbound at all.
"""

from __future__ import annotations

from typing import Any

LIVE = ("pending", "running")
PROTOCOLS = {"6": "tcp", "17": "udp", "1": "icmp"}


def live_instances(backend: Any) -> list[Any]:
    """moto Instance objects that are pending or running (a machine that is on)."""
    return [inst for res in backend.all_reservations() for inst in res.instances
            if inst.state in LIVE]


def member_addresses(backend: Any, group_id: str) -> list[str]:
    """Private addresses of the live members of a security group."""
    return sorted(inst.private_ip for inst in live_instances(backend)
                  if inst.private_ip and any(g.id == group_id for g in inst.security_groups))


def _match(rule: Any) -> str:
    """iptables protocol/port match for one moto SecurityGroupRule ('' for all traffic)."""
    proto = PROTOCOLS.get(str(rule.ip_protocol), str(rule.ip_protocol)).lower()
    if proto in ("-1", "all"):
        return ""
    if proto in ("tcp", "udp") and rule.from_port not in (None, -1):
        return f"-p {proto} -m {proto} --dport {rule.from_port}:{rule.to_port}"
    return f"-p {proto}"


def ingress_lines(backend: Any, instance: Any) -> list[str]:
    """`-A INPUT ...` lines for every ingress rule of every group of `instance`."""
    lines = []
    for group in instance.security_groups:
        for rule in group.ingress_rules:
            if rule.ip_range.get("CidrIp"):
                sources = [rule.ip_range["CidrIp"]]
            elif rule.source_group.get("GroupId"):
                sources = member_addresses(backend, rule.source_group["GroupId"])
            else:
                continue  # IPv6 ranges and prefix lists: the namespace network has neither
            lines += [f"-A INPUT -s {src} {_match(rule)} -j ACCEPT".replace("  ", " ")
                      for src in sources]
    return lines


def ruleset(accepts: list[str]) -> str:
    """iptables-restore input: drop inbound except loopback, replies, and `accepts`."""
    return "\n".join(["*filter", ":INPUT DROP [0:0]", ":FORWARD ACCEPT [0:0]",
                      ":OUTPUT ACCEPT [0:0]", "-A INPUT -i lo -j ACCEPT",
                      "-A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT", *accepts,
                      "COMMIT", ""])


def host_rulesets(backend: Any, private_addrs: list[str]) -> list[str]:
    """One ruleset per host (by private address): its live instance's ingress, or nothing."""
    by_addr = {inst.private_ip: inst for inst in live_instances(backend)}
    return [ruleset(ingress_lines(backend, by_addr[a]) if a in by_addr else [])
            for a in private_addrs]
