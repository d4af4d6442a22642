"""analysis/measures.py on small curves whose measures are worked out by hand."""
import math

import numpy as np
import pandas as pd
import pytest

from analysis.measures import auc, first_reach, run_measures


def test_auc_by_trapezoids_over_zero_to_the_budget():
    x, y = np.array([10, 20, 30, 40]), np.array([0.0, 10.0, 50.0, 60.0])
    # extended back to 0 with y=0 and forward to 50 with y=60: (0 + 50 + 300 + 550 + 600) / 50
    assert auc(x, y, 50) == pytest.approx(30.0)
    # the budget cuts the curve at 35, where it is 55: (0 + 50 + 300 + 262.5) / 35
    assert auc(x, y, 35) == pytest.approx(17.5)
    assert auc(x[::-1], y[::-1], 50) == pytest.approx(30.0)  # order of the rows does not matter
    # a point at step 0 is the start itself: (5 + 15) * 10 / 2 + 15 * 10, over 20
    assert auc(np.array([0, 10]), np.array([5.0, 15.0]), 20) == pytest.approx(12.5)
    # undefined returns (no finished episode yet) are left out: the curve starts at its first defined value
    assert auc(np.array([10, 20, 30]), np.array([np.nan, 10.0, 20.0]), 30) == pytest.approx((10 * 20 + 15 * 10) / 30)


@pytest.mark.parametrize("x,y,budget", [([], [], 10), ([1.0], [np.nan], 10), ([1.0], [2.0], 0), ([1.0], [2.0], -5),
                                        ([1.0], [2.0], np.inf), ([1.0], [2.0], np.nan)])
def test_auc_is_nan_without_a_return_or_a_budget(x, y, budget):
    assert math.isnan(auc(np.array(x), np.array(y), budget))


def test_first_reach_counts_a_return_equal_to_the_threshold():
    df = pd.DataFrame({"env_steps": [10, 20, 30], "wall_time": [1.0, 2.0, 3.0],
                       "episodic_return_mean": [5.0, 50.0, 70.0]})
    assert first_reach(df, 50.0) == {"steps_to_threshold": 20.0, "time_to_threshold": 2.0}
    assert first_reach(df, 60.0) == {"steps_to_threshold": 30.0, "time_to_threshold": 3.0}
    never = first_reach(df, 71.0)
    assert math.isnan(never["steps_to_threshold"]) and math.isnan(never["time_to_threshold"])


def _curve():
    return pd.DataFrame({
        "env_steps": [10, 20, 30, 40], "wall_time": [1.0, 2.0, 3.0, 4.0],
        "episodic_return_mean": [0.0, 10.0, 50.0, 60.0],
        "lag/mean": [0.0, 1.0, 2.0, 5.0], "lag/max": [1, 3, 2, 7], "lag/kl_behavior": [0.1, 0.2, 0.3, 0.2],
        "lag/kept_frac": [1.0, 1.0, 0.5, 0.5], "transport/queue_depth": [1, 2, 3, 6],
        "transport/age_s_mean": [0.5, 0.5, 1.0, 2.0], "learner/wait_frac": [0.9, 0.5, 0.4, 0.3],
        "losses/clip_frac": [0.1, 0.2, 0.3, 0.9], "losses/approx_kl": [0.01, 0.02, 0.03, 0.5],
        "losses/entropy": [0.6, 0.5, 0.4, 0.0]})


def test_run_measures_of_a_run_that_reaches_the_threshold():
    m = run_measures(_curve(), budget=50, threshold=50.0)
    assert m["threshold"] == 50.0 and m["budget"] == 50
    assert m["auc"] == pytest.approx(30.0)
    assert (m["steps_to_threshold"], m["time_to_threshold"], m["reached"]) == (30.0, 3.0, True)
    assert m["lag_mean"] == pytest.approx(2.0) and m["lag_max"] == 7.0 and m["lag_p95"] == 7.0
    assert m["kl_behavior"] == pytest.approx(0.2) and m["kept_frac"] == pytest.approx(0.75)
    assert m["queue_depth"] == pytest.approx(3.0) and m["age_s"] == pytest.approx(1.0)
    assert m["learner_wait_frac"] == 0.3  # the run's last reading
    # while learning = up to and including the update that reached the threshold (the first three)
    assert m["clip_frac"] == pytest.approx(0.2) and m["update_kl"] == pytest.approx(0.02)
    assert m["entropy"] == pytest.approx(0.5)


def test_run_measures_of_a_run_that_never_reaches_it():
    df = pd.concat([_curve(), _curve().iloc[[3]].assign(env_steps=50)], ignore_index=True)  # five updates
    m = run_measures(df, budget=50, threshold=100.0)
    assert m["reached"] is False and math.isnan(m["steps_to_threshold"]) and math.isnan(m["time_to_threshold"])
    # while learning = the first half: up to the env steps of update len // 2 = 2 (30 steps), three updates
    assert m["clip_frac"] == pytest.approx(0.2) and m["entropy"] == pytest.approx(0.5)
    lags = np.arange(101)
    assert run_measures(df, 50, 100.0, lags=lags)["lag_p95"] == pytest.approx(95.0)
    assert run_measures(df, 50, 100.0, lags=np.array([]))["lag_p95"] == 7.0
    free = run_measures(df, 50, float("nan"))
    assert free["reached"] is None and math.isnan(free["steps_to_threshold"])


def test_run_measures_without_optional_columns_and_of_an_empty_run():
    assert run_measures(pd.DataFrame(), budget=10, threshold=1.0) == {"threshold": 1.0, "budget": 10}
    df = _curve()[["env_steps", "wall_time", "episodic_return_mean"]]
    m = run_measures(df, budget=50, threshold=50.0)
    for k in ("lag_mean", "lag_max", "lag_p95", "kl_behavior", "kept_frac", "learner_wait_frac", "clip_frac"):
        assert math.isnan(m[k]), k
    neg = _curve().assign(**{"lag/kl_behavior": [-3e-9] * 4})
    assert run_measures(neg, 50, 50.0)["kl_behavior"] == 0.0


def test_auc_at_the_edges_of_its_span():
    # a point at step 1 is inside the span: (0 + 0) * 1 / 2 + (0 + 10) * 1 / 2, over 2
    assert auc(np.array([1, 2]), np.array([0.0, 10.0]), 2) == pytest.approx(2.5)
    assert auc(np.array([0.25]), np.array([4.0]), 0.5) == pytest.approx(4.0)  # a budget below one step is a span
    assert math.isnan(auc(np.array([1.0]), np.array([4.0]), -0.5))  # a negative budget is none


def test_auc_at_the_edges_of_its_span():
    from analysis.measures import auc

    # a point at step 0 and one at step 1 (the first updates of a tiny run): the curve starts from the value at 0
    # and each point counts once: (0 + 0) / 2 * 1 + (0 + 10) / 2 * 1 + 10 * 2 over a budget of 4 = 25 / 4
    assert auc(np.array([0.0, 1.0, 2.0, 3.0]), np.array([0.0, 0.0, 10.0, 10.0]), 4.0) == pytest.approx(6.25)
    # a budget below one step still has a span; a budget of 0 or below has none
    assert auc(np.array([0.1, 0.2]), np.array([1.0, 1.0]), 0.5) == pytest.approx(1.0)
    assert np.isnan(auc(np.array([0.1, 0.2]), np.array([1.0, 1.0]), 0.0))
    assert np.isnan(auc(np.array([0.1, 0.2]), np.array([1.0, 1.0]), -0.5))
