"""Figures (matplotlib, headless), drawn from a report's compact tables only (runs, long curves, lag counts):

- ``lag_cost`` (the headline): ΔAUC against each family's own baseline vs the lag set (log2 axis), and vs the
  measured KL(behavior ‖ current); one line per family with its CI band; drawn only when there is a baseline,
  the treatment takes more than one value and all runs share one env;
- ``return_vs_env_steps`` / ``return_vs_wall_clock``: IQM across seeds with a 95% CI band per group;
- ``per_seed``: every seed's curve, one panel per group;
- ``performance_profile``: the fraction of runs whose normalized AUC exceeds τ, with a CI band (envs with a
  reference score only);
- ``lag_histograms`` (only when lag varied within runs), ``queue`` (only runs with a queue: not ``runner=sync``),
  ``actors`` (only when the actor count varies).

More than 8 groups in one panel are split into panels (by family, else by the first grouping key); legends sit
outside the axes; every axis is labelled. Groups of fewer than 5 runs are drawn with their seeds."""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy import stats as st  # noqa: E402

from . import compare as cmp  # noqa: E402
from .compare import MIN_CI_RUNS  # noqa: E402
from .references import normalize  # noqa: E402
from .stats import profile_band  # noqa: E402

if TYPE_CHECKING:  # pragma: no cover
    from .report import Result

MAX_LINES = 8
DPI = 100


def _save(fig, out: Path, name: str) -> Path:
    path = out / f"{name}.png"
    fig.savefig(path, dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return path


def _legend(ax, title: Optional[str] = None) -> None:
    h, lab = ax.get_legend_handles_labels()
    if h:
        ax.legend(h, lab, fontsize=8, title=title, title_fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  borderaxespad=0.0, frameon=False)


def _fig_legend(fig, axes) -> None:
    """One legend for all panels, outside them on the right (labels that repeat across panels name the same
    group value and have the same colour, since every panel draws its groups in the same order); a single
    panel gets its own legend beside it."""
    if len(axes) == 1:
        _legend(axes[0])
        return
    seen: Dict[str, object] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(lab, h)
    if seen:
        fig.legend(list(seen.values()), list(seen.keys()), loc="outside right upper", fontsize=8, frameon=False)


def _kilo(ax) -> None:
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(
        lambda v, _: f"{v / 1e6:g}M" if abs(v) >= 1e6 else f"{v / 1e3:g}k" if abs(v) >= 1e3 else f"{v:g}"))


def _used(res: "Result") -> pd.DataFrame:
    return res.runs[res.runs["used"]]


def _one_env(res: "Result") -> bool:
    used = _used(res)
    return "cfg.env.id" not in used or used["cfg.env.id"].nunique() <= 1


def _panels(res: "Result") -> List[Tuple[str, List[Tuple[str, pd.DataFrame]]]]:
    """Groups split into panels of at most ~8 lines: by env when envs are mixed, then by family (the keys other
    than the baseline's) or by the first grouping key when there are more than 8 groups."""
    used, by = _used(res), res.by
    envs = list(dict.fromkeys(used["cfg.env.id"])) if "cfg.env.id" in used else [None]
    panels = []
    for env in envs:
        sub = used if env is None else used[used["cfg.env.id"] == env]
        groups = cmp.groups_of(sub, by)
        keep = [b for b in by if b != "cfg.env.id"]
        if len(groups) > MAX_LINES and len(keep) > 1:
            split = [b for b in keep if b not in res.baseline] or keep[:1]
            split = split[:1] if len(split) == len(keep) else split
            for fk, fg in cmp.groups_of(sub, split):
                rest = [b for b in keep if b not in split]
                title = cmp.label(split, fk) + (f" ({env})" if len(envs) > 1 else "")
                panels.append((title, [(cmp.label(rest, k), g) for k, g in cmp.groups_of(fg, rest)]))
        else:
            panels.append((env if len(envs) > 1 else "", [(cmp.label(keep, k) if keep else "all", g)
                                                         for k, g in cmp.groups_of(sub, keep)]))
    return panels


def _grid(n: int, ncols: int, w: float = 4.6, h: float = 3.2, sharey: bool = True):
    ncols = max(1, min(ncols, n))
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(w * ncols + 1.8, h * nrows), squeeze=False, sharey=sharey,
                             layout="constrained")
    for ax in axes.ravel()[n:]:
        ax.set_visible(False)
    return fig, axes.ravel()[:n]


def _curve_matrix(curves: pd.DataFrame, run_ids: Sequence[int], x_col: str, grid_n: int = 80):
    data = []
    for rid in run_ids:
        d = curves.loc[curves["run_id"] == rid, [x_col, "episodic_return_mean"]].dropna()
        if len(d) >= 2:
            data.append(d)
    if not data:
        return None, None
    lo = max(d[x_col].iloc[0] for d in data)
    hi = min(d[x_col].iloc[-1] for d in data)
    if hi <= lo:
        return None, None
    grid = np.linspace(lo, hi, grid_n)
    return grid, np.stack([np.interp(grid, d[x_col], d["episodic_return_mean"]) for d in data])


def _band(ax, grid, ys, label: str, reps: int = 400) -> None:
    mid = st.trim_mean(ys, 0.25, axis=0)
    n = len(ys)
    line, = ax.plot(grid, mid, label=label, lw=1.4)
    if n >= MIN_CI_RUNS:
        rng = np.random.default_rng(0)
        boot = st.trim_mean(ys[rng.integers(0, n, (reps, n))], 0.25, axis=1)
        lo, hi = np.percentile(boot, [2.5, 97.5], axis=0)
        ax.fill_between(grid, lo, hi, alpha=0.2, color=line.get_color(), lw=0)
    else:
        for y in ys:
            ax.plot(grid, y, color=line.get_color(), lw=0.6, alpha=0.45)


def returns_figure(res: "Result", out: Path, x_col: str, name: str, xlabel: str) -> Optional[Path]:
    panels = _panels(res)
    fig, axes = _grid(len(panels), 2 if len(panels) > 1 else 1, w=6.2 if len(panels) == 1 else 4.8,
                      sharey=_one_env(res))
    drawn = False
    for ax, (title, groups) in zip(axes, panels):
        for lab, g in groups:
            grid, ys = _curve_matrix(res.curves, list(g["run_id"]), x_col)
            if grid is not None:
                _band(ax, grid, ys, lab)
                drawn = True
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("return (rolling mean)")
        ax.grid(alpha=0.3)
        if x_col == "env_steps":
            _kilo(ax)
    _fig_legend(fig, axes)
    fig.suptitle(f"Return vs {xlabel}: IQM across seeds, 95% bootstrap CI (seeds drawn when n < {MIN_CI_RUNS})",
                 fontsize=10)
    if not drawn:
        plt.close(fig)
        return None
    return _save(fig, out, name)


def per_seed_figure(res: "Result", out: Path) -> Optional[Path]:
    groups = cmp.groups_of(_used(res), res.by)
    fig, axes = _grid(len(groups), 6 if len(groups) > 8 else 4, w=3.0, h=2.3, sharey=_one_env(res))
    for ax, (key, g) in zip(axes, groups):
        for rid, seed in zip(g["run_id"], g.get("cfg.seed", g["run_id"])):
            d = res.curves[res.curves["run_id"] == rid]
            ax.plot(d["env_steps"], d["episodic_return_mean"], lw=0.8, alpha=0.8)
        ax.set_title(cmp.label(res.by, key), fontsize=8)
        ax.tick_params(labelsize=7)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(4))
        ax.set_xlabel("env steps", fontsize=7)
        ax.set_ylabel("return", fontsize=7)
        ax.xaxis.get_offset_text().set_fontsize(7)
        ax.grid(alpha=0.3)
        _kilo(ax)
    fig.suptitle("Every seed's return (rolling mean) vs env steps, one panel per group", fontsize=10)
    return _save(fig, out, "per_seed")


def _numeric(values: Sequence[str]) -> Optional[np.ndarray]:
    try:
        return np.array([float(v) for v in values])
    except ValueError:
        return None


def lag_cost_figure(res: "Result", out: Path) -> Optional[Path]:
    s, by, base = res.summary, res.by, res.baseline
    used = _used(res)
    if not base or "auc_delta" not in s or len(base) != 1:
        return None
    if "cfg.env.id" in used and used["cfg.env.id"].nunique() > 1:
        return None  # ΔAUC in return units of different envs do not share an axis
    (tkey, tval), = base.items()
    levels = cmp.as_text(s[tkey])
    tval = cmp.spelled_as(str(tval), set(levels))
    if levels.nunique() < 2:
        return None  # the lag is constant
    x_set = _numeric(levels)
    keys = [b for b in by if b != tkey]
    # a treatment that is not a number (e.g. the runner) against one numeric key (e.g. the actor count): the cost
    # against that key, one line (the measured lag may hardly vary between the families: their points would stack)
    along = keys[0] if x_set is None and len(keys) == 1 and _numeric(s[keys[0]].astype(str)) is not None else None
    fig, axes = plt.subplots(1, 2, figsize=(12.5, 4.2))
    groups = dict(cmp.groups_of(used, by))
    base_of = cmp.matched_baselines(list(groups), by, base)
    families = [("all", s)] if along or not keys else s.groupby(keys, sort=True, dropna=False)
    for fk, f in families:
        f = f[(levels[f.index] != tval) & f["auc_delta"].notna()]
        if f.empty:
            continue
        lab = (cmp.label(keys, cmp.text_key(s, keys, fk)) if keys and not along else
               f"{cmp.short_key(tkey)}={'/'.join(sorted(levels[f.index].unique()))} vs {tval}")
        x_lag = (x_set[f.index] if x_set is not None else _numeric(f[along].astype(str)) if along
                 else f["lag_mean_iqm"].to_numpy(float))
        order = np.argsort(x_lag)
        f, x_lag = f.iloc[order], x_lag[order]
        if len(f) > 1:
            line, = axes[0].plot(x_lag, f["auc_delta"], marker="o", label=lab)
            c = line.get_color()
            axes[0].fill_between(x_lag, f["auc_delta_low"], f["auc_delta_high"], alpha=0.18, color=c, lw=0)
        else:  # one level per family (a treatment that is not a number, e.g. the runner): a point and its interval
            d = f["auc_delta"].to_numpy(float)
            line = axes[0].errorbar(x_lag, d, yerr=[d - f["auc_delta_low"].to_numpy(float),
                                                    f["auc_delta_high"].to_numpy(float) - d],
                                    marker="o", capsize=3, label=lab)
            c = line[0].get_color()
        kl = f["kl_behavior_iqm"].to_numpy(float) if "kl_behavior_iqm" in f else np.full(len(f), np.nan)
        ko = np.argsort(kl)
        axes[1].errorbar(kl[ko], f["auc_delta"].to_numpy()[ko],
                         yerr=[f["auc_delta"].to_numpy()[ko] - f["auc_delta_low"].to_numpy()[ko],
                               f["auc_delta_high"].to_numpy()[ko] - f["auc_delta"].to_numpy()[ko]],
                         marker="o", color=c, capsize=3, label=lab)
        for i, (_, r) in enumerate(f.iterrows()):  # the seeds of small groups
            if r["runs"] >= MIN_CI_RUNS:
                continue
            key = tuple(str(r[b]) for b in by)
            g, b0 = groups[key], groups[base_of[key]]
            if cmp.paired(g, b0):  # the per-seed differences whose range the band shows
                ga, ba = cmp._finite_pairs(cmp._by_seed(g), cmp._by_seed(b0), "auc")
                d = ga["auc"].to_numpy(float) - ba["auc"].to_numpy(float)
            else:
                d = g["auc"].to_numpy(float) - float(st.trim_mean(b0["auc"].to_numpy(float), 0.25))
            axes[0].scatter(np.full(len(d), x_lag[i]), d, s=12, color=c, alpha=0.5, zorder=3)
    axes[0].set_xscale("log", base=2)
    ticks = x_set if x_set is not None else _numeric(s[along].astype(str)) if along else None
    xs = sorted(set(ticks[ticks > 0])) if ticks is not None else None
    if xs:
        axes[0].set_xticks(xs)
        axes[0].set_xticklabels([f"{v:g}" for v in xs])
    axes[0].set_xlabel(f"{cmp.short_key(tkey)} (log2 axis)" if x_set is not None else f"{cmp.short_key(along)} (log2 axis)"
                       if along else "measured mean version lag (log2 axis)")
    axes[1].set_xlabel("measured KL(behavior ‖ current) per update (IQM)")
    if np.all(s.loc[levels != tval, "kl_behavior_iqm"].dropna() > 0):
        axes[1].set_xscale("log")
        axes[1].xaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axes[1].xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        axes[1].xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    tname = cmp.short_key(tkey)
    tname = tname.split(".")[-1] if tname.startswith("actor.") else tname  # actor.fixed_lag: fixed_lag
    for ax in axes:
        ax.axhline(0, color="0.4", lw=0.8, ls="--")
        ax.set_ylabel(f"ΔAUC vs own {tname}={tval}\n(mean return per env step)")
        ax.grid(alpha=0.3)
    _legend(axes[1])
    small = bool((s["runs"] < MIN_CI_RUNS).any())
    short = [cmp.short_key(k) for k in keys]
    same = ", ".join(k.split(".")[-2] if k.count(".") >= 1 and k.endswith(".name") else k for k in short) or "group"
    fig.suptitle(f"Lag cost: AUC minus the AUC of the same {same} at {tname}={tval} (IQM difference; "
                 + ("band: seed range where a group has < 5 runs, dots: seeds; " if small else "band: 95% CI; ")
                 + "below 0 = lag costs)", fontsize=10)
    fig.tight_layout()
    return _save(fig, out, "lag_cost")


def profile_figure(res: "Result", out: Path) -> Optional[Path]:
    used = _used(res)
    if "cfg.env.id" not in used:
        return None
    ns = normalize(used["auc"].to_numpy(float), used["cfg.env.id"])
    if not np.isfinite(ns).any():
        return None
    used = used.assign(_ns=ns)
    lo, hi = np.nanmin(ns), np.nanmax(ns)
    pad = 0.05 * max(hi - lo, 0.05)
    taus = np.linspace(lo - pad, hi + pad, 200)
    panels = _panels(res.__class__(**{**res.__dict__, "runs": used.assign(used=True)}))
    fig, axes = _grid(len(panels), 2 if len(panels) > 1 else 1, w=6.0 if len(panels) == 1 else 4.8)
    for ax, (title, groups) in zip(axes, panels):
        for lab, g in groups:
            x = g["_ns"].to_numpy(float)
            x = x[np.isfinite(x)]
            if not len(x):
                continue
            tasks = [g.loc[g["cfg.env.id"] == e, "_ns"].to_numpy(float) for e in dict.fromkeys(g["cfg.env.id"])]
            b = profile_band([t[np.isfinite(t)] for t in tasks], taus, reps=500)
            line, = ax.plot(taus, b["profile"], label=lab, lw=1.3)
            if len(x) >= MIN_CI_RUNS:
                ax.fill_between(taus, b["low"], b["high"], alpha=0.15, color=line.get_color(), lw=0)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("normalized AUC τ (0 random policy, 1 the env's reference return)")
        ax.set_ylabel("fraction of runs with score > τ")
        ax.grid(alpha=0.3)
    _fig_legend(fig, axes)
    fig.suptitle("Performance profile of the normalized AUC (rliable's score distribution), 95% stratified "
                 "bootstrap CI", fontsize=10)
    return _save(fig, out, "performance_profile")


def lag_hist_figure(res: "Result", out: Path) -> Optional[Path]:
    if res.lags.empty:
        return None
    panels = _panels(res)
    fig, axes = _grid(len(panels), 2 if len(panels) > 1 else 1, w=6.0 if len(panels) == 1 else 4.8)
    for ax, (title, groups) in zip(axes, panels):
        for lab, g in groups:
            c = res.lags[res.lags["run_id"].isin(g["run_id"])].groupby("lag")["count"].sum()
            if len(c):
                ax.step(c.index, c.to_numpy() / c.sum(), where="mid", label=lab)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("version lag (updates)")
        ax.set_ylabel("share of trained transitions")
        ax.grid(alpha=0.3)
    _fig_legend(fig, axes)
    fig.suptitle("Version lag of trained transitions", fontsize=10)
    return _save(fig, out, "lag_histograms")


def queue_figure(res: "Result", out: Path) -> Optional[Path]:
    c = res.curves
    if "queue_depth" not in c or not (c["queue_depth"].fillna(0) != 0).any():
        return None  # no queue (sync runs) or one that never held anything
    used = _used(res)
    fig, axes = plt.subplots(1, 2, figsize=(12.5, 3.8))
    for key, g in cmp.groups_of(used, res.by):
        d = c[c["run_id"] == g["run_id"].iloc[0]]
        if not d["queue_depth"].notna().any():
            continue
        axes[0].plot(d["wall_time"], d["queue_depth"], lw=0.8, label=cmp.label(res.by, key))
        if "age_s" in d:
            axes[1].plot(d["wall_time"], d["age_s"], lw=0.8, label=cmp.label(res.by, key))
    axes[0].set_ylabel("queue depth (fragments)")
    axes[1].set_ylabel("time in the queue (s)")
    for ax in axes:
        ax.set_xlabel("wall clock (s)")
        ax.grid(alpha=0.3)
    _legend(axes[1])
    fig.suptitle("Queue depth and data age over time (first seed of each group)", fontsize=10)
    fig.tight_layout()
    return _save(fig, out, "queue")


KL_BAND = (0.01, 0.03)  # seed 004: KL(behavior || current) < 0.01 fine, 0.01-0.03 watch, > 0.03 harmful


def actors_figure(res: "Result", out: Path) -> Optional[Path]:
    """The knee (seed 004: add actors until throughput stops paying and KL leaves its band): per measure, the IQM
    and interval of each group against the actor count (log2 axis), one line per value of the other grouping
    keys (e.g. the runner). Drawn when the actor count varies and all runs share one env."""
    s, by = res.summary, res.by
    if "cfg.actors" not in by or s["cfg.actors"].nunique() < 2 or not _one_env(res):
        return None
    keys = [b for b in by if b != "cfg.actors"]
    panels = [("sps", "env steps per second"), ("lag_mean", "version lag of trained data\n(mean; dashed: p95)"),
              ("kl_behavior", "KL(behavior ‖ current) per update"), ("auc", "AUC (mean return per env step)"),
              ("time_to_threshold", "seconds to the threshold\n(runs that reached it)"),
              ("steps_to_threshold", "env steps to the threshold\n(runs that reached it)")]
    panels = [(m, lab) for m, lab in panels if f"{m}_iqm" in s]
    fig, axes = _grid(len(panels), 3, w=4.3, h=3.1, sharey=False)
    xs = sorted(s["cfg.actors"].astype(int).unique())
    for fk, f in (s.groupby(keys, sort=True, dropna=False) if keys else [((), s)]):
        lab = cmp.label(keys, cmp.text_key(s, keys, fk)) if keys else "all"
        f = f.assign(_x=f["cfg.actors"].astype(int)).sort_values("_x")
        color = None
        for ax, (m, _) in zip(axes, panels):
            y = f[f"{m}_iqm"].to_numpy(float)
            err = [y - f[f"{m}_low"].to_numpy(float), f[f"{m}_high"].to_numpy(float) - y]
            line = ax.errorbar(f["_x"], y, yerr=err, marker="o", capsize=3, color=color, label=lab)
            color = line[0].get_color()
            if m == "lag_mean" and "lag_p95_iqm" in f:
                ax.plot(f["_x"], f["lag_p95_iqm"], ls="--", color=color, lw=1)
            if m.endswith("_threshold") and "reached" in f:
                for x, yy, k, n in zip(f["_x"], y, f["reached"], f["runs"]):
                    if np.isfinite(yy) and k < n:
                        ax.annotate(f"{int(k)}/{int(n)}", (x, yy), fontsize=7, xytext=(3, 3),
                                    textcoords="offset points", color=color)
    for ax, (m, ylab) in zip(axes, panels):
        if m == "kl_behavior":
            ax.axhspan(*KL_BAND, color="0.85", zorder=0, label="seed 004's watch band")
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([str(x) for x in xs])
        ax.set_xlabel("actors (log2 axis)")
        ax.set_ylabel(ylab, fontsize=8)
        ax.grid(alpha=0.3)
        if m in ("sps", "steps_to_threshold"):
            ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v / 1e3:g}k"))
    _fig_legend(fig, axes)
    small = bool((s["runs"] < MIN_CI_RUNS).any())
    fig.suptitle("Against the actor count: IQM across seeds with "
                 + ("the seed range (groups of < 5 runs)" if small else "95% bootstrap CIs"), fontsize=10)
    return _save(fig, out, "actors")


def recovery_figure(res: "Result", out: Path) -> Optional[Path]:
    """The fraction of the reference's cost each method recovers, per level of the treatment, with its CI: a
    horizontal bar per (method, level); 0 (no better than the reference) and 1 (all of it) marked."""
    c = res.recovery
    if c.empty:
        return None
    lvl = [x for x in c.columns if x.startswith("level.")]
    c = c.assign(_lvl=c[lvl].astype(str).agg(", ".join, axis=1)) if lvl else c.assign(_lvl="")
    methods = list(dict.fromkeys(c["method"]))
    levels = list(dict.fromkeys(c["_lvl"]))
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(c) + 1.4))
    h = 0.8 / max(1, len(levels))
    name = lvl[0][len("level."):].replace("cfg.", "") if len(lvl) == 1 else "level"
    for j, lv in enumerate(levels):
        d = c[c["_lvl"] == lv].set_index("method").reindex(methods)
        y = np.arange(len(methods)) + (j - (len(levels) - 1) / 2) * h
        mid = d["recovered"].to_numpy(float)
        lo, hi = d["recovered_low"].to_numpy(float), d["recovered_high"].to_numpy(float)
        err = np.vstack([np.where(np.isfinite(lo), mid - lo, 0), np.where(np.isfinite(hi), hi - mid, 0)])
        ax.barh(y, mid, height=h * 0.9, xerr=err, capsize=3, label=f"{name}={lv}")
    ax.axvline(0, color="k", lw=0.8)
    ax.axvline(1, color="k", lw=0.8, ls="--")
    ax.set_yticks(np.arange(len(methods)), methods, fontsize=8)
    ax.set_xlabel(f"fraction of {c['reference'].iloc[0]}'s cost recovered (0: none, 1: all)")
    _legend(ax)
    return _save(fig, out, "recovery")


def make_all(res: "Result", out: Path) -> Dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.png"):
        old.unlink()  # a figure that no longer applies must not linger from an earlier build
    figs = {
        "lag_cost": lag_cost_figure(res, out),
        "recovery": recovery_figure(res, out),
        "return_vs_env_steps": returns_figure(res, out, "env_steps", "return_vs_env_steps", "env steps"),
        "return_vs_wall_clock": returns_figure(res, out, "wall_time", "return_vs_wall_clock", "wall clock (s)"),
        "per_seed": per_seed_figure(res, out),
        "performance_profile": profile_figure(res, out),
        "lag_histograms": lag_hist_figure(res, out),
        "queue": queue_figure(res, out),
        "actors": actors_figure(res, out),
    }
    return {k: p for k, p in figs.items() if p is not None}
