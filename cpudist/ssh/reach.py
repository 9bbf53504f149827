"""Before any rank starts: every node answers the launcher's own ssh (its program, its keys and
pins), or the run fails naming the node and the fix, instead of a launcher hanging or dying later
with ssh's words in its log."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor

from cpudist.errors import JobFailed
from cpudist.hostfile import Host


def host_key_problem(name: str, stderr: str) -> tuple[str, str] | None:
    """(message, hint) when ssh refused `name` over its host key: never pinned, or changed since."""
    if "IDENTIFICATION HAS CHANGED" in stderr or "key for this host has changed" in stderr.lower():
        return (f"the host key of {name} does not match the pinned one: refusing to connect",
                f"If {name} was reinstalled on purpose: `cpudist hosts forget {name}`, then "
                "`cpudist hosts ssh-setup --hostfile ...` to pin and distribute its new key")
    if "host key is known" in stderr or "Host key verification failed" in stderr:
        return (f"no host key of {name} is pinned, so ssh refuses to connect to it",
                "Run `cpudist hosts ssh-setup --hostfile ...` to pin every node's key")
    return None


def check_reachable(hosts: tuple[Host, ...], ssh: str, timeout_s: float = 15) -> None:
    """Every node answers the launcher's ssh before any rank starts; else fail naming the host."""

    def probe(h: Host) -> tuple[str, int, str]:
        try:
            p = subprocess.run([ssh, "-o", "ConnectTimeout=5", "-o", "BatchMode=yes", h.name,
                                "true"],
                               capture_output=True, text=True, timeout=timeout_s,
                               stdin=subprocess.DEVNULL)
            return h.name, p.returncode, p.stderr.strip()
        except subprocess.TimeoutExpired:
            return h.name, 255, f"no answer within {timeout_s:g}s"
        except OSError as e:  # the ssh program itself is missing
            return h.name, 255, str(e)

    with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        bad = [r for r in pool.map(probe, hosts) if r[1] != 0]
    for name, _, err in bad:
        problem = host_key_problem(name, err)
        if problem:
            raise JobFailed(*problem)
    if bad:
        names = ", ".join(f"{n} ({err or 'exit ' + str(code)})" for n, code, err in bad)
        raise JobFailed(f"cannot reach {names} over ssh with {ssh}",
                        "Check the node is up, then run `cpudist hosts ssh-setup --hostfile ...`")
