"""The object store interface: files by key under one location (an S3 bucket and prefix).

The checkpoint mirror (cpudist/train/durable.py) copies through it; a provider implements it (S3:
cpudist/cloud/aws/objects.py). A leaf, so neither side imports the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from cpudist.errors import BadInput, CpudistError


class StoreError(CpudistError):
    """An object store call failed; `code` keeps the provider's error code (the mirror says what it
    was doing)."""

    def __init__(self, message: str, hint: str | None = None, code: str = "") -> None:
        super().__init__(message, hint)
        self.hint, self.code = hint, code


class StoreBadSetup(StoreError, BadInput):
    """The store refused the credentials (missing, unknown, wrong secret): the user's setup, exit
    code 2."""


class ObjectStore(Protocol):
    """Files by key under one location (an S3 bucket and prefix); failures raise StoreError."""

    url: str  # the location, for messages

    def keys(self, under: str = "") -> list[str]:
        """Every key that starts with `under`."""
        ...

    def put(self, path: Path, key: str) -> None:
        """Copy a local file to `key`."""
        ...

    def get(self, key: str, path: Path) -> None:
        """Copy `key` into a local file."""
        ...

    def delete(self, keys: Sequence[str]) -> None:
        """Delete keys; a missing one is no error."""
        ...

    def probe(self, timeout_s: float) -> None:
        """One cheap call that the store answers now (no retries, given up after about `timeout_s`);
        StoreError naming the endpoint when it does not. The run's watch of the store calls it
        (train/store_watch.py)."""
        ...
