"""Hosts of a job: the head node first, each with the ranks it may take."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Host:
    """One node of the cluster."""

    name: str
    slots: int


def local_hosts(slots: int) -> tuple[Host, ...]:
    """This machine as a one-node cluster."""
    return (Host("localhost", slots),)
