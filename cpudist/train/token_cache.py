"""Tokenized splits kept on each node: a re-run with the same rows, tokenizer and length tokenizes
nothing.

The key is a digest of what decides the token ids: the rows' texts (after --max-train-samples and
friends), the tokenizer's whole serialized state (its vocabulary, normalizer, pre-tokenizer and
post-processor, as the fast tokenizer's `to_str()` writes them, less the truncation and padding its
last call left set), its class and padding id, and the length rows are truncated to. Labels are not
part of it: they come from the rows each time. A slow (Python) tokenizer has no such serialization,
so its rows are tokenized every time. Entries live in ~/.cpudist/cache/tokens on each node
(CPUDIST_HOME moves it); deleting the folder only costs a tokenization.

Entries are safetensors files (flat int32 ids plus row offsets; no pickle) written under a temporary
name and renamed, so ranks of one node that tokenize at once leave one whole file; an entry that
cannot be read is tokenized again and replaced.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from cpudist.train.data import Split
from cpudist.train.features import Encoded, encode

FORMAT = b"cpudist-tokens-1"


def key(split: Split, tokenizer: object, max_len: int) -> str | None:
    """The cache key of this split tokenized this way; None when the tokenizer cannot be
    fingerprinted."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    state = json.loads(backend.to_str())
    # what the last call left set (max_len below decides truncation)
    for transient in ("truncation", "padding"):
        state.pop(transient, None)
    h = hashlib.sha256(FORMAT)
    for part in (type(tokenizer).__name__, json.dumps(state, sort_keys=True), str(max_len),
                 str(getattr(tokenizer, "pad_token_id", None)), str(len(split.texts)),
                 str(len(split))):
        h.update(part.encode() + b"\0")
    for column in split.texts:
        for text in column:
            h.update(text.encode("utf-8", "surrogatepass") + b"\0")
    return h.hexdigest()


def _flat(rows: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([0] + [len(r) for r in rows], dtype=torch.int64)
    return torch.tensor(list(itertools.chain.from_iterable(rows)),
                        dtype=torch.int32), lengths.cumsum(0)


def _rows(flat: torch.Tensor, offsets: torch.Tensor) -> list[list[int]] | None:
    """The rows back, or None when the offsets do not cut `flat` into whole rows (a damaged
    entry)."""
    values, ends = flat.tolist(), offsets.tolist()
    if (not ends or ends[0] != 0 or ends[-1] != len(values)
            or any(b < a for a, b in itertools.pairwise(ends))):
        return None
    return [values[a:b] for a, b in itertools.pairwise(ends)]


def _save(path: Path, data: Encoded) -> None:
    tensors = dict(zip(("ids", "ids_offsets"), _flat(data.input_ids), strict=True))
    if data.token_type_ids is not None:
        tensors.update(zip(("types", "types_offsets"), _flat(data.token_type_ids), strict=True))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_file(tensors, str(tmp), metadata={"pad_id": str(data.pad_id)})
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def _load(path: Path, split: Split) -> Encoded | None:
    """The entry at `path` for `split`, or None when it is missing or not whole."""
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            t = {name: f.get_tensor(name)
                 for name in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    except (OSError, SafetensorError):
        return None
    ids = _rows(t["ids"], t["ids_offsets"]) if {"ids", "ids_offsets"} <= t.keys() else None
    has_types = {"types", "types_offsets"} <= t.keys()
    types = _rows(t["types"], t["types_offsets"]) if has_types else None
    if ids is None or len(ids) != len(split) or (has_types
                                                 and (types is None or len(types) != len(ids))):
        return None
    if "pad_id" not in meta or not meta["pad_id"].lstrip("-").isdigit():
        return None
    return Encoded(ids, types, list(split.labels), int(meta["pad_id"]))


def cached_encode(split: Split, tokenizer: object, max_len: int,
                  folder: Path | None) -> tuple[Encoded, bool]:
    """(the split tokenized, whether it came from the cache): `encode` through the node's cache in
    `folder`."""
    digest = key(split, tokenizer, max_len) if folder is not None else None
    if digest is None or folder is None:
        return encode(split, tokenizer, max_len), False
    path = folder / f"{digest}.safetensors"
    if path.exists() and (hit := _load(path, split)) is not None:
        return hit, True
    data = encode(split, tokenizer, max_len)
    # a full or read-only disk costs the next run a tokenization, not this run
    with contextlib.suppress(OSError):
        _save(path, data)
    return data, False
