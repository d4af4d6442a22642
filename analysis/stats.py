"""Statistics across runs, as rliable defines them (Agarwal et al. 2021, "Deep RL at the Edge of the Statistical
Precipice"), with numpy/scipy only (rliable itself does not import with pandas 3).

Scores are held per task: a list with one 1-d array of run scores per task (tasks may have different numbers of
runs). Every aggregate reduces the last axis of each task's array, so the same function computes the point
estimate (arrays of shape ``(n,)``) and all bootstrap replicates at once (arrays of shape ``(reps, n)``).

- ``iqm``: the interquartile mean of all runs of all tasks pooled (``scipy.stats.trim_mean(x, 0.25)``: drops
  ``int(0.25 n)`` runs at each end, as rliable);
- ``mean`` / ``median``: the mean / median over tasks of each task's mean score;
- ``optimality_gap``: ``gamma - mean(min(score, gamma))`` over all runs of all tasks (normalized scores);
- ``profile``: the performance profile, the fraction of runs whose score exceeds each ``tau``, averaged over tasks;
- ``probability_of_improvement``: P(X > Y) + P(X = Y) / 2 for a run X of one group and a run Y of the other on
  the same task (the Mann-Whitney U statistic over n m), averaged over tasks;
- ``recovered``: the fraction of a reference's cost (its score at a treatment level against its baseline) a
  method recovers at that level, e.g. what PPO loses to lag 8 and a remedy wins back;
- ``interval``: the percentile bootstrap 95% CI of any of them, resampling runs with replacement within each task
  (stratified bootstrap); two-sample statistics resample both samples, independently or, when ``paired``, with
  one index per task shared by both (runs matched by seed); ``interval_k`` does so for any number of samples.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
from scipy import stats as st

Tasks = List[np.ndarray]
ArrayLike = Union[Sequence[float], np.ndarray]


def as_tasks(x: ArrayLike, tasks: Optional[Sequence] = None) -> Tasks:
    """Scores (and the task of each) -> one float array per task, in order of first appearance; NaNs dropped."""
    x = np.asarray(x, float)
    if tasks is None:
        out = [x]
    else:
        t = np.asarray(tasks, dtype=object)
        out = [x[t == v] for v in dict.fromkeys(t.tolist())]
    return [a[np.isfinite(a)] for a in out]


def _nonempty(tasks: Tasks) -> bool:
    return bool(tasks) and all(a.shape[-1] > 0 for a in tasks)


# ---- aggregates (each reduces the last axis of every task's array) ---------------------------------------
def iqm(tasks: Union[Tasks, ArrayLike]) -> Union[float, np.ndarray]:
    """Interquartile mean of all runs of all tasks pooled."""
    tasks = _tasks(tasks)
    if not _nonempty(tasks):
        return float("nan")
    return _scalar(st.trim_mean(np.concatenate(tasks, axis=-1), 0.25, axis=-1))


def mean(tasks: Union[Tasks, ArrayLike]) -> Union[float, np.ndarray]:
    """Mean over tasks of each task's mean score (the plain mean for one task)."""
    tasks = _tasks(tasks)
    if not _nonempty(tasks):
        return float("nan")
    return _scalar(np.mean(np.stack([a.mean(axis=-1) for a in tasks], axis=-1), axis=-1))


def median(tasks: Union[Tasks, ArrayLike]) -> Union[float, np.ndarray]:
    """Median over tasks of each task's mean score (rliable's aggregate median)."""
    tasks = _tasks(tasks)
    if not _nonempty(tasks):
        return float("nan")
    return _scalar(np.median(np.stack([a.mean(axis=-1) for a in tasks], axis=-1), axis=-1))


def optimality_gap(tasks: Union[Tasks, ArrayLike], gamma: float = 1.0) -> Union[float, np.ndarray]:
    """``gamma`` minus the mean of the scores clipped at ``gamma``, over all runs of all tasks (lower is better)."""
    tasks = _tasks(tasks)
    if not _nonempty(tasks):
        return float("nan")
    return _scalar(gamma - np.mean(np.minimum(np.concatenate(tasks, axis=-1), gamma), axis=-1))


def profile(tasks: Union[Tasks, ArrayLike], taus: ArrayLike) -> np.ndarray:
    """Performance profile: for each tau, the fraction of runs with score > tau, averaged over tasks. Shape
    ``(..., len(taus))``."""
    tasks = _tasks(tasks)
    taus = np.asarray(taus, float)
    if not _nonempty(tasks):
        return np.full(len(taus), np.nan)
    return np.mean(np.stack([(a[..., :, None] > taus).mean(axis=-2) for a in tasks], axis=0), axis=0)


def seed_range(x: ArrayLike) -> Tuple[float, float]:
    """The smallest and largest run score (what a report shows instead of a CI below 5 runs)."""
    x = np.asarray(x, float)
    x = x[np.isfinite(x)]
    return (float(x.min()), float(x.max())) if len(x) else (float("nan"), float("nan"))


def probability_of_improvement(x: Union[Tasks, ArrayLike], y: Union[Tasks, ArrayLike]) -> Union[float, np.ndarray]:
    """P(X > Y) + P(X = Y) / 2 per task, averaged over tasks; ``x`` and ``y`` list the same tasks in the same
    order."""
    x, y = _tasks(x), _tasks(y)
    if len(x) != len(y):
        raise ValueError(f"probability of improvement needs the same tasks on both sides ({len(x)} vs {len(y)})")
    if not (_nonempty(x) and _nonempty(y)):
        return float("nan")
    per_task = []
    for a, b in zip(x, y):
        d = a[..., :, None] - b[..., None, :]
        per_task.append((d > 0).mean(axis=(-2, -1)) + 0.5 * (d == 0).mean(axis=(-2, -1)))
    return _scalar(np.mean(np.stack(per_task, axis=-1), axis=-1))


# ---- stratified bootstrap --------------------------------------------------------------------------------
def _resample(tasks: Tasks, reps: int, rng: np.random.Generator) -> Tasks:
    return [a[rng.integers(0, len(a), (reps, len(a)))] for a in tasks]


# a percentile interval needs (nearly) every replicate: one computed from the finite few would be conditioned on
# the resamples that happened to avoid what made the others undefined (e.g. a cost of 0 in a ratio)
MIN_FINITE_REPLICATES = 0.95


def _percentile(vals: np.ndarray, alpha: float) -> Tuple[float, float]:
    vals = np.asarray(vals, float)
    finite = vals[np.isfinite(vals)]
    if not len(finite) or len(finite) < MIN_FINITE_REPLICATES * len(vals):
        return float("nan"), float("nan")
    vals = finite
    lo, hi = np.percentile(vals, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return float(lo), float(hi)


def replicates(stat: Callable, tasks: Union[Tasks, ArrayLike], reps: int = 2000, seed: int = 0) -> np.ndarray:
    """``stat`` of ``reps`` stratified bootstrap resamples (runs drawn with replacement within each task)."""
    return np.asarray(stat(_resample(_tasks(tasks), reps, np.random.default_rng(seed))))


def replicates2(stat2: Callable, x: Union[Tasks, ArrayLike], y: Union[Tasks, ArrayLike], paired: bool = False,
                reps: int = 2000, seed: int = 0) -> np.ndarray:
    """``stat2(x, y)`` of ``reps`` resamples: each task's runs of ``x`` and of ``y`` drawn independently
    (rliable's stratified independent bootstrap), or with one shared index per task when ``paired`` (``x`` and
    ``y`` then hold the same seeds in the same order, task by task)."""
    x, y = _tasks(x), _tasks(y)
    rng = np.random.default_rng(seed)
    if paired:
        if [len(a) for a in x] != [len(b) for b in y]:
            raise ValueError("paired resampling needs the same number of runs per task on both sides")
        idx = [rng.integers(0, len(a), (reps, len(a))) for a in x]
        xs, ys = [a[i] for a, i in zip(x, idx)], [b[i] for b, i in zip(y, idx)]
    else:
        xs, ys = _resample(x, reps, rng), _resample(y, reps, rng)
    return np.asarray(stat2(xs, ys))


def interval(stat: Callable, tasks: Union[Tasks, ArrayLike], reps: int = 2000, alpha: float = 0.05,
             seed: int = 0) -> Tuple[float, float, float]:
    """(point estimate, CI low, CI high) of ``stat`` with the stratified percentile bootstrap."""
    tasks = _tasks(tasks)
    if not _nonempty(tasks):
        return float("nan"), float("nan"), float("nan")
    lo, hi = _percentile(replicates(stat, tasks, reps, seed), alpha)
    return float(stat(tasks)), lo, hi


def interval2(stat2: Callable, x: Union[Tasks, ArrayLike], y: Union[Tasks, ArrayLike], paired: bool = False,
              reps: int = 2000, alpha: float = 0.05, seed: int = 0) -> Tuple[float, float, float]:
    """(point, CI low, CI high) of a two-sample statistic ``stat2(x, y)`` (resampling as :func:`replicates2`)."""
    x, y = _tasks(x), _tasks(y)
    if not (_nonempty(x) and _nonempty(y)):
        return float("nan"), float("nan"), float("nan")
    lo, hi = _percentile(replicates2(stat2, x, y, paired, reps, seed), alpha)
    return float(stat2(x, y)), lo, hi


def interval_k(stat_k: Callable, groups: Sequence[Union[Tasks, ArrayLike]], paired: bool = False, reps: int = 2000,
               alpha: float = 0.05, seed: int = 0) -> Tuple[float, float, float]:
    """(point, CI low, CI high) of a statistic of several samples, ``stat_k(*groups)``: each group resampled
    within each task, independently or, when ``paired``, with one index per task shared by every group (the
    groups then hold the same seeds in the same order, task by task)."""
    groups = [_tasks(g) for g in groups]
    if not all(map(_nonempty, groups)):
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    if paired:
        if len({tuple(len(a) for a in g) for g in groups}) != 1:
            raise ValueError("paired resampling needs the same number of runs per task in every group")
        idx = [rng.integers(0, len(a), (reps, len(a))) for a in groups[0]]
        draws = [[a[i] for a, i in zip(g, idx)] for g in groups]
    else:
        draws = [_resample(g, reps, rng) for g in groups]
    with np.errstate(divide="ignore", invalid="ignore"):
        lo, hi = _percentile(np.asarray(stat_k(*draws), float), alpha)
        return float(stat_k(*groups)), lo, hi


def recovered(stat: Callable) -> Callable:
    """The fraction of a reference's cost a method recovers, ``(stat(m) - stat(r)) / (stat(r0) - stat(r))``:
    ``m`` the method and ``r`` the reference at one treatment level (e.g. lag 8), ``r0`` the reference at its
    baseline (lag 0). 0 = no better than the reference, 1 = the whole cost recovered (back at the baseline's
    score), above 1 = better than the baseline, below 0 = worse than the reference; higher scores are better."""
    def f(m, r, r0):
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.divide(np.subtract(stat(m), stat(r)), np.subtract(stat(r0), stat(r)))
    return f


def difference(stat: Callable) -> Callable:
    """``stat(x) - stat(y)`` as a two-sample statistic."""
    return lambda x, y: stat(x) - stat(y)


def ratio(stat: Callable) -> Callable:
    """``stat(x) / stat(y)`` as a two-sample statistic."""
    def f(x, y):
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.divide(stat(x), stat(y))
    return f


def difference_of_differences(stat: Callable, a: Tasks, a0: Tasks, b: Tasks, b0: Tasks, paired_a: bool,
                              paired_b: bool, reps: int = 2000, alpha: float = 0.05,
                              seed: int = 0) -> Tuple[float, float, float]:
    """(stat(a) - stat(a0)) - (stat(b) - stat(b0)) with its percentile bootstrap CI: the difference in cost of
    two families (e.g. two algorithms, each against its own baseline). Each pair is resampled by seed when
    paired, the two families independently."""
    a, a0, b, b0 = map(_tasks, (a, a0, b, b0))
    point = (stat(a) - stat(a0)) - (stat(b) - stat(b0))
    if not all(map(_nonempty, (a, a0, b, b0))):
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)

    def draw(x, x0, paired):
        if paired:
            idx = [rng.integers(0, len(t), (reps, len(t))) for t in x]
            return [t[i] for t, i in zip(x, idx)], [t[i] for t, i in zip(x0, idx)]
        return _resample(x, reps, rng), _resample(x0, reps, rng)

    (ra, ra0), (rb, rb0) = draw(a, a0, paired_a), draw(b, b0, paired_b)
    lo, hi = _percentile(np.asarray((stat(ra) - stat(ra0)) - (stat(rb) - stat(rb0))), alpha)
    return float(point), lo, hi


def profile_band(tasks: Union[Tasks, ArrayLike], taus: ArrayLike, reps: int = 2000, alpha: float = 0.05,
                 seed: int = 0) -> Dict[str, np.ndarray]:
    """The performance profile at ``taus`` with a pointwise stratified-bootstrap CI band."""
    tasks = _tasks(tasks)
    taus = np.asarray(taus, float)
    point = profile(tasks, taus)
    if not _nonempty(tasks):
        return {"tau": taus, "profile": point, "low": point, "high": point}
    boot = profile(_resample(tasks, reps, np.random.default_rng(seed)), taus)
    lo, hi = np.percentile(boot, [100 * alpha / 2, 100 * (1 - alpha / 2)], axis=0)
    return {"tau": taus, "profile": point, "low": lo, "high": hi}


# ---- helpers ---------------------------------------------------------------------------------------------
def _tasks(x) -> Tasks:
    """Tasks as given (a list of arrays: a run's scores, NaNs dropped as :func:`as_tasks` drops them; or resampled
    [reps, n] arrays, kept), or built by :func:`as_tasks`."""
    if isinstance(x, list) and x and isinstance(x[0], np.ndarray):
        return [a[np.isfinite(a)] if a.ndim == 1 else a for a in x]
    return as_tasks(x)


def _scalar(v):
    v = np.asarray(v)
    return float(v) if v.ndim == 0 else v


AGGREGATES: Dict[str, Callable] = {"median": median, "iqm": iqm, "mean": mean, "optimality_gap": optimality_gap}
