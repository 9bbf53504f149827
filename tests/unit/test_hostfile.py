from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cpudist.errors import BadInput
from cpudist.hostfile import Host, check_resolvable, parse_hostfile, render_hostfile

label = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
hostname = st.lists(label, min_size=1, max_size=3).map(".".join)
hosts = st.lists(st.builds(Host, hostname, st.none() | st.integers(1, 256)), min_size=1,
                 max_size=12, unique_by=lambda h: h.name)


@given(hosts, st.sampled_from(["hydra", "openmpi"]))
def test_render_parse_round_trip(hs: list[Host], flavor: str) -> None:
    assert parse_hostfile(render_hostfile(hs, flavor)) == tuple(hs)


@given(hosts, st.integers(1, 64))
def test_slots_override(hs: list[Host], slots: int) -> None:
    assert all(h.slots == slots for h in parse_hostfile(render_hostfile(hs, "openmpi", slots)))


@given(hosts, st.lists(st.sampled_from(["", "   ", "# a comment", "  # indented"]), max_size=5))
def test_comments_and_blank_lines_are_ignored(hs: list[Host], noise: list[str]) -> None:
    lines = render_hostfile(hs).splitlines()
    text = "\n".join(noise + [f"{line}  # trailing" for line in lines] + noise)
    assert parse_hostfile(text) == tuple(hs)


def test_both_forms_and_head_first() -> None:
    text = "# head first\nnode0\nnode1:4\nnode2 slots=2 max_slots=8\n198.18.0.13\n"
    assert parse_hostfile(text) == (Host("node0"), Host("node1", 4), Host("node2", 2),
                                    Host("198.18.0.13"))


@pytest.mark.parametrize(("text", "message"), [
    ("", "lists no hosts"),
    ("# only comments\n\n", "lists no hosts"),
    ("a\nb\na:2\n", "appears twice"),
    ("a:0\n", "bad slot count '0'"),
    ("a:x\n", "bad slot count 'x'"),
    ("a slots=-1\n", "bad slot count '-1'"),
    ("a extra\n", "unexpected 'extra'"),
    ("bad_name!\n", "is not a host name"),
])
def test_bad_hostfiles(text: str, message: str) -> None:
    with pytest.raises(BadInput, match=message) as e:
        parse_hostfile(text, "hf")
    assert e.value.exit_code == 2


def test_unresolvable_name() -> None:
    check_resolvable([Host("localhost")])
    with pytest.raises(BadInput, match="does not resolve"):
        check_resolvable([Host("no-such-host.invalid")])


@pytest.mark.parametrize("line",
                         ["node1 slots=2", "node1 slots = 2", "node1 slots= 2", "node1 slots =2",
                          "node1\tslots\t=\t2"])
def test_open_mpi_slots_with_spaces_around_the_equals(line: str) -> None:
    assert parse_hostfile(line) == (Host("node1", 2),)


def test_host_key_refusals_are_told_apart() -> None:
    from cpudist.ssh.reach import host_key_problem

    never = ("No ED25519 host key is known for node3 and you have requested strict checking.\n"
             "Host key verification failed.")
    changed = ("@@@@@@@@@@@\n@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n"
               "Host key verification failed.")
    unknown = host_key_problem("node3", never)
    assert (unknown is not None and "no host key of node3 is pinned" in unknown[0]
            and "ssh-setup" in unknown[1])
    moved = host_key_problem("node3", changed)
    assert (moved is not None and "does not match the pinned one" in moved[0]
            and "hosts forget node3" in moved[1])
    assert host_key_problem("node3", "Connection refused") is None
