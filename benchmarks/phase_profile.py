"""Where in the learner's update cycle a Ray run's rollout reports land, and what that does to the worker's next
call: a run's phase profile, beside laglab.sim's for the same overrides and costs.

    python benchmarks/phase_profile.py <run dir> [<run dir> ...]             # the runs' own profile (pooled)
    python benchmarks/phase_profile.py <run dir> ... --costs costs.json      # and the model's, on their overrides

A report's phase is when the learner's receiver took it, counted from the start of the latest update. Per phase
bin, over the steady middle half of each run's updates (laglab.sim.steady_window), it prints:

* the share of the reports that land there;
* the worker's next call: its drift (how much longer it took, report to report, than the run's median call), its
  way (asking the snapshot board to its first env step) and the gap before it (the rollout's end to the next
  call's asking: the report's making and Ray's return; with ``runner.max_inflight`` >= 2 the next call is already
  queued at the worker).

The reports that completed a batch (metrics' ``learner/closed_by``: the incarnation whose fragment did) get a row
of their own. A worker whose next call takes longer than the closer's falls back in phase; one whose next call is
shorter gains on it. A call the board answers after an update's start but before that update's version has
reached it acts with the version before, so its fragments are a version older than their batch's others. The first
line says, over the updates that published, how long after an update's start the last call answered with the
version before came, and the first with the update's own (the medians of each, over the updates that had such
calls: the switch lies between; the update, the learner's bookkeeping and post, and the board's turn lie before
it). With ``actor.fixed_lag`` the board never answers an update's own version (no second figure).

Ray runs write ``calls.parquet`` (one row per answered call: its actor, incarnation, the version it acted with and
the board's answer, and its moments on the run's clock) and ``learner/started_t``, ``learner/published_t`` and
``learner/closed_by`` in ``metrics.parquet``; the model gives the same with ``laglab.sim.simulate(...,
trace=True)``. Why this exists: the mean lag of 8 uniform Ray workers, short in the model (README, "Still off"), is
set by how many workers' calls are answered just after an update's start, which the workers' phases decide
(reports/sim_validation/ray_traces.txt, section 7). On one host the moments are exact to two clock readings; across
hosts only as good as their wall clocks agree (a few ms under NTP: the size of the bins).
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
CALL_COLUMNS = ("actor", "version", "board_version", "asked", "answered", "stepping", "ended", "received")


def window_rows(calls: pd.DataFrame, updates: pd.DataFrame) -> Tuple[pd.DataFrame, Dict[str, List[float]]]:
    """Each report received in the steady middle half of the updates, with its phase, whether it closed a batch,
    and its worker's next call (drift against this run's median call, way, gap); and per publishing update in
    that window the last call answered with the version before and the first with its own, after its start.
    ``calls``: :data:`CALL_COLUMNS` (``incarnation`` too where a run has it: an actor's lives); ``updates``:
    started, version (the learner's after the update), and where known published (NaN: no publication) and
    closed_by (the incarnation whose fragment completed the batch)."""
    from laglab.sim import steady_window

    missing = [k for k in CALL_COLUMNS if k not in calls and k != "board_version"]
    if missing:
        raise ValueError(f"calls: no column {', '.join(missing)}")
    if calls.empty:
        raise ValueError("calls: no answered call")
    updates = updates.sort_values("started").reset_index(drop=True)
    starts = updates["started"].to_numpy(float)
    if len(starts) < 4:
        raise ValueError(f"a phase profile needs at least 4 updates, got {len(starts)}")
    lo, hi = steady_window(len(starts))
    c = calls.copy()
    if "board_version" not in c:  # (calls.parquet of bd2de33 had the acting version only: the board's answer at
        c["board_version"] = c["version"]  # actor.sync_min_lag 0)
    if "incarnation" not in c:
        c["incarnation"] = c["actor"]
    c = c.sort_values(["incarnation", "asked"]).reset_index(drop=True)
    nxt = c.groupby("incarnation").shift(-1)
    c["cycle"] = nxt["received"] - c["received"]
    c["next_way"] = nxt["stepping"] - nxt["asked"]
    c["next_gap"] = nxt["asked"] - c["ended"]
    k = np.searchsorted(starts, c["received"].to_numpy(float), side="right") - 1
    c["update"] = k
    c["phase"] = np.where(k >= 0, c["received"].to_numpy(float) - starts[np.maximum(k, 0)], np.nan)
    closing = np.zeros(len(c), bool)
    if "closed_by" in updates:  # the report of the incarnation that completed batch j: its last before j's start
        lives = {inc: (g["received"].to_numpy(float), g.index.to_numpy())
                 for inc, g in c.sort_values("received").groupby("incarnation")}
        for j, inc in enumerate(updates["closed_by"].to_numpy()):
            got, idx = lives.get(inc, (np.zeros(0), np.zeros(0, int)))
            p = int(np.searchsorted(got, starts[j], side="right")) - 1
            if p >= 0:
                closing[idx[p]] = True
    else:  # (the last report before each start)
        sel = k + 1 < len(starts)
        closing[c.loc[sel, "received"].groupby((k + 1)[sel]).idxmax().to_numpy()] = True
    c["closing"] = closing
    w = c[(c["update"] >= lo) & (c["update"] < hi) & c["cycle"].notna()].copy()
    if w.empty:
        raise ValueError("no report with a next call inside the steady middle half of the updates")
    w["drift"] = w["cycle"] - float(w["cycle"].median())
    switch: Dict[str, List[float]] = {"stale": [], "fresh": []}
    by_answer = c.sort_values("answered")
    answered = by_answer["answered"].to_numpy(float)
    board = by_answer["board_version"].to_numpy()
    published = updates["published"].to_numpy(float) if "published" in updates else np.zeros(len(starts))
    for j in range(lo, hi):
        if not np.isfinite(published[j]):
            continue
        a, b = np.searchsorted(answered, [starts[j], starts[j + 1] if j + 1 < len(starts) else np.inf])
        v = updates.loc[j, "version"]
        old, new = answered[a:b][board[a:b] < v], answered[a:b][board[a:b] >= v]
        if len(old):
            switch["stale"].append(float(old.max()) - starts[j])
        if len(new):
            switch["fresh"].append(float(new.min()) - starts[j])
    return w[["phase", "closing", "drift", "next_way", "next_gap", "cycle"]], switch


def table(rows: pd.DataFrame, bins_ms: Sequence[float] = BINS_MS) -> pd.DataFrame:
    """The profile of :func:`window_rows`' rows (one run's or several runs' pooled): the closers, then a row per
    phase bin (the means skip what a report has not: a worker's last call has no next)."""
    out: List[Dict[str, object]] = []

    def row(name: str, part: pd.DataFrame) -> None:
        out.append({"phase": name, "calls": len(part), "share": len(part) / len(rows),
                    **{f"{k}_ms": 1e3 * float(part[k].mean()) if len(part) else float("nan")
                       for k in ("drift", "next_way", "next_gap")}})

    row("closer", rows[rows["closing"]])
    rest = rows[~rows["closing"]]
    ph = 1e3 * rest["phase"].to_numpy(float)
    for a, b in zip(bins_ms, bins_ms[1:]):
        row(f"{a:g}-{b:g} ms" if np.isfinite(b) else f">= {a:g} ms", rest[(ph >= a) & (ph < b)])
    return pd.DataFrame(out)


def profile(pairs: Sequence[Tuple[pd.DataFrame, pd.DataFrame]]) -> Tuple[pd.DataFrame, Dict[str, float]]:
    """Several runs' (calls, updates) as one profile: each run's reports against its own median call, pooled."""
    parts, switch, medians = [], {"stale": [], "fresh": []}, []
    for calls, updates in pairs:
        rows, sw = window_rows(calls, updates)
        parts.append(rows)
        medians.append(float(rows["cycle"].median()))
        for k in switch:
            switch[k] += sw[k]
    rows = pd.concat(parts, ignore_index=True)
    figures = {"runs": float(len(parts)), "calls": float(len(rows)), "median_cycle_ms": 1e3 * float(np.median(medians)),
               **{f"{k}_ms": 1e3 * float(np.median(v)) if v else float("nan") for k, v in switch.items()}}
    return table(rows), figures


def from_run(run_dir: Path) -> Tuple[pd.DataFrame, pd.DataFrame, List[str]]:
    """A Ray run's calls, updates and overrides (train.py's, without tracking.* and hydra.*)."""
    run_dir = Path(run_dir)
    f = run_dir / "calls.parquet"
    if not f.exists():
        raise ValueError(f"{run_dir} has no calls.parquet (runner=ray runs write it from bd2de33, 2026-12-07, once "
                         "a call has been answered)")
    m = pd.read_parquet(run_dir / "metrics.parquet")
    if "learner/started_t" not in m:
        raise ValueError(f"{run_dir}/metrics.parquet has no learner/started_t")
    updates = pd.DataFrame({"started": m["learner/started_t"], "version": m["learner/version"]})
    if "learner/published_t" in m:
        updates["published"] = m["learner/published_t"]
    if "learner/closed_by" in m:
        updates["closed_by"] = m["learner/closed_by"]
    import yaml

    ov = run_dir / ".hydra" / "overrides.yaml"
    overrides = [o for o in (yaml.safe_load(ov.read_text()) or []) if not o.startswith(("tracking.", "hydra."))] \
        if ov.exists() else []
    return pd.read_parquet(f), updates, overrides


def from_model(overrides: Sequence[str], costs: Path, seeds: int = 5) -> List[Tuple[pd.DataFrame, pd.DataFrame]]:
    """laglab.sim's calls and updates on ``overrides`` and ``costs``, one pair per seed (each a run of its own)."""
    from laglab.sim import Costs, compose, simulate

    cfg = compose(list(overrides))
    if cfg.runner.name.value != "ray":
        raise ValueError(f"the model's calls are Ray's: these overrides run runner={cfg.runner.name.value}")
    c = Costs.from_dict(json.loads(Path(costs).read_text()))
    out = []
    for s in range(seeds):
        res = simulate(cfg, c, seed=s, trace=True)
        out.append((pd.DataFrame(res["call_trace"]), pd.DataFrame(res["update_trace"])))
    return out


def text(table_: pd.DataFrame, figures: Dict[str, float], title: str) -> str:
    lines = [f"{title}: {figures['calls']:.0f} reports, median call {figures['median_cycle_ms']:.1f} ms; after an "
             f"update's start the last call answered with the version before came at {figures['stale_ms']:.1f} ms "
             f"and the first with its own at {figures['fresh_ms']:.1f} ms (medians)",
             f"{'phase':>12} {'calls':>6} {'share':>6} {'next call:':>10} {'drift ms':>8} {'way ms':>7} {'gap ms':>7}"]
    for r in table_.itertuples():
        lines.append(f"{r.phase:>12} {r.calls:>6d} {100 * r.share:>5.1f}% {'':>10} {r.drift_ms:>+8.2f} "
                     f"{r.next_way_ms:>7.2f} {r.next_gap_ms:>7.2f}")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="Ray run dirs (pooled: give runs of the same overrides)")
    ap.add_argument("--costs", type=Path, help="also the model's profile on the runs' overrides, from these costs")
    ap.add_argument("--seeds", type=int, default=5, help="the model's draws (default 5)")
    a = ap.parse_args(argv)
    from laglab.sim import SimError

    try:
        if a.seeds < 1:
            raise ValueError(f"--seeds must be >= 1, got {a.seeds}")
        loaded = [from_run(run) for run in a.runs]
        kinds = {tuple(sorted(o for o in ov if not o.startswith("seed="))) for _, _, ov in loaded}
        if len(kinds) > 1:
            raise ValueError("the runs differ in their overrides (besides the seed): " +
                             " | ".join(" ".join(k) for k in sorted(kinds)))
        print(text(*profile([(c, u) for c, u, _ in loaded]),
                   "run" if len(loaded) == 1 else f"{len(loaded)} runs"))
        if a.costs:
            overrides = loaded[0][2]
            if not overrides:
                raise ValueError(f"{a.runs[0]} has no .hydra/overrides.yaml: the model needs the run's overrides")
            print()
            print(text(*profile(from_model(overrides, a.costs, a.seeds)),
                       f"model ({a.seeds} seeds; {' '.join(overrides)})"))
    except (ValueError, OSError, SimError) as e:
        print(f"phase_profile: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
