"""One command from run dirs to an answer, and back from the answer's own files::

    python -m analysis.report <run or sweep dirs...> --out <dir> [--by cfg.algo.name ...] [--threshold 475]
                              [--baseline "cfg.actor.fixed_lag=0"] [--select cfg.learner.lr --select-on seed=0-4]
                              [--reference "cfg.algo.name=ppo"] [--allow-mixed] [--include-failed]
    python -m analysis.report reports/<study>          # rebuild a report from its committed compact files
    python -m analysis.report reports/sim_validation   # the simulator's validation (analysis.sim_validation)
    python -m analysis.report reports/scale            # the scaling study on paper (analysis.scale)

Writes the compact data (``runs.csv``: one row per run, config, provenance and measures, its ``used`` the runs
eligible as loaded — completed ones — since a rebuild applies ``--select`` to them again; which runs the statistics
used after the selection is the ``used`` column of report.md's Runs table; ``curves.parquet``: the
learning curves in long format; ``lag_counts.csv`` where lag varied within runs; ``report.json``: the options),
then builds from those files alone ``summary.csv`` (one row per group), ``costs.csv`` (differences in cost
between families), ``normalized.csv`` (rliable's aggregates on normalized scores), ``report.md``, a
self-contained ``report.html`` and the figures. The bootstrap has a fixed seed, so a rebuild gives identical
tables.

Groups are the config keys that vary across the used runs, seed excluded (``--by`` overrides). The baseline is
matched: ``--baseline cfg.actor.fixed_lag=0`` compares each group with the group of the same other keys at lag 0
(default: ``runner=sync`` or ``actor.fixed_lag=0`` when it is a grouping key). Runs whose env id or step budget
differ are refused unless ``--allow-mixed``. Failed or interrupted runs are listed with their status and left
out of the statistics unless ``--include-failed``.
"""
from __future__ import annotations

import argparse
import base64
import dataclasses
import html
import json
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import pandas as pd

from . import compare as cmp, scale, sim_validation
from .compare import AnalysisError, MIN_CI_RUNS, MIN_CLAIM_RUNS
from .load import REPORT_JSON, find_runs, is_report_dir
from .measures import WALL_CLOCK
from .runs import curves as load_curves, lag_counts, load_runs, read_lag_counts, write_compact

FORMAT = 2  # report.json format
# laglab.sim's reports: (what it is, is it one, its rebuild) — they have their own compact files, not run dirs
MODEL_REPORTS = [("the simulator's validation", sim_validation.is_validation_dir, sim_validation.rebuild),
                 ("the scaling study", scale.is_scale_dir, scale.rebuild)]
BUSY = 0.25  # a run started with more than this fraction of the machine busy was measured under load


@dataclass
class Options:
    by: Optional[List[str]] = None
    baseline: Optional[str] = None
    threshold: Optional[float] = None
    allow_mixed: bool = False
    include_failed: bool = False
    select: Optional[str] = None
    select_on: Optional[str] = None
    command: str = ""
    reference: Optional[str] = None


@dataclass
class Result:
    runs: pd.DataFrame
    curves: pd.DataFrame
    lags: pd.DataFrame
    by: List[str]
    baseline: Dict[str, str]
    summary: pd.DataFrame
    costs: pd.DataFrame
    normalized: pd.DataFrame
    selection: pd.DataFrame
    recovery: pd.DataFrame = field(default_factory=pd.DataFrame)
    warnings: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)


def default_baseline(runs: pd.DataFrame, by: List[str]) -> Dict[str, str]:
    """The lag-0 group when there is one: ``runner=sync``, else ``actor.fixed_lag=0``."""
    for key, val in (("cfg.runner.name", "sync"), ("cfg.actor.fixed_lag", "0")):
        if key in by and (cmp.as_text(runs[key]) == val).any():
            return {key: val}
    return {}


def check_mixed(used: pd.DataFrame, allow_mixed: bool) -> None:
    if allow_mixed:
        return
    for key, what in (("cfg.env.id", "env ids"), ("cfg.total_env_steps", "step budgets")):
        if key in used and used[key].nunique() > 1:
            raise AnalysisError(f"the runs have different {what} ({', '.join(map(str, sorted(used[key].unique())))}); "
                                "pooling them would compare unlike things. Analyse them separately, or pass "
                                "--allow-mixed (then statistics are stratified by env id)")


def build(runs: pd.DataFrame, curve_df: pd.DataFrame, lags: pd.DataFrame, opts: Options) -> Result:
    """Everything a report shows, from the compact tables."""
    if not runs["used"].any():
        raise AnalysisError("no completed run to analyse (pass --include-failed to use the others)")
    check_mixed(runs[runs["used"]], opts.allow_mixed)
    by = list(opts.by) if opts.by is not None else None
    selection = pd.DataFrame()
    if opts.select:
        if not opts.select_on:
            raise AnalysisError("--select needs --select-on, e.g. --select-on seed=0-4")
        pre_by = by if by is not None else cmp.varying_keys(runs[runs["used"]])
        runs, selection = cmp.select(runs, opts.select, cmp.parse_seeds(opts.select_on), pre_by)
        by = [b for b in pre_by if b != opts.select]  # the chosen value is part of the group, not a key of it
        if not runs["used"].any():  # the selection phase of a study, before any held-out run
            keys = [c for c in selection.columns if c.startswith("cfg.") and c != opts.select]
            chosen = "; ".join(f"{cmp.label(keys, tuple(str(r[c]) for c in keys))}: {opts.select}={r[opts.select]:g}"
                               for _, r in selection.iterrows())
            held = runs[runs["selection"] != "selection"]
            if len(held):  # held-out runs exist, at values the selection did not choose
                values = ", ".join(sorted(held[opts.select].astype(str).unique()))
                raise AnalysisError(f"no held-out run (outside the selection seeds {opts.select_on}) at the chosen "
                                    f"values: the selection chose {chosen}, and the {len(held)} held-out runs here are "
                                    f"at {opts.select}={values}. Run the held-out seeds at the chosen values, then "
                                    "report all the run dirs together")
            raise AnalysisError(f"no run outside the selection seeds ({opts.select_on}) yet, so nothing to report on "
                                f"held-out seeds. The selection chose: {chosen}. Run the held-out seeds at those "
                                "values, then report all the run dirs together")
    if by is None:
        by = cmp.varying_keys(runs[runs["used"]])
    unknown = [b for b in by if b not in runs]
    if unknown:
        raise AnalysisError(f"--by {' '.join(unknown)}: no such column; config columns look like cfg.algo.name")
    baseline = cmp.parse_assignments(opts.baseline) if opts.baseline else default_baseline(runs[runs["used"]], by)
    constant = [k for k in baseline if k not in by and k in runs and runs.loc[runs["used"], k].astype(str).nunique() <= 1]
    if constant:  # a key the runs do not vary (a sweep not finished yet, one arm): nothing to compare, not an error
        said = "; ".join(f"{k} has the one value {runs.loc[runs['used'], k].astype(str).iloc[0]!r}" for k in constant)
        baseline = {k: v for k, v in baseline.items() if k not in constant}
    if opts.by is None:  # the treatment (the baseline's keys) last: "algo.name=ppo, actor.fixed_lag=4"
        by = [b for b in by if b not in baseline] + [b for b in by if b in baseline]
    runs = runs.copy()  # (defragmented: selection and measures added columns one by one)
    summary = cmp.summarize(runs, by, baseline)
    costs = cmp.cost_differences(runs, by, baseline)
    normalized = cmp.normalized_aggregates(runs, by)
    recovery = cmp.recovery(runs, by, baseline, cmp.parse_assignments(opts.reference))
    res = Result(runs, curve_df, lags, by, baseline, summary, costs, normalized, selection, recovery)
    res.warnings, res.notes = warnings_for(res)
    if constant:
        res.warnings.insert(0, f"--baseline {opts.baseline}: the runs do not vary it ({said}), so there is no "
                               "baseline to compare with and no cost view")
    return res


def _groups_named(res: Result, mask: pd.Series) -> str:
    used = res.runs[res.runs["used"] & mask]
    names = [cmp.label(res.by, k) for k, _ in cmp.groups_of(used, res.by)]
    return "; ".join(names[:8]) + (f"; and {len(names) - 8} more" if len(names) > 8 else "")


def warnings_for(res: Result):
    """What a reader must know before believing the tables: code that differs, load, small groups."""
    w: List[str] = []
    notes: List[str] = []
    s, used = res.summary, res.runs[res.runs["used"]]
    if "code" in s and s["code"].nunique() > 1:
        common = s["code"].value_counts().index[0]
        odd = s[s["code"] != common]
        w.append(f"groups ran different code: most ran {common}; these did not: " + "; ".join(
            f"{cmp.label(res.by, tuple(str(r[b]) for b in res.by))} ({r['code']})" for _, r in odd.head(12).iterrows())
            + (f"; and {len(odd) - 12} more" if len(odd) > 12 else "")
            + " (git commit, +dirty for uncommitted changes; a group listing two ran both)")
    cpu = used.get("provenance.cpu")
    if cpu is not None and cpu.dropna().nunique() > 1:
        kinds = cpu.fillna("unknown").value_counts()
        w.append("runs ran on different CPUs (" + "; ".join(f"{k}: {n}" for k, n in kinds.items()) + "): the same "
                 "commit and seed give the same run on one kind of CPU only, so seeds are not paired across kinds")
    if "code" in s and s["code"].str.contains(r"\+dirty").any():
        w.append("some runs ran with uncommitted changes (+dirty): their code is not exactly a commit")
    busy, alive = used.get("provenance.cpu_busy"), used.get("provenance.laglab_runs_alive")
    if busy is None and alive is None:
        notes.append("host load was not recorded for these runs (provenance before issue 16): wall-clock "
                     "measures (time to threshold, SPS) cannot be checked for load")
    else:
        b = pd.to_numeric(busy, errors="coerce") if busy is not None else pd.Series(np.nan, index=used.index)
        a = pd.to_numeric(alive, errors="coerce") if alive is not None else pd.Series(np.nan, index=used.index)
        # before cpu_busy excluded a run's descendants, it counted the process runner's own actors as other load
        own = used.get("provenance.cpu_busy_own_excluded")
        own = own.fillna(False).astype(bool) if own is not None else pd.Series(False, index=used.index)
        runner = used.get("cfg.runner.name", pd.Series("", index=used.index)).astype(str)
        blind = (runner == "process") & ~own & b.notna()
        if blind.any():
            b = b.where(~blind)
            notes.append(f"cpu_busy of {int(blind.sum())} process-runner runs was recorded before it excluded the run's "
                         "own actor processes (it counted them as other load): not read as load (other laglab runs "
                         "alive at their start still are)")
        loaded = (b > BUSY) | (a > 0)
        if loaded.any():
            w.append(f"wall-clock measures ({', '.join(WALL_CLOCK)}) of {int(loaded.sum())}/{len(used)} runs were taken "
                     f"under load (other processes used > {BUSY:.0%} of the machine while the run ran, or another laglab "
                     f"run was alive at its start; "
                     f"CPU busy {b.min():.0%}-{b.max():.0%}, other runs alive up to {int(a.max()) if a.notna().any() else '?'}): "
                     f"groups {_groups_named(res, loaded.reindex(res.runs.index, fill_value=False))}")
    div = used.get(cmp.DIVERGED)
    if div is not None and div.notna().any():
        d = div.notna()
        w.append(f"{int(d.sum())}/{len(used)} runs diverged (a non-finite loss, at update {int(div.min())}-"
                 f"{int(div.max())}; summary.json's diverged_at_update): after it their policy acts NaN and their "
                 f"returns are undefined, so their AUC carries the last finite return to the budget and their final "
                 f"return is missing: groups "
                 f"{_groups_named(res, d.reindex(res.runs.index, fill_value=False))}")
    if "auc_ratio" in s and (s["auc_iqm"] < 0).any():
        notes.append("some AUCs are negative (returns below 0, e.g. Pendulum): there an AUC ratio above 1 means a "
                     "worse AUC than the baseline's; ΔAUC keeps its sign (below 0 = worse)")
    small = s[s["runs"] < MIN_CI_RUNS]
    if len(small):
        w.append(f"{len(small)} of {len(s)} groups have fewer than {MIN_CI_RUNS} runs: their intervals are the seed "
                 "range ([min, max] of the seeds, marked †), not confidence intervals, and the figures draw the seeds")
    if (s["runs"] < MIN_CLAIM_RUNS).any():
        notes.append(f"a claim in the README needs at least {MIN_CLAIM_RUNS} seeds per arm; "
                     f"{int((s['runs'] < MIN_CLAIM_RUNS).sum())} of {len(s)} groups have fewer")
    if "reached" in s and (s["reached"] < s["runs"]).any():
        notes.append("steps and time to threshold are IQMs over the runs that reached it; the k/n next to them "
                     "counts those runs (the others never reached the threshold within the budget), and their interval "
                     f"is a bootstrap CI over those runs when at least {MIN_CI_RUNS} reached it, else their seed range (†)")
    if res.baseline and "baseline" in s and (s["baseline"] == "none").any():
        w.append(f"{int((s['baseline'] == 'none').sum())} groups have no matched baseline "
                 f"({', '.join(f'{k}={v}' for k, v in res.baseline.items())} with the same other keys): no cost shown"
                 + (" (those at a level the reference ran are measured against it instead: 'What buys the cost "
                    "back')" if not res.recovery.empty else ""))
    sel = res.selection
    if not sel.empty and "held_out_runs" in sel and (sel["held_out_runs"] == 0).any():
        pending = sel[sel["held_out_runs"] == 0]
        w.append(f"{len(pending)} groups have no held-out run at the value selected for them yet (a study in "
                 "progress): left out of every table — " + "; ".join(
                     cmp.label([c for c in sel.columns if c.startswith("cfg.")], tuple(str(r[c]) for c in sel.columns
                                                                                  if c.startswith("cfg.")))
                     for _, r in pending.head(12).iterrows()))
    if not res.recovery.empty and res.recovery["interval"].str.startswith("none").any():
        w.append(f"the recovered fraction has no interval where a group has fewer than {MIN_CI_RUNS} runs")
    if not res.recovery.empty and res.recovery["interval"].str.startswith("undefined").any():
        w.append("at some levels the reference's cost is not above 0 (its CI includes 0): no fraction of it is "
                 "reported there, only the gain")
    if not sel.empty and "how" in sel and sel["how"].str.startswith("fixed").any():
        keys = [c for c in sel.columns if c.startswith("cfg.")]
        fixed = sel[sel["how"].str.startswith("fixed")]
        notes.append(f"{len(fixed)} groups ran at one step size chosen outside these runs (no selection-seed run of "
                     "theirs is here): " + "; ".join(cmp.label(keys, tuple(str(r[c]) for c in keys))
                                                     for _, r in fixed.head(12).iterrows()))
    failed = res.runs[~res.runs["used"]]
    if len(failed) and "selection" not in res.runs:
        notes.append(f"{len(failed)} runs left out of the statistics (status: "
                     f"{', '.join(f'{k} {v}' for k, v in failed['status'].value_counts().items())})")
    return w, notes


# ---- formatting -------------------------------------------------------------------------------------------
def _num(v, signed: bool = False) -> str:
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return "—"
    v = float(v)
    sign = "+" if signed and v > 0 else ""
    a = abs(v)
    if a >= 1e9:  # (a diverged update's KL: 4.67e+17, not "4.67e+11M")
        return f"{sign}{v:.3g}"
    if a >= 1e6:
        return f"{sign}{v / 1e6:.3g}M"
    if a >= 1e4:
        return f"{sign}{v / 1e3:.0f}k"
    if a >= 100:
        return f"{sign}{v:,.0f}"
    return f"{sign}{v:.3g}"


def _cell(mid, lo, hi, kind: str = "", signed: bool = False) -> str:
    if mid is None or not np.isfinite(mid):
        return "—"
    if lo is None or not np.isfinite(lo):
        return _num(mid, signed)
    return f"{_num(mid, signed)} [{_num(lo, signed)}, {_num(hi, signed)}]" + ("†" if kind == "seed range" else "")


_short = cmp.short_key


def compact_table(res: Result) -> pd.DataFrame:
    """One row per group: IQM [interval] per headline measure, the cost and probability of improvement against
    the matched baseline, k/n reached."""
    s = res.summary
    rows = []
    thr = res.runs.loc[res.runs["used"], "threshold"].dropna().unique() if "threshold" in res.runs else []
    thr_name = f"env steps to {_num(thr[0])}" if len(thr) == 1 else "env steps to threshold"
    for _, r in s.iterrows():
        row = {_short(b): r[b] for b in res.by}
        row["runs"] = int(r["runs"])
        kind = r["interval"]
        row["AUC (mean return per env step)"] = _cell(r.get("auc_iqm"), r.get("auc_low"), r.get("auc_high"), kind)
        row["final return"] = _cell(r.get("final_return_iqm"), r.get("final_return_low"), r.get("final_return_high"), kind)
        if "reached" in r and pd.notna(r.get("reached")):
            k, n = int(r["reached"]), int(r["runs"])
            c = _cell(r.get("steps_to_threshold_iqm"), r.get("steps_to_threshold_low"), r.get("steps_to_threshold_high"),
                      r.get("steps_to_threshold_interval", kind))
            row[thr_name] = c + ("" if k == n else f" ({k}/{n} reached)")
        if res.baseline:
            is_base = r.get("baseline") == cmp.label(res.by, tuple(str(r[b]) for b in res.by))
            ck = r.get("comparison_interval", "")
            if r.get("baseline", "none") == "none":
                row["ΔAUC vs baseline"] = row["AUC ratio"] = row["P(AUC > baseline)"] = "no baseline"
            elif is_base:
                row["ΔAUC vs baseline"], row["AUC ratio"], row["P(AUC > baseline)"] = "(baseline)", "1", "0.5"
            else:
                row["ΔAUC vs baseline"] = _cell(r.get("auc_delta"), r.get("auc_delta_low"), r.get("auc_delta_high"), ck, True)
                row["AUC ratio"] = _cell(r.get("auc_ratio"), r.get("auc_ratio_low"), r.get("auc_ratio_high"), ck)
                row["P(AUC > baseline)"] = _cell(r.get("auc_poi"), r.get("auc_poi_low"), r.get("auc_poi_high"), ck)
        rows.append(row)
    return pd.DataFrame(rows)


def costs_view(res: Result) -> pd.DataFrame:
    c = res.costs
    if c.empty:
        return c
    out = pd.DataFrame({"between": c["key"].map(_short) + ": " + c["a"].astype(str) + " − " + c["b"].astype(str)})
    for col in [x for x in c.columns if x.startswith("level.")]:
        out[_short(col[len("level."):])] = c[col]
    out["cost a (ΔAUC)"] = c["cost_a"].map(lambda v: _num(v, True))
    out["cost b (ΔAUC)"] = c["cost_b"].map(lambda v: _num(v, True))
    out["difference in cost [interval]"] = [_cell(p, lo, hi, k, True) for p, lo, hi, k in
                                            zip(c["difference"], c["low"], c["high"], c["interval"])]
    return out


SHOWN_PATHS = 8


def shown_command(command: str) -> str:
    """The report's command as its page shows it: with more than ``SHOWN_PATHS`` run dirs, the dirs become one
    phrase naming how many and the folders they are in (the full command stays in report.json)."""
    try:
        argv = shlex.split(command)
    except ValueError:
        return command
    if "analysis.report" not in argv:
        return command
    i = argv.index("analysis.report") + 1
    j = i
    while j < len(argv) and not argv[j].startswith("--"):
        j += 1
    paths = argv[i:j]
    if len(paths) <= SHOWN_PATHS:
        return command
    parents = sorted({str(Path(p).parent) for p in paths})
    where = ", ".join(parents[:SHOWN_PATHS]) + (f" and {len(parents) - SHOWN_PATHS} more" if len(parents) > SHOWN_PATHS else "")
    phrase = f"<{len(paths)} run or sweep dirs in {where}; all in report.json>"
    return " ".join(shlex.quote(a) for a in argv[:i]) + " " + phrase + (
        " " + " ".join(shlex.quote(a) for a in argv[j:]) if j < len(argv) else "")


def recovery_view(res: Result) -> pd.DataFrame:
    """One row per (method, treatment level): the reference's cost there, the method's gain over the reference,
    the method against the reference's baseline, and the fraction of the cost it recovers, each [95% CI]."""
    c = res.recovery
    if c.empty:
        return c
    out = pd.DataFrame({"method": c["method"]})
    for col in [x for x in c.columns if x.startswith("level.")]:
        out[_short(col[len("level."):])] = c[col]
    out["runs (method / ref. / ref. baseline)"] = [f"{a} / {b} / {d}" for a, b, d in
                                                   zip(c["runs"], c["reference_runs"], c["baseline_runs"])]
    cells = (("cost", "reference's cost (ΔAUC, baseline − level)"), ("gain", "gain over the reference (ΔAUC)"),
             ("vs_baseline", "against the reference at the baseline (ΔAUC)"),
             ("recovered", "fraction of the cost recovered"))
    for key, name in cells:
        signed = key != "recovered"
        out[name] = [_cell(p, lo, hi, "", signed) for p, lo, hi in zip(c[key], c[f"{key}_low"], c[f"{key}_high"])]
    return out


def normalized_view(res: Result) -> pd.DataFrame:
    """One row per (group, score): median, IQM, mean and optimality gap of the normalized score, each with its CI."""
    n = res.normalized
    if n.empty:
        return n
    rows = []
    for _, r in n.iterrows():
        for c, name in (("auc", "AUC"), ("final_return", "final return")):
            if f"{c}_iqm" not in r or pd.isna(r.get(f"{c}_iqm")):
                continue
            row = {_short(b): r[b] for b in res.by if b in n}
            row.update({"runs": int(r["runs"]), "normalized score": name})
            for a, lab in (("median", "median"), ("iqm", "IQM"), ("mean", "mean"), ("optimality_gap", "optimality gap")):
                row[lab] = _cell(r[f"{c}_{a}"], r[f"{c}_{a}_low"], r[f"{c}_{a}_high"])
            rows.append(row)
    return pd.DataFrame(rows)


def wide_view(res: Result, measures: List[str]) -> pd.DataFrame:
    s = res.summary
    out = s[res.by].rename(columns=_short).copy()
    out["runs"] = s["runs"]
    for m in measures:
        if f"{m}_iqm" in s:
            kinds = s[f"{m}_interval"] if f"{m}_interval" in s else s["interval"]
            out[m] = [_cell(a, b, c, k) for a, b, c, k in zip(s[f"{m}_iqm"], s[f"{m}_low"], s[f"{m}_high"], kinds)]
    return out


def _informative(df: pd.DataFrame) -> pd.DataFrame:
    """Without the columns that hold nothing (every cell empty or "—")."""
    keep = [c for c in df.columns if not df[c].map(lambda v: v is None or v == "—" or
                                                   (isinstance(v, float) and not np.isfinite(v))).all()]
    return df[keep]


def _md_table(df: pd.DataFrame) -> str:
    df = _informative(df)
    if df.empty:
        return "(none)"
    cols = list(df.columns)
    fmt = lambda v: _num(v) if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(map(str, cols)) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    lines += ["| " + " | ".join(fmt(v).replace("|", "\\|") for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def _html_table(df: pd.DataFrame, cls: str = "") -> str:
    df = _informative(df)
    if df.empty:
        return "<p>(none)</p>"
    return df.to_html(index=False, classes=cls, border=0, na_rep="—", float_format=_num, escape=True)


HEADLINE = ["auc", "final_return", "steps_to_threshold", "time_to_threshold", "sps", "lag_mean", "kl_behavior"]
# what the updates did while the runs learned
UPDATES = ["clip_frac", "update_kl", "entropy", "kl_behavior", "is_ess", "is_trunc_frac"]
CAPTIONS = {
    "lag_cost": "Lag cost: ΔAUC against each family's own baseline (e.g. lag 0), against the treatment's values "
                "(log2 axis; where the treatment is not a number, e.g. the runner, against the one numeric key the "
                "groups differ in, e.g. the actor count, else the measured mean version lag) "
                "and against the measured KL(behavior ‖ current); lines: IQM difference, bands: 95% CI (dots: "
                "seeds, when a group has fewer than 5).",
    "recovery": "What buys the cost back: the fraction of the reference's cost each method recovers at each level "
                "of the treatment, (method − reference) / (reference at the baseline − reference) on IQMs, with its "
                "95% stratified-bootstrap CI (no bar of interval below 5 runs); 0 = no better than the reference, "
                "1 (dashed) = back at the baseline's score.",
    "return_vs_env_steps": "Return (rolling mean) against env steps: IQM across seeds with a 95% CI band.",
    "return_vs_wall_clock": "Return against wall-clock seconds (sensitive to machine load; see the warnings).",
    "per_seed": "Every seed's learning curve, one panel per group.",
    "performance_profile": "Performance profile: the fraction of runs whose normalized AUC exceeds τ (scores "
                           "normalized per env: 0 = a random policy, 1 = the env's reference return — a published PPO "
                           "final return, or for Pendulum the -200 'solved' level — see analysis/references.py), "
                           "with a 95% CI band.",
    "lag_histograms": "Version lag of the trained transitions, per group.",
    "queue": "Queue depth and time in the queue, per group (first seed).",
    "actors": "Against the actor count (log2 axis): throughput, the version lag of the trained data (mean, p95 "
              "dashed), KL(behavior ‖ current) with seed 004's 0.01-0.03 band shaded, AUC per env step, and wall "
              "seconds and env steps to the threshold (k/n: runs that reached it, when not all did); IQM with 95% "
              "CIs.",
}


def write(res: Result, out: Path, opts: Options, figs: Dict[str, Path]) -> None:
    res.summary.to_csv(out / "summary.csv", index=False)
    res.costs.to_csv(out / "costs.csv", index=False)
    res.normalized.to_csv(out / "normalized.csv", index=False)
    if not res.recovery.empty:
        res.recovery.to_csv(out / "recovery.csv", index=False)
    if not res.selection.empty:
        res.selection.to_csv(out / "selection.csv", index=False)
    used = res.runs[res.runs["used"]]
    status = res.runs["status"].value_counts().to_dict()
    base = ", ".join(f"{_short(k)}={v}" for k, v in res.baseline.items())
    intro = (f"{len(res.runs)} runs ({', '.join(f'{k}: {v}' for k, v in status.items())}), {len(used)} used; groups by "
             f"{', '.join(map(_short, res.by)) or '(none: one group)'}"
             + (f"; each group compared with its matched baseline ({base}, every other key equal)" if base else "")
             + f". Cells: IQM [95% stratified bootstrap CI] over seeds (rliable's definitions; † marks intervals from "
               f"fewer than {MIN_CI_RUNS} runs, which are the seed range). AUC: the mean return per env step "
               "over [0, budget]; final return: each run's summary.json final_return_mean.")
    updates = res.summary[res.by].rename(columns=_short).assign(
        **{m: res.summary[f"{m}_iqm"] for m in UPDATES if f"{m}_iqm" in res.summary})
    code = res.summary[res.by].rename(columns=_short).assign(runs=res.summary["runs"], code=res.summary["code"])
    runs_view = res.runs[["run_id", "status", "used"] + [c for c in res.by if c in res.runs] +
                         [c for c in ("cfg.seed", "selection", "auc", "final_return", "eval.return_mean",
                                      "steps_to_threshold", "sps", "lag_mean", "provenance.git_commit",
                                      "provenance.git_dirty", "provenance.cpu_busy", "provenance.laglab_runs_alive",
                                      "provenance.start_time") if c in res.runs]]
    runs_view = runs_view.sort_values([c for c in res.by + ["cfg.seed"] if c in runs_view] + ["run_id"], kind="stable")
    runs_view = runs_view.rename(columns=lambda c: _short(c.replace("provenance.", "")))
    if "git_commit" in runs_view:
        runs_view["git_commit"] = runs_view["git_commit"].astype(str).str[:7]
    regen = f"python -m analysis.report {out}"
    sections = [
        ("Summary", compact_table(res), "compact"),
        ("Figures", None, None),
        ("Selection (tuned on the selection seeds, reported on the others)", res.selection.rename(columns=_short),
         "wide") if not res.selection.empty else None,
        ("What buys the cost back: each method against the reference"
         + (f" ({res.recovery['reference'].iloc[0]})" if not res.recovery.empty else "") +
         " at the same level (fraction recovered = (method − reference) / (reference at the baseline − reference))",
         recovery_view(res), "wide")
        if not res.recovery.empty else None,
        ("Difference in cost between families (ΔAUC of a minus ΔAUC of b, each against its own baseline)",
         costs_view(res), "wide") if not res.costs.empty else None,
        ("Normalized scores (0 = random policy, 1 = reference PPO; rliable's aggregates across tasks)",
         normalized_view(res), "wide") if not res.normalized.empty else None,
        ("All headline measures", wide_view(res, HEADLINE + ["lag_p95", "kept_frac", "dropped_frac"]), "wide"),
        ("What the updates did while learning (IQM per group, up to the threshold or the first half of the run: "
         "PPO clip fraction, KL moved per update, entropy, KL(behavior ‖ current), the effective sample fraction of the "
         "importance weights current/behavior and the fraction the decoupled loss truncated)", updates, "wide"),
        ("Code per group", code, "wide"),
        ("Runs", runs_view, "wide"),
    ]
    sections = [x for x in sections if x is not None]
    built = shown_command(opts.command)
    md = ["# laglab report\n", f"Built with: `{built}`  \nRegenerate from this dir: `{regen}`\n", intro + "\n"]
    md += [f"> **warning:** {w}\n" for w in res.warnings] + [f"> note: {n}\n" for n in res.notes]
    for title, df, _ in sections:
        md.append(f"## {title}\n")
        if df is None:
            md += [f"![{k}](figures/{p.name})\n\n{CAPTIONS.get(k, '')}\n" for k, p in figs.items()]
        else:
            md.append(_md_table(df) + "\n")
    (out / "report.md").write_text("\n".join(md))
    body = [f"<h1>laglab report</h1><p>Built with: <code>{html.escape(built)}</code><br>Regenerate from this "
            f"dir: <code>{html.escape(regen)}</code></p><p>{html.escape(intro)}</p>"]
    body += [f'<p class="warn"><b>warning:</b> {html.escape(w)}</p>' for w in res.warnings]
    body += [f'<p class="note">note: {html.escape(n)}</p>' for n in res.notes]
    for title, df, cls in sections:
        body.append(f"<h2>{html.escape(title)}</h2>")
        if df is None:
            body += [f'<figure><img alt="{k}" src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}">'
                     f"<figcaption>{html.escape(CAPTIONS.get(k, k))}</figcaption></figure>" for k, p in figs.items()]
        else:
            body.append(f'<div class="{cls}">{_html_table(df, cls)}</div>')
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>laglab report</title>
<style>body{{font-family:sans-serif;margin:1.5em;max-width:1360px}}table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right;white-space:nowrap}}
td:first-child{{text-align:left}}th{{background:#f3f3f3}}
div.wide,div.compact{{overflow-x:auto;max-width:100%}}div.wide table{{font-size:12px}}img{{max-width:100%}}
.warn{{color:#a00}}.note{{color:#555}}figure{{margin:1em 0}}figcaption{{font-size:13px;color:#333}}</style>
</head><body>{''.join(body)}</body></html>
"""
    (out / "report.html").write_text(page)


def _options_from(report_dir: Path) -> Options:
    p = report_dir / REPORT_JSON
    if not p.exists():
        raise AnalysisError(f"{report_dir}: has runs.csv and curves.parquet but no {REPORT_JSON} (the options it was "
                            "built with); rebuild it from its run dirs")
    d = json.loads(p.read_text())
    return Options(**{k: d.get(k) for k in Options.__dataclass_fields__ if k in d})


def _write_options(report_dir: Path, opts: Options) -> None:
    """The options a report is built with, in its report.json (what :func:`_options_from` reads back)."""
    meta = {"format": FORMAT, **{k: getattr(opts, k) for k in Options.__dataclass_fields__}}
    (report_dir / REPORT_JSON).write_text(json.dumps(meta, indent=1) + "\n")


def run(paths: List[str], out: Optional[Path], opts: Options) -> Result:
    """Build (or rebuild) a report; returns what it shows."""
    from .figures import make_all

    src = Path(paths[0])
    if len(paths) == 1 and is_report_dir(src) and not (src / "summary.json").exists():
        # a rebuild uses the options the report was built with, but for those its command line gives
        stored = _options_from(src)
        given = {k: v for k, v in dataclasses.asdict(opts).items() if k != "command" and v not in (None, False)}
        baked = [k for k in ("threshold", "include_failed") if k in given and given[k] != getattr(stored, k)]
        if baked:  # (applied when the run dirs were read: the compact data holds their result)
            raise AnalysisError(f"{src}: a rebuild cannot change {' or '.join('--' + k.replace('_', '-') for k in baked)}"
                                " (applied when its run dirs were read); build from the run dirs with it instead")
        opts = dataclasses.replace(stored, **given, command=opts.command if given else stored.command)
        out = out or src
        runs, curve_df, lags = load_runs(src), load_curves(src), read_lag_counts(src)
        if out.resolve() != src.resolve():
            write_compact(out, runs, curve_df, lags)
        if given:
            _write_options(out, opts)
        elif out.resolve() != src.resolve():
            (out / REPORT_JSON).write_text((src / REPORT_JSON).read_text())
    else:
        if out is None:
            find_runs(paths)  # a missing dir or an old report says so first
            raise AnalysisError("--out is required when reading run or sweep dirs")
        runs = load_runs(paths, opts.threshold, opts.include_failed)
        reports = [p for p in map(Path, paths) if is_report_dir(p) and not (p / "summary.json").exists()]
        write_compact(out, runs, load_curves(paths, runs), lag_counts(runs, reports))
        _write_options(out, opts)
        runs, curve_df, lags = load_runs(out), load_curves(out), read_lag_counts(out)  # one path for build and rebuild
    res = build(runs, curve_df, lags, opts)
    figs = make_all(res, out / "figures")
    write(res, out, opts, figs)
    return res


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", help="run dirs and/or sweep (multirun) dirs, or one report dir to rebuild")
    ap.add_argument("--out", type=Path, default=None, help="report dir (default for a rebuild: the report dir)")
    ap.add_argument("--by", nargs="*", default=None, help="group columns, e.g. cfg.algo.name (default: what varies)")
    ap.add_argument("--threshold", type=float, default=None, help="return threshold (default: per env id)")
    ap.add_argument("--baseline", default=None, help='matched baseline, e.g. "cfg.actor.fixed_lag=0" (that value of '
                                                     "that key, all other grouping keys equal; several joined by ;)")
    ap.add_argument("--select", default=None, help="a hyperparameter chosen per group on --select-on seeds, e.g. "
                                                   "cfg.learner.lr; the groups are reported on the other seeds")
    ap.add_argument("--select-on", default=None, help="selection seeds, e.g. seed=0-4")
    ap.add_argument("--reference", default=None, help='the family the others buy its cost back from, e.g. '
                    '"cfg.algo.name=ppo" (default: the one family with a baseline run)')
    ap.add_argument("--allow-mixed", action="store_true", help="pool runs of different envs or budgets")
    ap.add_argument("--include-failed", action="store_true", help="use failed / interrupted runs in the statistics")
    args = ap.parse_args(argv)
    command = "python -m analysis.report " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    model = [m for m in MODEL_REPORTS if len(args.paths) == 1 and m[1](args.paths[0])]
    if model:  # a report of laglab.sim's: its own compact files, no run dirs
        what, _, rebuild = model[0]
        given = [f"--{k.replace('_', '-')}" for k, v in vars(args).items() if k != "paths" and v not in (None, False)]
        if given:
            print(f"analysis: {args.paths[0]} is {what}: it rebuilds in place from its own files and takes no "
                  f"{' or '.join(given)}", file=sys.stderr)
            return 2
        try:
            md = rebuild(args.paths[0])
        except (ValueError, KeyError, FileNotFoundError) as e:
            print(f"analysis: {e}", file=sys.stderr)
            return 2
        print(f"wrote {md} ({what}, from its committed files)")
        return 0
    opts = Options(args.by, args.baseline, args.threshold, args.allow_mixed, args.include_failed, args.select,
                   args.select_on, command, args.reference)
    try:
        res = run(args.paths, args.out, opts)
    except (AnalysisError, FileNotFoundError) as e:
        print(f"analysis: {e}", file=sys.stderr)
        return 2
    out = args.out or Path(args.paths[0])
    print(f"wrote {out / 'report.html'}, report.md, summary.csv, runs.csv, curves.parquet ({len(res.runs)} runs, "
          f"{len(res.summary)} groups)")
    for w in res.warnings:
        print(f"warning: {w}", file=sys.stderr)
    return 0


def _cli() -> int:
    from .cli import interruptible

    return interruptible(lambda: main(), "analysis")  # (main looked up when called)


if __name__ == "__main__":
    sys.exit(_cli())
