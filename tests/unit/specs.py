"""RunSpec for the launch tests: its launch fields (np, ppn, env, secrets, batch ...) given flat
beside the rest."""

from __future__ import annotations

import dataclasses
from typing import Any

from cpudist.launch.spec import LaunchOptions, RunSpec

# as asked only: launcher, ssh and allocator are also RunSpec's own, resolved
ASKED = ({f.name for f in dataclasses.fields(LaunchOptions)}
         - {f.name for f in dataclasses.fields(RunSpec)})


def run_spec(**given: Any) -> RunSpec:
    """A RunSpec whose LaunchOptions holds the given fields of it."""
    launch = LaunchOptions(**{k: v for k, v in given.items() if k in ASKED})
    return RunSpec(launch=launch, **{k: v for k, v in given.items() if k not in ASKED})
