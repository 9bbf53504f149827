"""GLUE's metrics (those of HF's `evaluate` "glue" module) in numpy.

Written here rather than called from scikit-learn and scipy, on purpose: importing `sklearn.metrics`
and `scipy.stats` (which pull pandas) took 4.4-4.7 s of rank 0's first evaluation while every other
rank waited on it, measured on this 2-core machine for a 5-step `tiny` run whose training took 0.3
s. The five formulas are short; tests/unit/test_metrics_equal_libraries.py checks each against
scikit-learn's and scipy's own functions on generated inputs (ties, constant inputs, absent
classes), so a difference would fail there.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def accuracy(labels: np.ndarray, predictions: np.ndarray) -> float:
    """The share of rows called right (sklearn's accuracy_score)."""
    return float(np.mean(labels == predictions)) if len(labels) else 0.0


def _f1_of(labels: np.ndarray, predictions: np.ndarray, positive: float) -> float:
    tp = float(np.sum((predictions == positive) & (labels == positive)))
    fp = float(np.sum((predictions == positive) & (labels != positive)))
    fn = float(np.sum((predictions != positive) & (labels == positive)))
    denominator = 2 * tp + fp + fn
    # zero_division=0, as GLUE's scripts score it
    return 2 * tp / denominator if denominator else 0.0


def f1(labels: np.ndarray, predictions: np.ndarray) -> float:
    """F1 of class 1 (sklearn's f1_score, binary, zero_division=0)."""
    return _f1_of(labels, predictions, 1)


def f1_macro(labels: np.ndarray, predictions: np.ndarray) -> float:
    """The mean F1 over every class seen in labels or predictions (sklearn's average="macro")."""
    classes = np.union1d(labels, predictions)
    return float(np.mean([_f1_of(labels, predictions, c)
                          for c in classes])) if len(classes) else 0.0


def matthews(labels: np.ndarray, predictions: np.ndarray) -> float:
    """Matthews' correlation, multiclass as sklearn's matthews_corrcoef computes it (0 where
    undefined)."""
    classes, codes = np.unique(np.concatenate([labels, predictions]), return_inverse=True)
    truth, called = codes[:len(labels)], codes[len(labels):]
    confusion = np.zeros((len(classes), len(classes)), dtype=np.float64)
    np.add.at(confusion, (truth, called), 1)
    t_sum, p_sum = confusion.sum(axis=1), confusion.sum(axis=0)
    n, correct = confusion.sum(), np.trace(confusion)
    cov_tp = correct * n - np.dot(t_sum, p_sum)
    cov_pp = n * n - np.dot(p_sum, p_sum)
    cov_tt = n * n - np.dot(t_sum, t_sum)
    return float(cov_tp / np.sqrt(cov_tt * cov_pp)) if cov_tt * cov_pp else 0.0


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson's r (scipy's pearsonr statistic; NaN for a constant input or fewer than 2 rows)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(x) < 2:
        return float("nan")
    xm, ym = x - x.mean(), y - y.mean()
    sx, sy = np.abs(xm).max(), np.abs(ym).max()
    if sx == 0 or sy == 0 or x.max() == x.min() or y.max() == y.min():
        return float("nan")
    # scaled first, as scipy does: tiny spreads would underflow when squared
    xm, ym = xm / sx, ym / sy
    nx, ny = np.linalg.norm(xm), np.linalg.norm(ym)
    return float(np.clip(np.dot(xm / nx, ym / ny), -1.0, 1.0))


def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing their mean rank (scipy's rankdata, method="average")."""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="mergesort")
    ordered = values[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    ends = np.r_[starts[1:], len(values)]
    ranks = np.empty(len(values), dtype=np.float64)
    # mean of ranks start+1 .. end
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho: Pearson's r of the average ranks (scipy's spearmanr statistic)."""
    return pearson(average_ranks(x), average_ranks(y))


METRICS = {"accuracy": accuracy, "f1": f1, "f1_macro": f1_macro, "matthews_correlation": matthews,
           "pearson": pearson, "spearmanr": spearman}


def compute_metrics(names: Sequence[str], predictions: np.ndarray,
                    labels: np.ndarray) -> dict[str, float]:
    """Each named metric for predicted class ids (or scores, for regression) against labels."""
    out: dict[str, float] = {}
    for name in names:
        if name not in METRICS:
            raise ValueError(f"unknown metric {name}")
        out[name] = METRICS[name](np.asarray(labels), np.asarray(predictions))
    return out
