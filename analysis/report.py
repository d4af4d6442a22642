"""One command from run dirs to an answer::

    python -m analysis.report <run or sweep dirs...> --out <dir> [--by cfg.algo.name ...] [--threshold 475]
                              [--baseline "cfg.algo.name=ppo"] [--allow-mixed] [--include-failed]

Writes ``runs.csv`` (one row per run: config, measures, provenance), ``summary.csv`` (one row per group:
IQM, mean and bootstrap 95% CI of every measure, probability of improvement of ``auc`` over the baseline),
``report.md`` and a self-contained ``report.html`` (figures embedded), and the figures as PNG files.

Groups are the config keys that vary across the loaded runs, seed excluded (``--by`` overrides). Runs whose
env id or step budget differ are refused unless ``--allow-mixed``. Failed or interrupted runs are listed
with their status and left out of the statistics unless ``--include-failed``.
"""
from __future__ import annotations

import argparse
import base64
import html
import sys
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import pandas as pd

from .figures import make_all
from .load import load
from .measures import MEASURES, run_measures
from .stats import bootstrap_ci, iqm, mean, probability_of_improvement

# config keys that differ between runs without being a treatment
IGNORED = {"cfg.seed", "cfg.resume", "cfg.tracking.wandb.group", "cfg.tracking.wandb.name"}
IGNORED_PREFIX = ("cfg.tracking.",)


class AnalysisError(ValueError):
    """A user-caused problem with the runs asked for; the message says what and how to proceed."""


def varying_keys(runs: pd.DataFrame) -> List[str]:
    """Config keys that vary across the runs (seed and tracking excluded); a key that the keys already kept
    determine (algo=vtrace always comes with estimator=vtrace) is left out."""
    cols = [c for c in runs.columns if c.startswith("cfg.") and c not in IGNORED and not c.startswith(IGNORED_PREFIX)]
    out: List[str] = []
    as_str = runs[cols].astype(str)
    for c in cols:
        if as_str[c].nunique(dropna=False) <= 1:
            continue
        if out and as_str.groupby(out)[c].nunique().max() == 1:
            continue  # a function of the keys already kept
        out.append(c)
    return out


def table(paths: List[str], threshold: Optional[float] = None, include_failed: bool = False,
          allow_mixed: bool = False) -> pd.DataFrame:
    """runs.csv: the loaded runs with their measures; ``used`` says which enter the statistics."""
    runs = load(paths)
    rows = []
    for _, r in runs.iterrows():
        m = run_measures(r["run_dir"], r.get("cfg.env.id"), threshold)
        m["sps"] = r.get("summary.sps", float("nan"))
        rows.append(m)
    runs = pd.concat([runs.reset_index(drop=True), pd.DataFrame(rows)], axis=1)
    runs["used"] = True if include_failed else runs["status"].eq("completed")
    used = runs[runs["used"]]
    if not allow_mixed:
        for key, what in (("cfg.env.id", "env ids"), ("cfg.total_env_steps", "step budgets")):
            if key in used and used[key].nunique() > 1:
                raise AnalysisError(f"the runs have different {what} ({', '.join(map(str, sorted(used[key].unique())))}); "
                                    "pooling them would compare unlike things. Analyse them separately, or pass "
                                    "--allow-mixed (then statistics are stratified by env id)")
    return runs


def summarize(runs: pd.DataFrame, by: List[str], baseline: Optional[Dict[str, str]] = None) -> pd.DataFrame:
    used = runs[runs["used"]]
    strata = used["cfg.env.id"] if "cfg.env.id" in used and used["cfg.env.id"].nunique() > 1 else None
    groups = list(used.groupby(by, dropna=False)) if by else [((), used)]
    base_runs = None
    if baseline:
        sel = used
        for k, v in baseline.items():
            sel = sel[sel[k].astype(str) == v]
        base_runs = sel if len(sel) else None
    out = []
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        row: Dict[str, object] = dict(zip(by, key))
        row["runs"] = len(g)
        for m in MEASURES:
            if m not in g:
                continue
            x = g[m].to_numpy(float)
            st = None if strata is None else strata.loc[g.index].to_numpy()
            row[f"{m}_iqm"] = iqm(x)
            row[f"{m}_mean"] = mean(x)
            row[f"{m}_ci_low"], row[f"{m}_ci_high"] = bootstrap_ci(x, iqm, strata=st)
            row[f"{m}_reached"] = int(np.isfinite(x).sum()) if m.endswith("to_threshold") else None
        if base_runs is not None:
            row["auc_prob_improvement_over_baseline"] = probability_of_improvement(g["auc"], base_runs["auc"])
        out.append(row)
    df = pd.DataFrame(out)
    return df.drop(columns=[c for c in df.columns if df[c].isna().all() and c.endswith("_reached")])


def default_baseline(runs: pd.DataFrame, by: List[str]) -> Optional[Dict[str, str]]:
    """The lag-0 group when there is one: ``runner=sync``, else ``actor.fixed_lag=0``."""
    for key, val in (("cfg.runner.name", "sync"), ("cfg.actor.fixed_lag", "0")):
        if key in by and (runs[key].astype(str) == val).any():
            return {key: val}
    return None


def _fmt(v) -> str:
    if isinstance(v, float):
        return "—" if not np.isfinite(v) else f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def _md_table(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


HEADLINE = ["auc", "final_return", "steps_to_threshold", "time_to_threshold", "sps", "lag_mean", "kl_behavior"]
UPDATES = ["clip_frac", "update_kl", "entropy", "kl_behavior"]  # what the updates did while the runs learned


def write(runs: pd.DataFrame, summary: pd.DataFrame, by: List[str], figs: Dict[str, Path], out: Path,
          baseline: Optional[Dict[str, str]], command: str) -> None:
    runs.to_csv(out / "runs.csv", index=False)
    summary.to_csv(out / "summary.csv", index=False)
    short = summary[[c for c in by] + ["runs"] + [f"{m}_{s}" for m in HEADLINE for s in ("iqm", "ci_low", "ci_high")
                                                   if f"{m}_{s}" in summary]
                    + [c for c in summary.columns if c.startswith("auc_prob")]]
    updates = summary[[c for c in by] + [f"{m}_iqm" for m in UPDATES if f"{m}_iqm" in summary]]
    status = runs.groupby("status").size().to_dict()
    prov_cols = [c for c in runs.columns if c.startswith("provenance.")]
    warnings = [f"pooled runs differ in {c[len('provenance.'):]}: {', '.join(map(str, runs[c].dropna().unique()[:4]))}"
                for c in prov_cols if c.split(".")[-1] in ("git_commit", "git_dirty", "laglab", "torch", "gymnasium",
                                                            "numpy") and runs.loc[runs["used"], c].astype(str).nunique() > 1]
    runs_view = runs[["run_dir", "status", "used"] + [c for c in by if c in runs] +
                     [c for c in ("cfg.seed", "auc", "final_return", "eval.return_mean", "sps", "lag_mean") if c in runs]
                     + prov_cols[:6]]
    md = [f"# laglab report\n\nRegenerate: `{command}`\n",
          f"{len(runs)} runs ({', '.join(f'{k}: {v}' for k, v in status.items())}); groups by "
          f"{', '.join(by) or '(none: one group)'}; statistics over the runs marked used (IQM with 95% stratified "
          f"bootstrap CI, rliable's definitions)" + (f"; baseline {baseline}" if baseline else "") + ".\n",
          *(f"> warning: {w}\n" for w in warnings),
          "## Summary\n", _md_table(short),
          "\n## What the updates did while learning\n\nIQM per group, over the updates up to the threshold (or the "
          "first half of the run): the fraction of samples PPO's clip cut (`clip_frac`), the KL each update moved "
          "the policy (`update_kl`, k3), the policy's entropy, and KL(behavior || current) before each update.\n",
          _md_table(updates), "\n## Figures\n",
          *(f"![{k}](figures/{p.name})\n" for k, p in figs.items()), "\n## Runs\n", _md_table(runs_view)]
    (out / "report.md").write_text("\n".join(md) + "\n")
    imgs = "\n".join(f'<figure><img alt="{k}" src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}">'
                     f"<figcaption>{html.escape(k)}</figcaption></figure>" for k, p in figs.items())
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>laglab report</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1200px}}table{{border-collapse:collapse;font-size:12px}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}}img{{max-width:100%}}.warn{{color:#a00}}</style>
</head><body><h1>laglab report</h1><p>Regenerate: <code>{html.escape(command)}</code></p>
<p>{html.escape(md[1])}</p>{''.join(f'<p class="warn">warning: {html.escape(w)}</p>' for w in warnings)}
<h2>Summary</h2>{short.to_html(index=False, float_format=lambda v: _fmt(v))}
<h2>What the updates did while learning</h2>{updates.to_html(index=False, float_format=lambda v: _fmt(v))}
<h2>Figures</h2>{imgs}
<h2>Runs (provenance)</h2>{runs_view.to_html(index=False, float_format=lambda v: _fmt(v))}
</body></html>"""
    (out / "report.html").write_text(page)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", help="run dirs and/or sweep (multirun) dirs")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--by", nargs="*", default=None, help="group columns, e.g. cfg.algo.name (default: what varies)")
    ap.add_argument("--threshold", type=float, default=None, help="return threshold (default: per env id)")
    ap.add_argument("--baseline", default=None, help='e.g. "cfg.runner.name=sync" (default: a lag-0 group)')
    ap.add_argument("--allow-mixed", action="store_true", help="pool runs of different envs or budgets")
    ap.add_argument("--include-failed", action="store_true", help="use failed / interrupted runs in the statistics")
    args = ap.parse_args(argv)
    try:
        runs = table(args.paths, args.threshold, args.include_failed, args.allow_mixed)
        by = args.by if args.by is not None else varying_keys(runs[runs["used"]])
        unknown = [b for b in by if b not in runs]
        if unknown:
            raise AnalysisError(f"--by {' '.join(unknown)}: no such column; config columns look like cfg.algo.name")
        baseline = dict([args.baseline.split("=", 1)]) if args.baseline else default_baseline(runs, by)
        if not runs["used"].any():
            raise AnalysisError("no completed run to analyse (pass --include-failed to use the others)")
        summary = summarize(runs, by, baseline)
    except (AnalysisError, FileNotFoundError) as e:
        print(f"analysis: {e}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    figs = make_all(runs[runs["used"]], summary, by, args.out / "figures")
    command = "python -m analysis.report " + " ".join(sys.argv[1:] if argv is None else argv)
    write(runs, summary, by, figs, args.out, baseline, command)
    print(f"wrote {args.out / 'report.html'}, report.md, runs.csv, summary.csv ({len(runs)} runs, "
          f"{len(summary)} groups)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
