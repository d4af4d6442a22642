"""Measures per run, from its learning curve (metrics.parquet: one row per learner update): learning efficiency
per env step (``auc``, over the common span [0, budget]), env steps and wall time to a return threshold,
throughput, lag (mean / p95 / max), KL(behavior || current), kept fraction, the queue's depth and data age, and
what the updates did while the run was learning (clip fraction, KL moved per update, entropy).

Final return has one definition: the run's own ``summary.json`` ``final_return_mean`` (the mean return of the
last ``tracking.return_window`` episodes), never recomputed here."""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import pandas as pd

RETURN = "episodic_return_mean"

# default return thresholds per env id ("solved" levels; override with --threshold)
THRESHOLDS: Dict[str, float] = {"CartPole-v1": 475.0, "Acrobot-v1": -100.0, "Pendulum-v1": -200.0,
                                "laglab/Tagged-v0": 30.0, "laglab/Latency-v0": 150.0, "HalfCheetah-v5": 1500.0,
                                "Hopper-v5": 2000.0, "Walker2d-v5": 2000.0}


def auc(env_steps: np.ndarray, returns: np.ndarray, budget: float) -> float:
    """Learning efficiency per env step over the common span [0, budget].

    The return curve (the rolling episodic return at each learner update, against env steps, linear between
    updates) is extended as a constant back to step 0 with its first defined value and forward to ``budget`` with
    its last; its integral over [0, budget] divided by ``budget`` is the mean return per env step. Runs of one
    budget thus share one span, whenever their first episode finished. Points past the budget are cut off at it.
    NaN when the run has no finished episode."""
    x, y = np.asarray(env_steps, float), np.asarray(returns, float)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if not len(x) or not np.isfinite(budget) or budget <= 0:
        return float("nan")
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    inside = x < budget
    end = float(np.interp(budget, x, y))  # the value at the budget (the last value when the curve ends before)
    xs = np.concatenate([[0.0], x[inside & (x > 0)], [budget]])
    ys = np.concatenate([[y[0]], y[inside & (x > 0)], [end]])
    return float(np.sum((ys[1:] + ys[:-1]) * np.diff(xs)) / 2.0 / budget)


def first_reach(df: pd.DataFrame, threshold: float, column: str = RETURN) -> Dict[str, float]:
    """Env steps and wall seconds at the first update whose rolling return is >= threshold (NaN if never)."""
    hit = df[df[column] >= threshold]
    if hit.empty:
        return {"steps_to_threshold": float("nan"), "time_to_threshold": float("nan")}
    return {"steps_to_threshold": float(hit["env_steps"].iloc[0]), "time_to_threshold": float(hit["wall_time"].iloc[0])}


def _mean(df: pd.DataFrame, col: str) -> float:
    return float(df[col].mean()) if col in df and len(df) else float("nan")


def run_measures(df: pd.DataFrame, budget: float, threshold: float,
                 lags: Optional[np.ndarray] = None) -> Dict[str, float]:
    """Measures of one run from its metrics (``df``), its env-step budget, the return threshold, and the version
    lags of its trained transitions where they were sampled (histograms.parquet)."""
    m: Dict[str, float] = {"threshold": threshold, "budget": budget}
    if df.empty:
        return m
    m["auc"] = auc(df["env_steps"].to_numpy(), df[RETURN].to_numpy(), budget)
    m.update(first_reach(df, threshold) if np.isfinite(threshold) else {"steps_to_threshold": float("nan"),
                                                                          "time_to_threshold": float("nan")})
    m["reached"] = bool(np.isfinite(m["steps_to_threshold"])) if np.isfinite(threshold) else None
    m["lag_mean"] = _mean(df, "lag/mean")
    m["lag_max"] = float(df["lag/max"].max()) if "lag/max" in df else float("nan")
    m["lag_p95"] = float(np.percentile(lags, 95)) if lags is not None and len(lags) else m["lag_max"]
    # a KL is never negative (runs logged before the estimator was clamped can hold float noise like -3e-9)
    m["kl_behavior"] = float(np.maximum(0.0, _mean(df, "lag/kl_behavior")))
    m["kept_frac"] = _mean(df, "lag/kept_frac")
    m["queue_depth"] = _mean(df, "transport/queue_depth")
    m["age_s"] = _mean(df, "transport/age_s_mean")
    m["learner_wait_frac"] = float(df["learner/wait_frac"].iloc[-1]) if "learner/wait_frac" in df else float("nan")
    # what the updates did while the run was learning (up to the threshold, or the first half of the run):
    # the fraction of samples PPO's clip cut, how far each update moved the policy, the policy's entropy
    end = m["steps_to_threshold"] if np.isfinite(m.get("steps_to_threshold", float("nan"))) else \
        float(df["env_steps"].iloc[len(df) // 2])
    learning = df[df["env_steps"] <= end]
    m["clip_frac"] = _mean(learning, "losses/clip_frac")
    m["update_kl"] = _mean(learning, "losses/approx_kl")
    m["entropy"] = _mean(learning, "losses/entropy")
    # how off-policy the trained data was to the update: the effective sample fraction (Kish) of the importance
    # weights current/behavior (1 = on-policy), and the fraction of them the decoupled loss truncated at is_cap
    m["is_ess"] = _mean(learning, "lag/is_ess")
    m["is_trunc_frac"] = _mean(learning, "losses/is_trunc_frac")
    return m


MEASURES = ["auc", "final_return", "steps_to_threshold", "time_to_threshold", "sps", "lag_mean", "lag_p95", "lag_max",
            "kl_behavior", "kept_frac", "dropped_frac", "rejected_frac", "queue_depth", "age_s", "clip_frac",
            "update_kl", "entropy", "is_ess", "is_trunc_frac"]
# measures taken on the wall clock: only comparable between runs on an equally quiet machine
WALL_CLOCK = ["time_to_threshold", "sps"]
