"""analysis.stats against slow reference implementations written from the definitions in Agarwal et al. 2021
("Deep RL at the Edge of the Statistical Precipice", the rliable paper): loops over runs, pairs and taus, and the
bootstrap distribution enumerated exactly (every resample of every task) for small samples."""
import itertools
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis import stats  # noqa: E402


# ---- slow references -----------------------------------------------------------------------------------------
def ref_iqm(tasks):
    """Pool every run of every task, sort, drop the bottom and top quarter (int(n/4) runs each: for n divisible
    by 4 exactly the paper's middle 50%; otherwise rliable's scipy.stats.trim_mean convention), average."""
    pooled = sorted(v for t in tasks for v in t)
    k = int(len(pooled) * 0.25)
    mid = pooled[k:len(pooled) - k]
    return sum(mid) / len(mid)


def ref_task_means(tasks):
    return [sum(t) / len(t) for t in tasks]


def ref_mean(tasks):
    m = ref_task_means(tasks)
    return sum(m) / len(m)


def ref_median(tasks):
    m = sorted(ref_task_means(tasks))
    n = len(m)
    return m[n // 2] if n % 2 else (m[n // 2 - 1] + m[n // 2]) / 2


def ref_optimality_gap(tasks, gamma=1.0):
    pooled = [v for t in tasks for v in t]
    return sum(gamma - min(v, gamma) for v in pooled) / len(pooled)  # the average shortfall from gamma


def ref_profile(tasks, tau):
    return sum(sum(1 for v in t if v > tau) / len(t) for t in tasks) / len(tasks)


def ref_poi(xs, ys):
    """Average over tasks of (1 / nm) sum_i sum_j S(x_i, y_j), S = 1 if x_i > y_j, 1/2 if equal, 0 otherwise."""
    per = []
    for x, y in zip(xs, ys):
        s = 0.0
        for a in x:
            for b in y:
                s += 1.0 if a > b else 0.5 if a == b else 0.0
        per.append(s / (len(x) * len(y)))
    return sum(per) / len(per)


def exact_bootstrap(stat, tasks):
    """Every stratified resample (each task's runs drawn with replacement, all n^n ordered draws equally likely):
    the exact bootstrap distribution of ``stat``."""
    per_task = [list(itertools.product(t, repeat=len(t))) for t in tasks]
    return np.array([stat([list(d) for d in combo]) for combo in itertools.product(*per_task)])


def cdf_gap(samples, exact):
    """Largest gap between the Monte Carlo and exact CDFs over the exact support."""
    samples, exact = np.sort(samples), np.sort(exact)
    support = np.unique(np.round(exact, 12))
    mc = np.searchsorted(samples, support + 1e-9, side="right") / len(samples)
    ex = np.searchsorted(exact, support + 1e-9, side="right") / len(exact)
    return float(np.max(np.abs(mc - ex)))


def _as_arrays(tasks):
    return [np.asarray(t, float) for t in tasks]


RNG = np.random.default_rng(7)
CASES = [
    [[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]],
    [[0.2, 0.9, 0.4], [1.3, 0.1, 0.5, 0.7, 0.7]],  # ragged tasks
    [list(RNG.normal(size=10)), list(RNG.normal(1, 2, size=10)), list(RNG.uniform(size=10))],
    [[3.0, 3.0, 3.0, 1.0, 5.0]],
]


# ---- point estimates -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("tasks", CASES)
def test_aggregates_match_the_definitions(tasks):
    t = _as_arrays(tasks)
    assert stats.iqm(t) == pytest.approx(ref_iqm(tasks))
    assert stats.mean(t) == pytest.approx(ref_mean(tasks))
    assert stats.median(t) == pytest.approx(ref_median(tasks))
    for gamma in (1.0, 0.5):
        assert stats.optimality_gap(t, gamma) == pytest.approx(ref_optimality_gap(tasks, gamma))
    taus = np.linspace(-1, 4, 23)
    assert stats.profile(t, taus) == pytest.approx([ref_profile(tasks, tau) for tau in taus])


def test_iqm_by_hand():
    assert stats.iqm([1, 2, 3, 4, 5, 6, 7, 8]) == 4.5  # middle four: 3, 4, 5, 6
    assert stats.iqm([100, 1, 2, 3]) == 2.5  # the outlier does not count
    assert stats.iqm([3.0, float("nan"), 3.0]) == 3.0 and np.isnan(stats.iqm([]))


@pytest.mark.parametrize("seed", range(4))
def test_probability_of_improvement_matches_the_pair_count(seed):
    rng = np.random.default_rng(seed)
    xs = [list(rng.integers(0, 4, size=rng.integers(1, 6)).astype(float)) for _ in range(3)]  # ties likely
    ys = [list(rng.integers(0, 4, size=rng.integers(1, 6)).astype(float)) for _ in range(3)]
    assert stats.probability_of_improvement(_as_arrays(xs), _as_arrays(ys)) == pytest.approx(ref_poi(xs, ys))
    assert stats.probability_of_improvement(_as_arrays(xs), _as_arrays(xs)) == pytest.approx(0.5)  # itself: 1/2
    # averaged per task, not pooled: a task where x always wins and one where it always loses give 1/2
    assert stats.probability_of_improvement([np.array([5.0]), np.array([0.0, 0.0, 0.0])],
                                            [np.array([1.0]), np.array([1.0])]) == 0.5


# ---- the stratified bootstrap against its exact distribution ---------------------------------------------------
@pytest.mark.parametrize("name", ["iqm", "mean", "median", "optimality_gap"])
def test_stratified_bootstrap_matches_the_exact_bootstrap_distribution(name):
    tasks = [[0.1, 0.8, 1.4], [0.3, 0.9], [0.0, 0.5, 2.0]]
    ref = {"iqm": ref_iqm, "mean": ref_mean, "median": ref_median, "optimality_gap": ref_optimality_gap}[name]
    exact = exact_bootstrap(ref, tasks)  # 27 * 4 * 27 resamples
    mc = stats.replicates(stats.AGGREGATES[name], _as_arrays(tasks), reps=40000, seed=1)
    assert cdf_gap(mc, exact) < 0.012
    # and stratified means stratified: each resample keeps every task's run count, so with one constant task per
    # stratum the task means cannot move
    lo_hi = stats.interval(stats.mean, [np.zeros(2), np.full(2, 10.0)], reps=500)[1:]
    assert lo_hi == (5.0, 5.0)


def test_bootstrap_ci_of_the_mean_by_hand():
    # mean of 4 draws from [1, 1, 1, 5]: the number of 5s is Binomial(4, 1/4), so the mean is 1, 2, 3, 4, 5 with
    # probabilities .316, .422, .211, .047, .004: its 2.5th and 97.5th percentiles are 1 and 4
    assert stats.interval(stats.mean, [1, 1, 1, 5], reps=20000)[1:] == (1.0, 4.0)
    assert stats.interval(stats.iqm, [7.0] * 5)[1:] == (7.0, 7.0)


def test_poi_bootstrap_resamples_both_groups_independently_within_tasks():
    x = [[1.0, 3.0, 4.0], [2.0, 2.0]]
    y = [[2.0, 3.0], [1.0, 3.0, 0.0]]
    exact = np.array([ref_poi([list(a), list(c)], [list(b), list(d)])
                      for a in itertools.product(x[0], repeat=3) for c in itertools.product(x[1], repeat=2)
                      for b in itertools.product(y[0], repeat=2) for d in itertools.product(y[1], repeat=3)])
    mc = stats.replicates2(stats.probability_of_improvement, _as_arrays(x), _as_arrays(y), reps=40000, seed=3)
    assert cdf_gap(mc, exact) < 0.012


def test_paired_difference_shares_the_seed_index():
    # paired by seed: seed i of x goes with seed i of y; a constant shift between them is then certain
    x, y = [[1.0, 5.0, 9.0]], [[0.0, 4.0, 8.0]]
    diff = stats.difference(stats.mean)
    assert stats.interval2(diff, _as_arrays(x), _as_arrays(y), paired=True, reps=2000) == pytest.approx((1.0, 1.0, 1.0))
    lo, hi = stats.interval2(diff, _as_arrays(x), _as_arrays(y), paired=False, reps=2000)[1:]
    assert lo < 0 < 1 < hi  # unpaired, the seed-to-seed spread enters
    exact = np.array([ref_mean([[a - b for a, b in zip(ix, iy)]])
                      for ix, iy in (zip(*[(x[0][i], y[0][i]) for i in idx]) for idx in
                                     itertools.product(range(3), repeat=3))])
    assert set(np.round(exact, 9)) == {1.0}


def test_difference_of_differences():
    # costs of family a: 10 - 20 = -10; of family b: 15 - 20 = -5; difference in cost -5, certain when paired
    a, a0 = [np.array([10.0, 11.0, 12.0])], [np.array([20.0, 21.0, 22.0])]
    b, b0 = [np.array([15.0, 15.0, 15.0])], [np.array([20.0, 20.0, 20.0])]
    assert stats.difference_of_differences(stats.mean, a, a0, b, b0, True, True) == pytest.approx((-5.0, -5.0, -5.0))
    p, lo, hi = stats.difference_of_differences(stats.mean, a, a0, b, b0, False, False)
    assert p == -5.0 and lo < -5.0 < hi


def test_profile_band_contains_the_profile():
    t = [np.linspace(0, 1, 10), np.linspace(0.5, 1.5, 10)]
    b = stats.profile_band(t, np.linspace(0, 1.5, 16), reps=500)
    assert np.all(b["low"] <= b["profile"] + 1e-12) and np.all(b["profile"] <= b["high"] + 1e-12)
    assert b["profile"][0] == pytest.approx(ref_profile([list(x) for x in t], 0.0))


# ---- the fraction of a cost recovered (issue 19's headline) ----------------------------------------------------
def ref_recovered(m, r, r0):
    """(IQM(method) - IQM(reference)) / (IQM(reference at baseline) - IQM(reference)), written out."""
    return (ref_iqm(m) - ref_iqm(r)) / (ref_iqm(r0) - ref_iqm(r))


def test_recovered_fraction_by_hand():
    # PPO scores -300 at lag 0 and -500 at lag 8 (cost 200); a remedy at -350 wins back 150 of the 200
    f = stats.recovered(stats.iqm)
    r0, r = _as_arrays([[-300.0] * 4]), _as_arrays([[-500.0] * 4])
    assert f(_as_arrays([[-350.0] * 4]), r, r0) == pytest.approx(0.75)
    assert f(r, r, r0) == 0.0 and f(r0, r, r0) == 1.0
    assert f(_as_arrays([[-600.0] * 4]), r, r0) == pytest.approx(-0.5)  # worse than the reference: below 0
    assert f(_as_arrays([[-250.0] * 4]), r, r0) == pytest.approx(1.25)  # better than lag 0: above 1
    m = [[-320.0, -410.0, -350.0, -900.0, -330.0]]
    rr, rr0 = [[-480.0, -520.0, -700.0, -505.0, -490.0]], [[-300.0, -310.0, -290.0, -305.0, -1000.0]]
    assert f(*map(_as_arrays, (m, rr, rr0))) == pytest.approx(ref_recovered(m, rr, rr0))


def test_interval_k_resamples_each_group_independently_and_matches_the_exact_bootstrap():
    m, r, r0 = [[1.0, 2.0, 4.0]], [[0.0, 0.5, -1.0]], [[5.0, 6.0, 8.0]]
    per = [list(itertools.product(g[0], repeat=3)) for g in (m, r, r0)]
    exact = np.array([ref_recovered([list(a)], [list(b)], [list(c)]) for a in per[0] for b in per[1] for c in per[2]])
    mc_lo_hi = stats.interval_k(stats.recovered(stats.iqm), [_as_arrays(g) for g in (m, r, r0)], reps=40000, seed=2)
    lo, hi = np.percentile(exact, [2.5, 97.5])
    assert mc_lo_hi[0] == pytest.approx(ref_recovered(m, r, r0))
    assert mc_lo_hi[1] == pytest.approx(lo, abs=0.02) and mc_lo_hi[2] == pytest.approx(hi, abs=0.02)


def test_interval_k_paired_shares_one_index_across_the_groups():
    # seed i of every group moves together: a method always 1 above the reference, which is always 2 below its
    # baseline, recovers exactly half, however much the seeds differ from each other
    r0 = np.array([10.0, 20.0, 35.0, 50.0, 80.0])
    r, m = r0 - 2.0, r0 - 1.0
    f = stats.recovered(stats.mean)
    assert stats.interval_k(f, [[m], [r], [r0]], paired=True, reps=2000) == pytest.approx((0.5, 0.5, 0.5))
    p, lo, hi = stats.interval_k(f, [[m], [r], [r0]], paired=False, reps=2000)
    assert p == pytest.approx(0.5) and lo < 0 and hi > 1  # independently resampled, the seed spread swamps it
    with pytest.raises(ValueError, match="paired resampling"):
        stats.interval_k(f, [[m], [r[:4]], [r0]], paired=True)


# ---- the edges: no runs, one task empty, tasks given by name ----------------------------------------------------
def _nan(v):
    return v is not None and np.all(np.isnan(np.asarray(v, float)))


def test_every_statistic_of_no_runs_is_nan_not_an_error_or_none():
    empty, half = [np.array([])], [np.array([1.0, 2.0]), np.array([])]  # no runs; a task with none
    for f in (stats.iqm, stats.mean, stats.median, stats.optimality_gap):
        assert _nan(f(empty)) and _nan(f(half)), f
    assert stats.iqm([np.array([3.0])]) == 3.0  # one run is a sample
    p = stats.profile(empty, [0.0, 1.0])
    assert p.shape == (2,) and _nan(p)
    assert stats.seed_range([]) == pytest.approx((np.nan, np.nan), nan_ok=True)
    assert stats.seed_range([np.nan, 2.0, 5.0]) == (2.0, 5.0)
    assert _nan(stats.probability_of_improvement(empty, [np.array([1.0])]))
    assert _nan(stats.probability_of_improvement([np.array([1.0])], empty))
    for out in (stats.interval(stats.mean, empty), stats.interval2(stats.difference(stats.mean), empty, [[1.0]]),
                stats.interval2(stats.difference(stats.mean), [[1.0]], empty),
                stats.interval_k(stats.recovered(stats.mean), [[[1.0]], empty, [[2.0]]]),
                stats.difference_of_differences(stats.mean, empty, [np.array([1.0])], [np.array([1.0])],
                                                [np.array([1.0])], False, False)):
        assert isinstance(out, tuple) and len(out) == 3 and _nan(out), out
    band = stats.profile_band(empty, [0.0, 1.0])
    assert set(band) == {"tau", "profile", "low", "high"} and _nan(band["profile"]) and _nan(band["low"])


def test_ratio_and_recovered_return_their_values():
    r = stats.ratio(stats.mean)([np.array([6.0])], [np.array([3.0])])
    assert r == 2.0
    assert stats.recovered(stats.mean)([np.array([4.0])], [np.array([2.0])], [np.array([6.0])]) == 0.5
    assert stats.interval2(stats.ratio(stats.mean), [[6.0, 6.0]], [[3.0, 3.0]]) == (2.0, 2.0, 2.0)


def test_scores_split_by_task_name_and_the_default_is_unpaired():
    t = stats.as_tasks([1.0, 2.0, 3.0, np.nan, 5.0], ["a", "b", "a", "b", "b"])
    assert [list(a) for a in t] == [[1.0, 3.0], [2.0, 5.0]]  # in order of first appearance, NaN dropped
    # unpaired by default: two samples whose seed-wise differences are constant still get an interval
    x, y = [np.array([1.0, 5.0, 9.0])], [np.array([0.0, 4.0, 8.0])]
    lo, hi = stats.interval2(stats.difference(stats.mean), x, y, reps=500)[1:]
    assert lo < 1.0 < hi
    assert stats.iqm([np.array([1.0, 2.0, 3.0, 4.0])]) == 2.5 and isinstance(stats.iqm([np.array([1.0])]), float)


def test_the_profile_band_is_the_central_95_percent():
    # one task of 40 runs: the bootstrap band at tau is the 2.5th-97.5th percentile of the resampled fraction,
    # which for a fraction p = 0.5 of n = 40 is close to p +- 1.96 sqrt(p (1 - p) / n) = 0.5 +- 0.155
    t = [np.r_[np.zeros(20), np.ones(20)]]
    b = stats.profile_band(t, [0.5], reps=20000, seed=3)
    assert b["profile"][0] == 0.5
    assert b["low"][0] == pytest.approx(0.35, abs=0.03) and b["high"][0] == pytest.approx(0.65, abs=0.03)
    b90 = stats.profile_band(t, [0.5], reps=20000, alpha=0.1, seed=3)
    assert b["low"][0] < b90["low"][0] < 0.5 < b90["high"][0] < b["high"][0]


def test_an_interval_whose_every_resample_is_undefined_is_nan_not_an_error():
    # the reference at its baseline scores what it scores at the lag (no cost): every resample's fraction divides
    # by 0, and the interval is NaN, not an exception
    f = stats.recovered(stats.mean)
    p, lo, hi = stats.interval_k(f, [[np.array([1.0, 2.0])], [np.array([0.0, 0.0])], [np.array([0.0, 0.0])]],
                                 reps=200)
    assert np.isinf(p) and np.isnan(lo) and np.isnan(hi)


def test_an_interval_is_not_conditioned_on_the_few_resamples_that_were_defined():
    # a ratio whose denominator is 0 in most resamples: before, the interval was the percentiles of the finite few
    x = np.array([0.0] * 8 + [1.0, 2.0])
    point, lo, hi = stats.interval(lambda t: 1.0 / np.asarray(stats.iqm(t)), x, reps=500)
    assert np.isnan(lo) and np.isnan(hi)
    ok = np.full(100, 1.0)
    ok[:4] = np.nan  # 96% defined: the interval stands
    assert stats._percentile(ok, 0.05) == (1.0, 1.0)
    ok[:6] = np.nan  # 94%: not
    assert np.isnan(stats._percentile(ok, 0.05)[0])


def test_scores_given_as_task_arrays_drop_nans_as_scores_given_flat_do():
    # e.g. steps to a threshold, NaN for a run that never reached it: the IQM is over the runs that did, whichever way
    # the scores come in (before, a list of arrays kept the NaN and the IQM was NaN)
    x = np.array([10.0, 20.0, np.nan, 30.0, 40.0, np.nan])
    assert stats.iqm([x]) == stats.iqm(x) == pytest.approx(25.0)
    _, lo, hi = stats.interval(stats.iqm, [x], reps=200)
    assert 10.0 <= lo <= hi <= 40.0


def test_a_percentile_interval_needs_95_percent_finite_replicates_exactly():
    """The edge of MIN_FINITE_REPLICATES: 95 finite of 100 replicates give an interval (from the finite ones), 94
    do not."""
    from analysis.stats import _percentile
    vals = np.arange(100, dtype=float)
    vals[95:] = np.nan
    lo, hi = _percentile(vals, 0.05)
    assert (lo, hi) == pytest.approx(tuple(np.percentile(np.arange(95.0), [2.5, 97.5])))
    vals[94] = np.inf
    assert all(np.isnan(_percentile(vals, 0.05)))
