"""Where in the learner's update cycle a Ray run's calls land, and what that does to them: a run's phase profile,
beside laglab.sim's for the same overrides and costs.

    python benchmarks/phase_profile.py <run dir>                         # the run's own profile
    python benchmarks/phase_profile.py <run dir> --costs costs.json      # and the model's, on the run's overrides

A rollout call's phase is when its answer reached the learner, counted from the start of the latest update. Per
phase bin, over the steady middle half of the updates (laglab.sim.steady_window), it prints:

* the share of the answers that land there;
* the drift: how much longer the worker's next call took (answer to answer) than the median call;
* the call's way (asking the snapshot board to its first env step) and the gap before it (the previous rollout's
  end to this call's asking: the report, Ray's reply and the next call's dispatch).

The answers that closed a batch (the last before an update's start) get a row of their own: the rest drift
against them. A worker whose next call is slower than the closer's falls back in phase; one whose next call is
faster moves toward the closer. A call answered after an update's start but before its version reached the
snapshot board acts with the version before, and its answer lands after the next closer: its fragments are a
version older than its batch's others. The first line says how late after an update's start the board still
answered the version before, and how early its own, over the window's updates (the update, the learner's
bookkeeping and post, and the board's turn lie before the switch).

Ray runs write ``calls.parquet`` (one row per answered call: its actor, version and moments on the run's clock)
and ``learner/started_t`` / ``learner/published_t`` in ``metrics.parquet``; the model gives the same with
``laglab.sim.simulate(..., trace=True)``. Why this exists: the mean lag of 8 uniform Ray workers, short in the model
(README, "Still off"), is set by how many workers' answers land just after the closer, which the phases' drift
decides (reports/sim_validation/ray_traces.txt, section 7).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "platform")]
BINS_MS = (0.0, 5.0, 10.0, 20.0, 30.0, 50.0, 100.0, 200.0, float("inf"))


def profile(calls: pd.DataFrame, updates: pd.DataFrame,
            bins_ms: Sequence[float] = BINS_MS) -> Tuple[pd.DataFrame, Dict[str, float]]:
    """The phase profile of ``calls`` (columns actor, version, asked, answered, stepping, ended, received; an
    ``incarnation`` column, where there is one, splits an actor's lives) against ``updates`` (started, version:
    the learner's version after the update), over the steady middle half of the updates. Returns the table (a row
    for the closers, then one per bin of ``bins_ms``) and the window's figures (median cycle, when an update's
    version reached the actors, calls counted)."""
    from laglab.sim import steady_window

    updates = updates.sort_values("started").reset_index(drop=True)
    starts = updates["started"].to_numpy(float)
    if len(starts) < 4:
        raise ValueError(f"a phase profile needs at least 4 updates, got {len(starts)}")
    lo, hi = steady_window(len(starts))
    keys = ["actor", "incarnation"] if "incarnation" in calls else ["actor"]
    c = calls.sort_values(keys + ["asked"]).reset_index(drop=True)
    same = (c[keys].shift(-1) == c[keys]).all(axis=1)
    c["cycle"] = np.where(same, c["received"].shift(-1) - c["received"], np.nan)
    prev_same = (c[keys].shift(1) == c[keys]).all(axis=1)
    c["gap"] = np.where(prev_same, c["asked"] - c["ended"].shift(1), np.nan)
    c["way"] = c["stepping"] - c["asked"]
    k = np.searchsorted(starts, c["received"].to_numpy(float), side="right") - 1
    c["update"] = k
    c["phase"] = np.where(k >= 0, c["received"].to_numpy(float) - starts[np.maximum(k, 0)], np.nan)
    # the closer of update j: the last answer received before its start
    nxt = np.searchsorted(starts, c["received"].to_numpy(float), side="right")
    c["closing"] = False
    for j in range(len(starts)):
        before = c.index[(nxt == j) & (c["received"] < starts[j])]
        if len(before):
            c.loc[c.loc[before, "received"].idxmax(), "closing"] = True
    w = c[(c["update"] >= lo) & (c["update"] < hi) & c["cycle"].notna()]
    if w.empty:
        raise ValueError("no call with a next call inside the steady middle half of the updates")
    median = float(w["cycle"].median())
    rows: List[Dict[str, object]] = []

    def row(name: str, part: pd.DataFrame) -> None:
        rows.append({"phase": name, "calls": len(part), "share": len(part) / len(w),
                     "drift_ms": 1e3 * float((part["cycle"] - median).mean()) if len(part) else float("nan"),
                     "way_ms": 1e3 * float(part["way"].mean()) if len(part) else float("nan"),
                     "gap_ms": 1e3 * float(part["gap"].mean()) if len(part) else float("nan")})

    row("closer", w[w["closing"]])
    rest = w[~w["closing"]]
    ph = 1e3 * rest["phase"].to_numpy(float)
    for a, b in zip(bins_ms, bins_ms[1:]):
        row(f"{a:g}-{b:g} ms" if np.isfinite(b) else f">= {a:g} ms", rest[(ph >= a) & (ph < b)])
    old, new = [], []  # per update: the last call answered with the version before, the first with its own
    for j in range(lo, hi):
        v, nxt_start = updates.loc[j, "version"], starts[j + 1] if j + 1 < len(starts) else np.inf
        after = c[(c["answered"] >= starts[j]) & (c["answered"] < nxt_start)]
        if (after["version"] < v).any():
            old.append(float(after.loc[after["version"] < v, "answered"].max()) - starts[j])
        if (after["version"] >= v).any():
            new.append(float(after.loc[after["version"] >= v, "answered"].min()) - starts[j])
    figures = {"median_cycle_ms": 1e3 * median, "calls": float(len(w)),
               "stale_ms": 1e3 * max(old) if old else float("nan"), "fresh_ms": 1e3 * min(new) if new else float("nan")}
    return pd.DataFrame(rows), figures


def from_run(run_dir: Path) -> Tuple[pd.DataFrame, pd.DataFrame, List[str]]:
    """A Ray run's calls, updates and overrides."""
    run_dir = Path(run_dir)
    f = run_dir / "calls.parquet"
    if not f.exists():
        raise ValueError(f"{run_dir} has no calls.parquet (runner=ray runs write it, from 2026-12-07 23:30 UTC)")
    m = pd.read_parquet(run_dir / "metrics.parquet")
    if "learner/started_t" not in m:
        raise ValueError(f"{run_dir}/metrics.parquet has no learner/started_t")
    updates = pd.DataFrame({"started": m["learner/started_t"], "version": m["learner/version"]})
    import yaml

    ov = run_dir / ".hydra" / "overrides.yaml"
    overrides = [o for o in (yaml.safe_load(ov.read_text()) or []) if not o.startswith(("tracking.", "hydra."))] \
        if ov.exists() else []
    return pd.read_parquet(f), updates, overrides


def from_model(overrides: Sequence[str], costs: Path, seeds: int = 5) -> List[Tuple[pd.DataFrame, pd.DataFrame]]:
    """laglab.sim's calls and updates on ``overrides`` and ``costs``, one pair per seed (each a run of its own)."""
    from laglab.sim import Costs, compose, simulate

    cfg = compose(list(overrides))
    c = Costs.from_dict(json.loads(Path(costs).read_text()))
    out = []
    for s in range(seeds):
        res = simulate(cfg, c, seed=s, trace=True)
        updates = pd.DataFrame(res["update_trace"])
        updates["version"] = np.arange(1, len(updates) + 1)  # (the learner's version after each)
        out.append((pd.DataFrame(res["call_trace"]), updates))
    return out


def text(table: pd.DataFrame, figures: Dict[str, float], title: str) -> str:
    lines = [f"{title}: {figures['calls']:.0f} calls, median call {figures['median_cycle_ms']:.1f} ms; after an "
             f"update's start the board answered the version before as late as {figures['stale_ms']:.1f} ms and "
             f"its own as early as {figures['fresh_ms']:.1f} ms",
             f"{'phase':>12} {'calls':>6} {'share':>6} {'drift ms':>9} {'way ms':>7} {'gap ms':>7}"]
    for r in table.itertuples():
        lines.append(f"{r.phase:>12} {r.calls:>6d} {100 * r.share:>5.1f}% {r.drift_ms:>+9.2f} {r.way_ms:>7.2f} "
                     f"{r.gap_ms:>7.2f}")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="Ray run dirs (their calls pooled: the same overrides)")
    ap.add_argument("--costs", type=Path, help="also the model's profile on the runs' overrides, from these costs")
    ap.add_argument("--seeds", type=int, default=5, help="the model's draws (default 5)")
    a = ap.parse_args(argv)
    try:
        tables = []
        for run in a.runs:
            calls, updates, overrides = from_run(run)
            tables.append(profile(calls, updates))
        merged = _pool(tables)
        print(text(*merged, "run" if len(a.runs) == 1 else f"{len(a.runs)} runs"))
        if a.costs:
            print()
            model = _pool([profile(*pair) for pair in from_model(overrides, a.costs, a.seeds)])
            print(text(*model, f"model ({a.seeds} seeds; {' '.join(overrides)})"))
    except (ValueError, OSError) as e:
        print(f"phase_profile: {e}", file=sys.stderr)
        return 2
    return 0


def _pool(tables: List[Tuple[pd.DataFrame, Dict[str, float]]]) -> Tuple[pd.DataFrame, Dict[str, float]]:
    """Several runs' profiles as one: each bin's means weighted by its calls."""
    if len(tables) == 1:
        return tables[0]
    t = pd.concat([x for x, _ in tables])
    n = t.groupby("phase", sort=False)["calls"].sum()
    out = []
    for phase, part in t.groupby("phase", sort=False):
        wts = part["calls"].to_numpy(float)
        avg = {k: float(np.average(part[k].fillna(0), weights=wts)) if wts.sum() else float("nan")
               for k in ("drift_ms", "way_ms", "gap_ms")}
        out.append({"phase": phase, "calls": int(n[phase]), "share": float(n[phase] / n.sum()), **avg})
    figures = {"calls": float(sum(f["calls"] for _, f in tables)),
               "median_cycle_ms": float(np.median([f["median_cycle_ms"] for _, f in tables])),
               "stale_ms": float(np.nanmax([f["stale_ms"] for _, f in tables])),
               "fresh_ms": float(np.nanmin([f["fresh_ms"] for _, f in tables]))}
    return pd.DataFrame(out), figures


if __name__ == "__main__":
    sys.exit(main())
