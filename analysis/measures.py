"""Measures per run, from its run dir: learning efficiency per env step (``auc``), env steps and wall time
to a return threshold, final return, throughput, lag (mean / p95 / max), KL(behavior || current), kept
fraction, the queue's depth and data age, and what the updates did while the run was learning (clip fraction,
KL moved per update, entropy)."""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import pandas as pd

from .load import curves, histograms

# default return thresholds per env id ("solved" levels; override with --threshold)
THRESHOLDS: Dict[str, float] = {"CartPole-v1": 475.0, "Acrobot-v1": -100.0, "Pendulum-v1": -200.0,
                                "laglab/Tagged-v0": 30.0, "laglab/Latency-v0": 150.0, "HalfCheetah-v5": 1500.0,
                                "Hopper-v5": 2000.0, "Walker2d-v5": 2000.0}


def auc(env_steps: np.ndarray, returns: np.ndarray) -> float:
    """Learning efficiency per env step: the trapezoidal area under the return curve against env steps,
    divided by the env-step span (the mean return per env step over the run). Rows before the first finished
    episode (NaN return) are left out."""
    x, y = np.asarray(env_steps, float), np.asarray(returns, float)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) < 2 or x[-1] <= x[0]:
        return float(y[0]) if len(y) == 1 else float("nan")
    return float(np.sum((y[1:] + y[:-1]) * np.diff(x)) / 2.0 / (x[-1] - x[0]))


def first_reach(df: pd.DataFrame, threshold: float, column: str = "episodic_return_mean") -> Dict[str, float]:
    """Env steps and wall seconds at the first update whose rolling return is >= threshold (NaN if never)."""
    hit = df[df[column] >= threshold]
    if hit.empty:
        return {"steps_to_threshold": float("nan"), "time_to_threshold": float("nan")}
    return {"steps_to_threshold": float(hit["env_steps"].iloc[0]), "time_to_threshold": float(hit["wall_time"].iloc[0])}


def _mean(df: pd.DataFrame, col: str) -> float:
    return float(df[col].mean()) if col in df and len(df) else float("nan")


def run_measures(run_dir: str, env_id: Optional[str], threshold: Optional[float] = None) -> Dict[str, float]:
    df = curves(run_dir)
    thr = threshold if threshold is not None else THRESHOLDS.get(env_id or "", float("nan"))
    m: Dict[str, float] = {"threshold": thr}
    if df.empty:
        return m
    m["auc"] = auc(df["env_steps"].to_numpy(), df["episodic_return_mean"].to_numpy())
    m.update(first_reach(df, thr) if np.isfinite(thr) else {"steps_to_threshold": float("nan"),
                                                             "time_to_threshold": float("nan")})
    m["final_return"] = float(df["episodic_return_mean"].iloc[-1])
    m["lag_mean"] = _mean(df, "lag/mean")
    m["lag_max"] = float(df["lag/max"].max()) if "lag/max" in df else float("nan")
    h = histograms(run_dir)
    lags = h[h["metric"] == "lag/version_lag"]["values"]
    m["lag_p95"] = float(np.percentile(np.concatenate([np.asarray(v, float) for v in lags]), 95)) if len(lags) else m["lag_max"]
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
    return m


MEASURES = ["auc", "final_return", "steps_to_threshold", "time_to_threshold", "sps", "lag_mean", "lag_p95", "lag_max",
            "kl_behavior", "kept_frac", "dropped_frac", "rejected_frac", "queue_depth", "age_s", "clip_frac",
            "update_kl", "entropy"]
