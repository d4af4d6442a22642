"""Statistics across seeds, as rliable defines them, with numpy/scipy: the interquartile mean (IQM), the mean,
percentile bootstrap 95% confidence intervals (stratified by task when runs of several tasks are pooled), and
the probability of improvement of one group over another."""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple

import numpy as np
from scipy import stats as st


def iqm(x: Sequence[float]) -> float:
    """Interquartile mean: the mean of the middle 50% (``scipy.stats.trim_mean(x, 0.25)``)."""
    x = np.asarray(x, float)
    x = x[np.isfinite(x)]
    return float(st.trim_mean(x, 0.25)) if len(x) else float("nan")


def mean(x: Sequence[float]) -> float:
    x = np.asarray(x, float)
    x = x[np.isfinite(x)]
    return float(x.mean()) if len(x) else float("nan")


def _rowwise(stat: Callable[[np.ndarray], float], samples: np.ndarray) -> np.ndarray:
    """``stat`` of each row of ``samples`` (vectorized for the IQM and the mean)."""
    if stat is iqm:
        return st.trim_mean(samples, 0.25, axis=1)
    if stat is mean:
        return samples.mean(axis=1)
    return np.array([stat(row) for row in samples])


def bootstrap_ci(x: Sequence[float], stat: Callable[[np.ndarray], float] = iqm, reps: int = 2000,
                 alpha: float = 0.05, strata: Optional[Sequence] = None, seed: int = 0) -> Tuple[float, float]:
    """Percentile bootstrap CI of ``stat`` over runs: resample runs with replacement (within each stratum,
    e.g. task, when ``strata`` is given), ``reps`` times."""
    x = np.asarray(x, float)
    keep = np.isfinite(x)
    x = x[keep]
    if len(x) == 0:
        return float("nan"), float("nan")
    if strata is None:
        groups = [np.arange(len(x))]
    else:
        s = np.asarray(strata, dtype=object)[keep]
        groups = [np.flatnonzero(s == v) for v in dict.fromkeys(s)]
    rng = np.random.default_rng(seed)
    idx = np.concatenate([g[rng.integers(0, len(g), (reps, len(g)))] for g in groups], axis=1)
    vals = _rowwise(stat, x[idx])
    lo, hi = np.percentile(vals, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return float(lo), float(hi)


def probability_of_improvement(x: Sequence[float], y: Sequence[float]) -> float:
    """P(X > Y) + P(X = Y) / 2 for a run X of one group and a run Y of the other (rliable's definition,
    the Mann-Whitney U statistic over n*m)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    x, y = x[np.isfinite(x)], y[np.isfinite(y)]
    if not len(x) or not len(y):
        return float("nan")
    gt = (x[:, None] > y[None, :]).mean()
    eq = (x[:, None] == y[None, :]).mean()
    return float(gt + 0.5 * eq)
