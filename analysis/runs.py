"""The two tables everything else starts from, for run dirs, sweep dirs and report dirs alike:

- :func:`load_runs`: one row per run (``run_id``, config as ``cfg.<key>``, summary, provenance, measures, ``used``);
- :func:`curves`: the learning curves in long format, one row per (run, learner update): ``run_id``,
  ``env_steps``, ``wall_time``, ``episodic_return_mean`` and the lag / KL / queue columns the figures use.

A report dir keeps exactly these two tables (``runs.csv``, ``curves.parquet``; plus ``lag_counts.csv``, the
version-lag histogram of each run whose lag varied): :func:`write_compact` writes them, and reading a report
dir gives back the same tables, so a report rebuilds from its own files."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional

import numpy as np
import pandas as pd

from .load import AnalysisError, CURVES, LAG_COUNTS, RUNS_CSV, find_runs, histograms, is_report_dir, load_run, metrics
from .measures import RETURN, THRESHOLDS, run_measures

# the per-update columns a report keeps (renamed from metrics.parquet's names where they carry a prefix)
CURVE_COLUMNS = {"env_steps": "env_steps", "wall_time": "wall_time", RETURN: RETURN, "lag/mean": "lag_mean",
                 "lag/kl_behavior": "kl_behavior", "transport/queue_depth": "queue_depth",
                 "transport/age_s_mean": "age_s"}


def _split(paths: Iterable[str | Path]) -> tuple:
    """(report dirs, run and sweep dirs) among ``paths``. Report dirs and run dirs may be mixed: a study that spans
    sessions or machines keeps what it has as a report's compact data, and adds new run dirs to it later."""
    paths = [Path(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]
    for p in paths:
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such run, sweep or report dir")
    reports = [p for p in paths if is_report_dir(p) and not (p / "summary.json").exists()]
    return reports, [p for p in paths if p not in reports]


def _offsets(reports) -> list:
    """The run id each report's first run takes when reports and run dirs are read together: the reports' runs
    first, in the order given, then the run dirs' (so :func:`load_runs` and :func:`curves` of the same paths
    agree)."""
    out, n = [], 0
    for r in reports:
        out.append(n)
        ids = pd.read_csv(r / RUNS_CSV, usecols=["run_id"])["run_id"]
        n += int(ids.max()) + 1 if len(ids) else 0
    return out + [n]


def _new_dirs(reports, dirs) -> list:
    """The run dirs under ``dirs`` that none of ``reports`` already holds (by path)."""
    held = set()
    for r in reports:
        held |= set(pd.read_csv(r / RUNS_CSV, usecols=["run_dir"])["run_dir"].astype(str))
    return [d for d in (find_runs(dirs) if dirs else []) if str(d) not in held]


def _version_lags(run_dir: Path) -> np.ndarray:
    h = histograms(run_dir)
    vals = [np.asarray(v, float) for v in h[h["metric"] == "lag/version_lag"]["values"]]
    return np.concatenate(vals) if vals else np.array([])


def _budget(row: dict) -> float:
    for k in ("cfg.total_env_steps", "summary.total_env_steps"):
        v = row.get(k)
        if v is not None and pd.notna(v):
            return float(v)
    return float("nan")


def load_runs(paths, threshold: Optional[float] = None, include_failed: bool = False) -> pd.DataFrame:
    """One row per run under ``paths`` (run dirs, sweep dirs, report dirs): ``run_id``, ``run_dir``, ``status``,
    ``cfg.*``, ``summary.*``, ``provenance.*``, ``eval.*``, and the measures (``auc``, ``final_return`` =
    summary.json's ``final_return_mean``, ``steps_to_threshold``, ``reached``, ``sps``, ``lag_mean``, ...).
    ``used`` marks the runs statistics use (completed ones, or all with ``include_failed``)."""
    reports, dirs = _split(paths)
    offsets = _offsets(reports)
    frames = []
    for r, off in zip(reports, offsets):
        f = pd.read_csv(r / RUNS_CSV)
        f["run_id"] = f["run_id"] + off
        frames.append(f)
    rows = []
    for run_dir in _new_dirs(reports, dirs):
        row = load_run(run_dir)
        env_id = row.get("cfg.env.id")
        thr = threshold if threshold is not None else THRESHOLDS.get(str(env_id or ""), float("nan"))
        lags = _version_lags(run_dir)
        row.update(run_measures(metrics(run_dir), _budget(row), thr, lags))
        row["final_return"] = row.get("summary.final_return_mean", float("nan"))
        row["sps"] = row.get("summary.sps", float("nan"))
        row["lag_varies"] = bool(len(lags) and np.ptp(lags) > 0)
        rows.append(row)
    if rows:
        frames.append(pd.DataFrame(rows))
    if not frames:
        raise FileNotFoundError(f"no run dirs (with a summary.json) under {', '.join(map(str, paths))}")
    if rows:
        new = frames[-1]
        new.insert(0, "run_id", offsets[-1] + np.arange(len(new)))
        new["used"] = True if include_failed else new["status"].eq("completed")
    runs = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]  # (reports' tables as written)
    if include_failed:
        runs["used"] = True
    return runs.copy()  # one block per dtype (built column by column, it would warn on every later assign)


def curves(paths, runs: Optional[pd.DataFrame] = None) -> pd.DataFrame:
    """The learning curves of every run under ``paths`` in long format (``run_id`` as in :func:`load_runs` of the
    same paths). Columns: ``run_id``, ``env_steps``, ``wall_time``, ``episodic_return_mean``, ``lag_mean``,
    ``kl_behavior``, and, for runs with a queue (not ``runner=sync``), ``queue_depth`` and ``age_s``."""
    reports, dirs = _split(paths)
    offsets = _offsets(reports)
    frames = []
    for r, off in zip(reports, offsets):
        c = pd.read_parquet(r / CURVES)
        c["run_id"] = c["run_id"].astype("int64") + off
        frames.append(c)
    if runs is None:  # the same run ids as load_runs(paths), without computing the measures
        found = _new_dirs(reports, dirs)
        runs = pd.DataFrame({"run_id": offsets[-1] + np.arange(len(found)), "run_dir": [str(p) for p in found],
                             "cfg.runner.name": [load_run(p).get("cfg.runner.name") for p in found]})
    else:
        runs = runs[runs["run_id"] >= offsets[-1]]  # (the reports' runs have their curves above)
    runner = runs["cfg.runner.name"] if "cfg.runner.name" in runs else pd.Series([None] * len(runs), index=runs.index)
    for run_id, run_dir, name in zip(runs["run_id"], runs["run_dir"], runner):
        m = metrics(run_dir)
        c = m[[k for k in CURVE_COLUMNS if k in m]].rename(columns=CURVE_COLUMNS)
        if name == "sync":
            c = c.drop(columns=[k for k in ("queue_depth", "age_s") if k in c])
        c.insert(0, "run_id", int(run_id))
        frames.append(c)
    if not frames:
        return pd.DataFrame(columns=["run_id"] + list(CURVE_COLUMNS.values()))
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


def lag_counts(runs: pd.DataFrame, reports=()) -> pd.DataFrame:
    """Version-lag histogram of each run whose lag varied: ``run_id``, ``lag``, ``count`` (``reports``: report
    dirs read together with run dirs, whose runs' histograms are their lag_counts.csv)."""
    reports = [Path(r) for r in reports]
    frames = []
    for r, off in zip(reports, _offsets(reports)):
        f = read_lag_counts(r)
        f["run_id"] = f["run_id"].astype("int64") + off
        frames.append(f)
    runs = runs[runs["run_id"] >= _offsets(reports)[-1]]
    rows = []
    for run_id, run_dir, varies in zip(runs["run_id"], runs["run_dir"], runs.get("lag_varies", [False] * len(runs))):
        if not varies or not isinstance(run_dir, str) or not Path(run_dir).is_dir():
            continue
        v, n = np.unique(np.round(_version_lags(Path(run_dir))).astype(int), return_counts=True)
        rows += [{"run_id": int(run_id), "lag": int(a), "count": int(b)} for a, b in zip(v, n)]
    frames.append(pd.DataFrame(rows, columns=["run_id", "lag", "count"]))
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[-1]


def write_compact(out: Path, runs: pd.DataFrame, curve_df: pd.DataFrame, lags: pd.DataFrame) -> None:
    """runs.csv, curves.parquet (float32 values, all-empty columns dropped) and lag_counts.csv when any."""
    out.mkdir(parents=True, exist_ok=True)
    runs.to_csv(out / RUNS_CSV, index=False)
    c = curve_df.dropna(axis=1, how="all").copy()
    for col in c.columns:
        if col not in ("run_id", "env_steps"):
            c[col] = c[col].astype("float32")
    c["run_id"] = c["run_id"].astype("int32")
    c["env_steps"] = c["env_steps"].astype("int64")
    c.to_parquet(out / CURVES, index=False, compression="zstd")
    if len(lags):
        lags.to_csv(out / LAG_COUNTS, index=False)
    elif (out / LAG_COUNTS).exists():
        (out / LAG_COUNTS).unlink()


def read_lag_counts(report_dir: Path) -> pd.DataFrame:
    p = Path(report_dir) / LAG_COUNTS
    return pd.read_csv(p) if p.exists() else pd.DataFrame(columns=["run_id", "lag", "count"])
