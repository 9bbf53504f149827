from __future__ import annotations

import numpy as np
import pytest

from cpudist.train.metrics import compute_metrics
from cpudist.wire import events


def test_glue_metrics() -> None:
    preds, labels = np.array([1, 0, 1, 1]), np.array([1, 0, 0, 1])
    m = compute_metrics(("accuracy", "f1", "matthews_correlation"), preds, labels)
    assert m["accuracy"] == 0.75 and m["f1"] == pytest.approx(0.8)
    assert m["matthews_correlation"] == pytest.approx(0.5773502691896258)
    r = compute_metrics(("pearson", "spearmanr"), np.array([1.0, 2.0, 3.5]),
                        np.array([1.0, 2.0, 3.0]))
    assert r["spearmanr"] == pytest.approx(1.0) and 0.99 < r["pearson"] <= 1.0


def test_event_lines(capsys: pytest.CaptureFixture[str]) -> None:
    events.emit("progress", step=3, total=5)
    line = capsys.readouterr().out.strip()
    assert events.parse("[vm:0] " + line) == {"event": "progress", "step": 3, "total": 5}
    assert events.parse("ordinary output") is None
    assert events.parse(events.MARKER + "{broken") is None
