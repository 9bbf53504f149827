"""The sync as `cpudist run`'s flags ask it (TrainConfig.sync): ASKED, the flags read into a
SyncSpec, and the check that refuses a knob of one strategy given with another, before anything
starts. The strategies themselves, their labels and records: cpudist/strategies.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from cpudist.errors import BadInput
from cpudist.strategies import COMPRESSIONS, STRATEGIES, TABLE, SyncSpec

# besides a knob's default, values that ask nothing of a strategy
NOT_GIVEN = {"grad_compression": ("none",)}
# what `cpudist run` asks when no sync flag is given (TrainConfig.sync's default)
ASKED = SyncSpec(grad_compression="auto")


def flag(f: dataclasses.Field[Any]) -> str:
    """A SyncSpec field's flag, without its dashes: the strategy is --sync."""
    return str(f.metadata.get("flag", f.name))


def asked(options: Mapping[str, Any]) -> SyncSpec:
    """The SyncSpec in options named as the flags name them (`cpudist run`'s, a rank's command
    line); --grad-compression powersgd:RANK as its two fields, the knobs not in options as ASKED."""
    given = {f.name: options[flag(f)] for f in dataclasses.fields(SyncSpec) if flag(f) in options}
    if "grad_compression" in given:
        given["grad_compression"], rank = parse_compression(str(given["grad_compression"]))
        if ":" in str(options["grad_compression"]):
            given["powersgd_rank"] = rank
    return dataclasses.replace(ASKED, **given)


def parse_compression(text: str) -> tuple[str, int]:
    """`powersgd:2` -> ("powersgd", 2); `bf16` -> ("bf16", 1); `auto` -> ("auto", 1) (the rank
    resolves it: config.resolved_compression); a bad value is one-line BadInput."""
    name, _, rank = text.partition(":")
    if text == "auto":
        return text, 1
    if name not in COMPRESSIONS or (rank
                                    and (name != "powersgd" or not rank.isdigit()
                                         or int(rank) < 1)):
        raise BadInput(f"--grad-compression {text}: not one of auto, none, bf16, fp16, "
                       "powersgd[:RANK]",
                       "e.g. --grad-compression bf16, or powersgd:2 for a rank-2 PowerSGD")
    return name, int(rank or 1)


def check_sync(sync: SyncSpec) -> None:
    """Knobs of one strategy given with another are mistakes: say so before anything starts.

    `sync`: as asked (TrainConfig.sync); a knob counts as given when it is not ASKED's.
    """
    row = TABLE.get(sync.strategy)
    if row is None:
        raise BadInput(f"--sync {sync.strategy}: unknown", f"Use one of: {', '.join(STRATEGIES)}")
    unset = {f.name: (getattr(ASKED, f.name), *NOT_GIVEN.get(f.name, ()))
             for f in dataclasses.fields(ASKED)}
    every = {k for r in TABLE.values() for k in r.knobs}
    # the most specific knob first: one that a single strategy takes says best which --sync was
    # meant
    for knob in sorted(every, key=lambda k: (sum(k in r.knobs for r in TABLE.values()), _order(k))):
        if knob in row.knobs or getattr(sync, knob) in unset[knob]:
            continue
        flag, takers = "--" + knob.replace("_", "-"), [r.name for r in TABLE.values()
                                                       if knob in r.knobs]
        hint = (f"Add --sync {takers[0]}, or drop {flag}" if len(takers) == 1
                else f"Use --sync {takers[0]} (or {', '.join(takers[1:])}) with it, or drop {flag}")
        raise BadInput(f"{flag} applies to --sync {' and '.join(takers)}, not {row.name}", hint)
    row.check(sync)


def _order(knob: str) -> int:
    """Where a knob comes in the table's rows, first row first."""
    return [k for r in TABLE.values() for k in r.knobs].index(knob)
