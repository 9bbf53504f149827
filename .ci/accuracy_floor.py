#!/usr/bin/env python3
"""Exit 1 unless the last `done:` line in a log shows an accuracy above a floor: CI's check that the
README's main job learned (pretrained MiniLM on MRPC, where the majority class scores 0.684), not
only that it exited 0.

    python3 .ci/accuracy_floor.py LOG [FLOOR]      # FLOOR defaults to 0.75
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

FLOOR = 0.75
ACCURACY = re.compile(r"\baccuracy=(\d+(?:\.\d+)?)\b")


def done_accuracy(log: str) -> tuple[str | None, float | None]:
    """The last line that starts with `done:` and the accuracy it shows (None where either is
    missing)."""
    done = [line.strip() for line in log.splitlines() if line.startswith("done:")]
    found = ACCURACY.search(done[-1]) if done else None
    return (done[-1] if done else None), (float(found.group(1)) if found else None)


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print(__doc__, file=sys.stderr)
        return 2
    floor = float(argv[1]) if len(argv) == 2 else FLOOR
    line, accuracy = done_accuracy(Path(argv[0]).read_text(errors="replace"))
    if line is None:
        print(f"accuracy check: no `done:` line in {argv[0]}: the main job did not finish",
              file=sys.stderr)
        return 1
    if accuracy is None:
        print(f"accuracy check: the `done:` line shows no accuracy: {line}", file=sys.stderr)
        return 1
    if not accuracy > floor:
        print(f"accuracy check: FAILED: accuracy {accuracy} is not above {floor} (MRPC's majority "
              f"class scores 0.684): {line}", file=sys.stderr)
        return 1
    print(f"accuracy check: {accuracy} > {floor}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
