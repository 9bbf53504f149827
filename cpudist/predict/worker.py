"""One `cpudist predict --np N` process: `python -m cpudist.predict.worker REQUEST.json RANK WORLD
OUT.json`.

REQUEST holds the settings and every row's texts; this process predicts rows RANK, RANK+WORLD, ...
and writes [[row, logits], ...] to OUT (renamed into place when complete). Progress goes to stdout
as event lines.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from cpudist.errors import CpudistError
from cpudist.predict.infer import run_shard
from cpudist.predict.source import Settings
from cpudist.wire import events


def main(argv: list[str]) -> int:
    request_path, rank, world, out_path = argv[0], int(argv[1]), int(argv[2]), Path(argv[3])
    request = json.loads(Path(request_path).read_text())
    settings = Settings(**request["settings"])
    texts = tuple(tuple(col) for col in request["texts"])
    try:
        pairs = run_shard(texts, rank, world, settings,
                          lambda n: events.emit(events.ROWS, rank=rank, rows=n))
    except CpudistError as e:
        print(e.format_message(), file=sys.stderr)
        return e.exit_code
    tmp = out_path.with_name(out_path.name + ".tmp")
    tmp.write_text(json.dumps(pairs))
    tmp.replace(out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
