"""Figures (matplotlib, headless): curves with an IQM line and a bootstrap CI band per group, the headline
efficiency-vs-measured-lag plot, version-lag histograms, queue depth and data age over time, and SPS / KL
against actor count."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from .load import curves, histograms  # noqa: E402
from .stats import bootstrap_ci, iqm  # noqa: E402


def _save(fig, out: Path, name: str) -> Path:
    path = out / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _band(ax, runs: List[str], x_col: str, label: str, grid_n: int = 60) -> None:
    """IQM across runs of the return, interpolated on a common grid of ``x_col``, with a 95% CI band."""
    data = [curves(r)[[x_col, "episodic_return_mean"]].dropna() for r in runs]
    data = [d for d in data if len(d) >= 2]
    if not data:
        return
    hi = min(d[x_col].iloc[-1] for d in data)
    lo = max(d[x_col].iloc[0] for d in data)
    if hi <= lo:
        return
    grid = np.linspace(lo, hi, grid_n)
    ys = np.stack([np.interp(grid, d[x_col], d["episodic_return_mean"]) for d in data])
    mid = np.array([iqm(ys[:, i]) for i in range(grid_n)])
    line, = ax.plot(grid, mid, label=f"{label} (n={len(data)})")
    if len(data) > 1:
        ci = np.array([bootstrap_ci(ys[:, i], reps=300) for i in range(grid_n)])
        ax.fill_between(grid, ci[:, 0], ci[:, 1], alpha=0.2, color=line.get_color())


def make_all(runs: pd.DataFrame, summary: pd.DataFrame, by: List[str], out: Path) -> Dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    figs: Dict[str, Path] = {}
    groups = list(runs.groupby(by, dropna=False)) if by else [(("all",), runs)]
    label = lambda key: ", ".join(f"{b}={v}" for b, v in zip(by, key if isinstance(key, tuple) else (key,))) if by else "all"  # noqa: E731
    for x_col, name, xl in (("env_steps", "return_vs_env_steps", "env steps"), ("wall_time", "return_vs_wall_clock",
                                                                              "wall clock (s)")):
        fig, ax = plt.subplots(figsize=(7, 4))
        for key, g in groups:
            _band(ax, list(g["run_dir"]), x_col, label(key))
        ax.set_xlabel(xl)
        ax.set_ylabel("return (rolling mean)")
        ax.set_title(f"Return vs {xl}: IQM across seeds, 95% bootstrap CI")
        ax.legend(fontsize=7)
        figs[name] = _save(fig, out, name)
    # headline: learning efficiency against the lag actually measured, per algorithm
    fig, ax = plt.subplots(figsize=(7, 4))
    algo_col = "cfg.algo.name" if "cfg.algo.name" in runs else None
    for a, g in (runs.groupby(algo_col) if algo_col else [("all", runs)]):
        ax.scatter(g["lag_mean"], g["auc"], alpha=0.4, s=18)
        pts = g.groupby(by, dropna=False) if by else [(None, g)]
        xs = [iqm(p["lag_mean"]) for _, p in pts]
        ys = [iqm(p["auc"]) for _, p in pts]
        order = np.argsort(xs)
        ax.plot(np.asarray(xs)[order], np.asarray(ys)[order], marker="o", label=str(a))
    ax.set_xlabel("measured mean version lag")
    ax.set_ylabel("AUC: mean return per env step")
    ax.set_title("Learning efficiency vs policy lag (dots: runs; line: group IQM)")
    ax.legend(fontsize=7)
    figs["efficiency_vs_lag"] = _save(fig, out, "efficiency_vs_lag")
    # version-lag histograms per group
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, g in groups:
        vals = []
        for r in g["run_dir"]:
            h = histograms(r)
            vals += [np.asarray(v, float) for v in h[h["metric"] == "lag/version_lag"]["values"]]
        if vals:
            v = np.concatenate(vals)
            ax.hist(v, bins=np.arange(-0.5, max(2, v.max() + 1.5)), histtype="step", density=True, label=label(key))
    ax.set_xlabel("version lag (updates)")
    ax.set_ylabel("share of transitions")
    ax.set_title("Version lag of trained transitions")
    ax.legend(fontsize=7)
    figs["lag_histograms"] = _save(fig, out, "lag_histograms")
    # queue depth and data age over time
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for key, g in groups:
        d = curves(g["run_dir"].iloc[0])
        for ax, col in zip(axes, ("transport/queue_depth", "transport/age_s_mean")):
            if col in d:
                ax.plot(d["wall_time"], d[col], label=label(key), lw=0.8)
    for ax, t in zip(axes, ("queue depth (fragments)", "time in the queue (s)")):
        ax.set_xlabel("wall clock (s)")
        ax.set_title(t + " (first seed of each group)")
    axes[0].legend(fontsize=6)
    figs["queue"] = _save(fig, out, "queue")
    # SPS and KL against actor count
    if "cfg.actors" in runs and runs["cfg.actors"].nunique() > 1:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
        for a, g in (runs.groupby(algo_col) if algo_col else [("all", runs)]):
            s = g.groupby("cfg.actors").agg(sps=("sps", iqm), kl=("kl_behavior", iqm)).reset_index()
            axes[0].plot(s["cfg.actors"], s["sps"], marker="o", label=str(a))
            axes[1].plot(s["cfg.actors"], s["kl"], marker="o", label=str(a))
        axes[0].set_title("SPS (IQM) vs actors")
        axes[1].set_title("KL(behavior || current) (IQM) vs actors")
        for ax in axes:
            ax.set_xlabel("actors")
        axes[0].legend(fontsize=7)
        figs["actors"] = _save(fig, out, "actors")
    return figs
