"""cpudist's numpy metrics (cpudist/train/metrics.py) equal scikit-learn's and scipy's, which GLUE's
own scripts and HF's `evaluate` call, on generated inputs: class ids with absent classes and
all-one-class columns, scores with ties and constant columns. scikit-learn and scipy are test
dependencies only; the ranks no longer import them."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy.stats import pearsonr, rankdata, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from cpudist.train.metrics import average_ranks, compute_metrics

ROWS = st.integers(min_value=1, max_value=60)


@st.composite
def calls(draw: st.DrawFn, classes: int) -> tuple[np.ndarray, np.ndarray]:
    n = draw(ROWS)
    ids = st.lists(st.integers(min_value=0, max_value=classes - 1), min_size=n, max_size=n)
    return np.array(draw(ids), dtype=np.float64), np.array(draw(ids), dtype=np.float64)


@st.composite
def scores(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    n = draw(st.integers(min_value=2, max_value=60))
    # few distinct values: ties and constant columns come up often
    value = (st.sampled_from([0.0, 0.5, 1.0, 2.5, 3.0, 4.75, 5.0])
             | st.floats(-10, 10, allow_nan=False))
    return (np.array(draw(st.lists(value, min_size=n, max_size=n))),
            np.array(draw(st.lists(value, min_size=n, max_size=n))))


def same(ours: float, theirs: float) -> bool:
    return (math.isnan(ours) and math.isnan(theirs)) or ours == pytest.approx(theirs, abs=1e-9)


@settings(max_examples=120, deadline=None)
@given(calls(2))
def test_binary_accuracy_f1_and_matthews(pair: tuple[np.ndarray, np.ndarray]) -> None:
    labels, predictions = pair
    ours = compute_metrics(("accuracy", "f1", "matthews_correlation"), predictions, labels)
    with warnings.catch_warnings():
        # sklearn warns where MCC is undefined (one class) and says 0
        warnings.simplefilter("ignore")
        assert same(ours["accuracy"], accuracy_score(labels, predictions))
        assert same(ours["f1"], f1_score(labels, predictions, zero_division=0))
        assert same(ours["matthews_correlation"], matthews_corrcoef(labels, predictions))


@settings(max_examples=120, deadline=None)
@given(calls(6))
def test_multiclass_macro_f1_and_matthews(pair: tuple[np.ndarray, np.ndarray]) -> None:
    labels, predictions = pair
    ours = compute_metrics(("accuracy", "f1_macro", "matthews_correlation"), predictions, labels)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert same(ours["accuracy"], accuracy_score(labels, predictions))
        assert same(ours["f1_macro"],
                    f1_score(labels, predictions, average="macro", zero_division=0))
        assert same(ours["matthews_correlation"], matthews_corrcoef(labels, predictions))


@settings(max_examples=120, deadline=None)
@given(scores())
# a spread whose square underflows (CI found it)
@example((np.array([0.0, 0.5]), np.array([0.0, 6.19182914e-187])))
def test_pearson_and_spearman(pair: tuple[np.ndarray, np.ndarray]) -> None:
    predictions, labels = pair
    ours = compute_metrics(("pearson", "spearmanr"), predictions, labels)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns on a constant input and says NaN
        assert same(ours["pearson"], float(pearsonr(predictions, labels)[0]))
        assert same(ours["spearmanr"], float(spearmanr(predictions, labels)[0]))


@given(st.lists(st.sampled_from([1.0, 2.0, 2.0, 3.0, -1.0]) | st.floats(-5, 5, allow_nan=False),
                max_size=40))
def test_average_ranks_are_scipys(values: list[float]) -> None:
    assert np.array_equal(average_ranks(np.array(values)), rankdata(values, method="average"))


def test_an_unknown_metric_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown metric"):
        compute_metrics(("auc",), np.zeros(3), np.zeros(3))
