"""GLUE metrics with scikit-learn and scipy (`evaluate` fetches scripts, so it fails offline)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def compute_metrics(names: Sequence[str], predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Each named metric for predicted class ids (or scores, for regression) against labels."""
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    out: dict[str, float] = {}
    for name in names:
        if name == "accuracy":
            out[name] = float(accuracy_score(labels, predictions))
        elif name == "f1":
            out[name] = float(f1_score(labels, predictions, zero_division=0))
        elif name == "f1_macro":
            out[name] = float(f1_score(labels, predictions, average="macro", zero_division=0))
        elif name == "matthews_correlation":
            out[name] = float(matthews_corrcoef(labels, predictions))
        elif name == "pearson":
            out[name] = float(pearsonr(predictions, labels)[0])
        elif name == "spearmanr":
            out[name] = float(spearmanr(predictions, labels)[0])
        else:
            raise ValueError(f"unknown metric {name}")
    return out
