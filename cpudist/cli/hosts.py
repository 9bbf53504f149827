"""`cpudist hosts ...`: password-less SSH between nodes, and a health check of every node."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from cpudist import state
from cpudist.cli.launch_options import connect_options
from cpudist.cli.options import output_options
from cpudist.errors import CpudistError
from cpudist.hostfile import check_resolvable, read_hostfile, read_nodes, render_hostfile
from cpudist.hosts.bench import DEFAULT_SIZES, BenchResult, human, parse_sizes, run_probe, save
from cpudist.hosts.doctor import doctor as run_doctor
from cpudist.hosts.doctor import usable_text
from cpudist.launch.kinds import plan as plan_launch
from cpudist.launch.spec import LAUNCHERS, Launch, RunSpec
from cpudist.ssh.known_hosts import KnownHosts
from cpudist.ssh.setup import setup_plan
from cpudist.ssh.setup import ssh_setup as run_ssh_setup

hostfile_option = click.option("--hostfile", type=click.Path(path_type=Path), required=True,
                               help="One host per line, the head node first.")
user_option = click.option("--user", help="Login name on the nodes [default: yours].")
identity_option = click.option("--identity", type=click.Path(exists=True, dir_okay=False),
                               help="Private key that logs in to every node [default: ssh-agent, "
                                    "~/.ssh].")
port_option = click.option("--port", type=click.IntRange(1, 65535), default=22, show_default=True,
                           help="SSH port of every node.")


def console() -> Console:
    c = Console()
    return c if c.is_terminal else Console(width=200)


@click.group()
def hosts() -> None:
    """Prepare and check the nodes of an on-prem or cloud cluster."""


@hosts.command("ssh-setup")
@hostfile_option
@user_option
@identity_option
@port_option
@click.option("--dry-run", is_flag=True,
              help="Show the nodes, the key and the files it would install; connect to "
              "nothing and write nothing.")
def ssh_setup(hostfile: Path, user: str | None, identity: str | None, port: int,
              dry_run: bool) -> None:
    """Install one cluster key so every node can ssh to every other node (host keys pinned)."""
    nodes = read_hostfile(hostfile)
    check_resolvable(nodes)
    if dry_run:
        for line in setup_plan(nodes, user, identity, port):
            click.echo(line)
        return
    results = run_ssh_setup(nodes, user, identity, port)
    table = Table("node", "home", "reaches", "fails")
    for r in results:
        table.add_row(r.host, r.home, f"{len(r.reaches)}/{len(nodes)}", " ".join(r.fails) or "-")
    console().print(table)
    broken = [r for r in results if r.fails]
    if broken:
        raise CpudistError(f"{broken[0].host} cannot ssh to {', '.join(broken[0].fails)} with the "
                           "cluster key",
                           "Check sshd on those nodes (AuthorizedKeysFile, firewall), then re-run "
                           "ssh-setup")
    click.echo(f"ok: {len(nodes)} nodes reach each other; launchers use "
               f"{state.local_cluster_dir()}/ssh")


@hosts.command()
@hostfile_option
@user_option
@identity_option
@port_option
@click.option("--launcher-program", default="mpiexec.hydra", show_default=True,
              help="Program every node must have (mpiexec.hydra, mpirun, torchrun).")
@output_options()
def doctor(hostfile: Path, user: str | None, identity: str | None, port: int, launcher_program: str,
           fmt: str) -> None:
    """Check every node against the head: SSH, versions, CPU features, cores, usable cores (affinity
    mask and cgroup quota: what its ranks size their threads by), memory, launcher."""
    nodes = read_hostfile(hostfile)
    reports = run_doctor(nodes, user, identity, port, launcher_program)
    if fmt == "json":
        click.echo(json.dumps([{"host": r.host, "ok": r.ok, "problems": r.problems,
                                "facts": r.facts}
                               for r in reports], indent=2))
    else:
        table = Table("node", "python", "cpudist", "torch", "mpi", "cpu", "bf16", "cores", "usable",
                      "free GiB", "launcher", "verdict")
        for r in reports:
            f = r.facts
            cpu = f.get("cpu", {})
            table.add_row(r.host, f.get("python", "-"), f.get("cpudist", "-"), f.get("torch", "-"),
                          f.get("mpi") or "-", cpu.get("model", "-"), str(cpu.get("bf16", "-")),
                          str(cpu.get("physical_cores", "-")), usable_text(f),
                          str(f.get("mem_available_gib", "-")),
                          "yes" if f.get("launchers", {}).get(launcher_program) else "no",
                          "ok" if r.ok else "FAIL: " + "; ".join(r.problems))
        console().print(table)
    bad = [r for r in reports if not r.ok]
    if bad:
        raise CpudistError(f"{len(bad)} of {len(reports)} nodes differ from the head or are not "
                           f"ready ({', '.join(r.host for r in bad)})",
                           "Fix what the table says, then re-run doctor")


@hosts.command()
@click.argument("host")
def forget(host: str) -> None:
    """Drop HOST's pinned host key (after a deliberate reinstall), so ssh-setup can pin the new
    one."""
    if KnownHosts(state.local_cluster_dir() / "known_hosts").forget(host):
        click.echo(f"forgot the host key of {host}; run `cpudist hosts ssh-setup` to pin the new "
                   "one")
    else:
        click.echo(f"no pinned key for {host}")


def _sizes(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, ...]:
    return parse_sizes(value)


def _print_launch(spec: RunSpec, launch: Launch) -> None:
    click.echo("# environment of every rank")
    for key, value in launch.rank_env.items():
        click.echo(f"export {key}={value}")
    click.echo(f"# hostfile {spec.hostfile} (written when the probe starts)")
    click.echo(render_hostfile(spec.hosts[: spec.np // spec.ppn], "openmpi"
                               if spec.launcher == "openmpi" else "hydra",
                               spec.ppn), nl=False)
    click.echo("# command")
    click.echo(launch.shell())


def _print_bench(result: BenchResult, path: Path) -> None:
    table = Table("size", "time (ms)", "algbw (Gbit/s)", "busbw (Gbit/s)",
                  title=f"gloo all-reduce, {result.world_size} ranks on {len(result.nodes)} nodes "
                        f"(median of {result.iters})", title_justify="left")
    for p in result.points:
        table.add_row(human(p.bytes), f"{p.median_s * 1000:.2f}", f"{p.algbw_gbps:.3f}",
                      f"{p.busbw_gbps:.3f}")
    console().print(table)
    click.echo(f"nodes: {' '.join(result.nodes)}; saved {path}; `cpudist plan` takes the link rate "
               f"{result.link_gbps:.3f} Gbit/s from it (bus bandwidth at "
               f"{human(result.points[-1].bytes)})")


@hosts.command()
@hostfile_option
@click.option("--ppn", type=click.IntRange(min=1), default=1, show_default=True,
              help="Ranks per node.")
@click.option("--sizes", default=DEFAULT_SIZES, show_default=True, callback=_sizes,
              help="Bytes per all-reduce (fp32), comma-separated: KB/MB/GB are powers of 10, "
                   "KiB/MiB/GiB of 2.")
@click.option("--iters", type=click.IntRange(min=1), default=10, show_default=True,
              help="Timed all-reduces per size (the median is kept).")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True,
              help="Untimed all-reduces per size before the timed ones.")
@click.option("--launcher", "--mpi", "launcher",
              type=click.Choice([x for x in LAUNCHERS if x != "torchrun"]), default="auto",
              show_default=True, help="auto: the MPI of --mpirun, else MPICH's Hydra.")
@connect_options
@click.option("--timeout", type=click.FloatRange(min=1), default=600, show_default=True,
              help="Stop the probe after this many seconds.")
@click.option("--dry-run", is_flag=True, help="Print the launch; run nothing.")
@output_options()
def bench(hostfile: Path, ppn: int, sizes: tuple[int, ...], iters: int, warmup: int, launcher: str,
          mpirun: str | None, ssh: str | None, iface: str | None, timeout: float, dry_run: bool,
          fmt: str) -> None:
    """All-reduce bandwidth between the hostfile's nodes (run on the head), kept for `cpudist plan`.

    Bus bandwidth is bytes x 2(N-1)/N / time, as nccl-tests define it: the rate each node's link
    carried. The result goes to ~/.cpudist/bench/<hostfile>-<time>.json.
    """
    from cpudist.config import TrainConfig
    from cpudist.run.payloads import spec_of
    from cpudist.run.request import LaunchOptions, RunRequest
    from cpudist.wire.payload import Probe

    listed = read_nodes(hostfile)
    np_ = len(listed.hosts) * ppn
    with tempfile.TemporaryDirectory(prefix="cpudist-bench-") as workdir:
        request = RunRequest(train=TrainConfig(task="hosts-bench", output_dir=workdir),
                             nodes=listed,
                             launch=LaunchOptions(np=np_, ppn=ppn, launcher=launcher, mpirun=mpirun,
                                                  ssh=ssh, iface=iface),
                             payload=Probe(sizes=sizes, iters=iters, warmup=warmup))
        spec = spec_of(request, dry_run)
        launch = plan_launch(spec)
        if dry_run:
            _print_launch(spec, launch)
            return
        result = run_probe(str(hostfile), spec, launch, timeout,
                           lambda line: click.echo(line, err=True))
    path = save(result)
    if fmt == "json":
        click.echo(json.dumps({**result.to_dict(), "path": str(path)}, indent=2))
    else:
        _print_bench(result, path)
