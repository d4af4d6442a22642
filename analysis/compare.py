"""Groups and comparisons: which runs form a group, which group is each group's baseline, and what the statistics
say per group (IQM with its interval, reached fractions, code versions), against the matched baseline (cost as
ΔAUC and AUC ratio, probability of improvement), between two families' costs, on normalized scores (rliable's
aggregates), and for a hyperparameter chosen on some seeds and reported on the others.

**Matched baseline.** ``baseline={"cfg.actor.fixed_lag": "0"}`` means "this value of this key, all other
grouping keys equal": the group (algo=ppo, lag=4) is compared with (algo=ppo, lag=0), never with a pool of every
lag-0 run. Groups that share everything but the baseline keys form a *family* (here: one algorithm).

**Intervals.** A group of 5 runs or more gets the percentile bootstrap 95% CI (stratified by env id, 2000
resamples, a fixed seed so tables regenerate identically). Below 5 runs an interval is the range of the seeds
(``interval`` says which); a difference's range is then that of the per-seed differences.
"""
from __future__ import annotations

import itertools
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from . import stats
from .load import AnalysisError  # noqa: F401 - re-exported
from .measures import MEASURES

MIN_CI_RUNS = 5  # below this many runs per group an interval is the seed range, not a CI
MIN_CLAIM_RUNS = 10  # runs per arm a claim in the README needs
DIVERGED = "summary.diverged_at_update"  # the first update whose loss was not finite (null: none)
REPS, BOOT_SEED = 2000, 0

# config keys that differ between runs without being a treatment
IGNORED = {"cfg.seed", "cfg.resume", "cfg.tracking.wandb.group", "cfg.tracking.wandb.name"}
IGNORED_PREFIX = ("cfg.tracking.",)


def varying_keys(runs: pd.DataFrame) -> List[str]:
    """Config keys that vary across the runs (seed and tracking excluded); a key that the keys already kept
    determine (algo=vtrace always comes with estimator=vtrace) is left out."""
    cols = [c for c in runs.columns if c.startswith("cfg.") and c not in IGNORED and not c.startswith(IGNORED_PREFIX)]
    out: List[str] = []
    # (a missing value is a value: ppo with learner.max_kl_behavior=null is not ppo with 0.02; pandas 3's
    # astype(str) keeps NaN missing, and nunique would not count it)
    as_str = runs[cols].astype(object).where(runs[cols].notna(), "null").astype(str)
    for c in cols:
        if as_str[c].nunique(dropna=False) <= 1:
            continue
        if out and as_str.groupby(out)[c].nunique(dropna=False).max() == 1:
            continue  # a function of the keys already kept
        out.append(c)
    return out


def parse_assignments(text: Optional[str]) -> Dict[str, str]:
    """``"cfg.actor.fixed_lag=0"`` (several joined by ``;``) -> {key: value}."""
    if not text:
        return {}
    out = {}
    for part in text.split(";"):
        if "=" not in part:
            raise AnalysisError(f"{text!r}: expected key=value, e.g. cfg.actor.fixed_lag=0")
        k, v = part.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def parse_seeds(text: str) -> List[int]:
    """``"seed=0-4"`` or ``"0,1,2"`` or ``"0-2,7"`` -> [0, 1, 2, ...]."""
    text = text.split("=", 1)[1] if "=" in text else text
    out: List[int] = []
    try:
        for part in filter(None, text.split(",")):
            a, _, b = part.partition("-")
            out += list(range(int(a), int(b) + 1)) if b else [int(a)]
    except ValueError:
        raise AnalysisError(f"{text!r}: expected seeds like seed=0-4 or seed=0,1,2") from None
    return out


def whole_numbers(col: pd.Series) -> bool:
    """An integer config key that some runs leave null: pandas holds it as floats (1024.0). (A float key the
    config spells 3.0 on every run stays 3.0; with nulls beside it, it reads 3: :func:`matched_baselines` matches
    either spelling.)"""
    have = col.dropna()
    return col.dtype.kind == "f" and 0 < len(have) < len(col) and bool(np.isfinite(have).all() and (have == np.floor(have)).all())


def _text(v, whole: bool) -> str:
    return str(int(v)) if whole and isinstance(v, (float, np.floating)) and np.isfinite(v) else str(v)


def as_text(col: pd.Series) -> pd.Series:
    """A config column's values as the config spells them: ``1024``, not the ``1024.0`` of a column with nulls."""
    whole = whole_numbers(col)
    return col.map(lambda v: _text(v, whole)) if whole else col.astype(str)


def groups_of(runs: pd.DataFrame, by: Sequence[str]) -> List[Tuple[tuple, pd.DataFrame]]:
    """(string key, runs) per group, in sorted order of the group values."""
    if not by:
        return [((), runs)]
    whole = [whole_numbers(runs[b]) for b in by]  # (once per column, not per group)
    return [(_spelled_key(k, whole), g) for k, g in runs.groupby(list(by), dropna=False, sort=True)]


def text_key(frame: pd.DataFrame, by: Sequence[str], k) -> tuple:
    """A groupby key of ``frame`` by ``by`` as strings, each spelled as :func:`as_text` spells its column."""
    return _spelled_key(k, [whole_numbers(frame[b]) for b in by])


def _spelled_key(k, whole: Sequence[bool]) -> tuple:
    return tuple(_text(v, w) for v, w in zip(k if isinstance(k, tuple) else (k,), whole))


def short_key(key: str) -> str:
    """A config column as a person writes the key: ``cfg.learner.lr`` -> ``learner.lr``."""
    return key[4:] if key.startswith("cfg.") else key


def label(by: Sequence[str], key: tuple, short: bool = True) -> str:
    if not by:
        return "all"
    name = short_key if short else (lambda b: b)
    value = lambda v: "null" if str(v) in ("nan", "None", "<NA>") else v  # noqa: E731  (as a config spells it)
    return ", ".join(f"{name(b)}={value(v)}" for b, v in zip(by, key))


def matched_baselines(keys: Sequence[tuple], by: Sequence[str], baseline: Dict[str, str]) -> Dict[tuple, Optional[tuple]]:
    """For each group key, the key of its baseline: the same values on every grouping key but the baseline's
    keys, which take the baseline's values (None when no such group ran)."""
    if not baseline:
        return {k: None for k in keys}
    missing = [b for b in baseline if b not in by]
    if missing:
        raise AnalysisError(f"baseline key {', '.join(missing)} is not a grouping key (groups are by "
                            f"{', '.join(by) or 'nothing'}); a baseline fixes one value of a grouping key, all "
                            "other keys equal")
    pos = {b: by.index(b) for b in baseline}
    present = set(keys)
    spelled = {b: spelled_as(str(v), {k[pos[b]] for k in keys}) for b, v in baseline.items()}
    out = {}
    for k in keys:
        t = list(k)
        for b in baseline:
            t[pos[b]] = spelled[b]
        out[k] = tuple(t) if tuple(t) in present else None
    return out


def spelled_as(value: str, present: set) -> str:
    """``value`` as the groups spell it: ``--baseline cfg.x=3.0`` names the group ``x=3`` and ``1024`` ``1024.0``."""
    if value in present:
        return value
    try:
        num = float(value)
    except ValueError:
        return value
    for p in present:
        try:
            if float(p) == num:
                return p
        except ValueError:
            continue
    return value


def family(by: Sequence[str], key: tuple, baseline: Dict[str, str]) -> tuple:
    """The key without the baseline's keys (groups of one family share a baseline)."""
    return tuple(v for b, v in zip(by, key) if b not in baseline)


def _tasks(g: pd.DataFrame, col: str, tasks: Optional[List] = None) -> Tuple[List[np.ndarray], List]:
    env = g["cfg.env.id"] if "cfg.env.id" in g else pd.Series(["-"] * len(g), index=g.index)
    order = tasks if tasks is not None else list(dict.fromkeys(env.tolist()))
    return [g.loc[env == t, col].to_numpy(float) for t in order], order


def _by_seed(g: pd.DataFrame) -> pd.DataFrame:
    return g.sort_values("cfg.seed") if "cfg.seed" in g else g


def paired(g: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Seeds match: every task has the same seeds (each once) in both groups."""
    if "cfg.seed" not in g or "cfg.seed" not in b:
        return False
    env = "cfg.env.id" if "cfg.env.id" in g else None
    for t in (g[env].unique() if env else [None]):
        sg = g if t is None else g[g[env] == t]
        sb = b if t is None else b[b[env] == t]
        if sg["cfg.seed"].duplicated().any() or sorted(sg["cfg.seed"]) != sorted(sb["cfg.seed"]):
            return False
    return True


def _finite_pairs(g: pd.DataFrame, b: pd.DataFrame, col: str) -> Tuple[pd.DataFrame, pd.DataFrame]:
    """With paired seeds, keep only the seeds whose measure is finite on both sides."""
    finite = lambda d: set(d.loc[np.isfinite(d[col].astype(float)), "cfg.seed"])  # noqa: E731
    ok = finite(g) & finite(b)
    return g[g["cfg.seed"].isin(ok)], b[b["cfg.seed"].isin(ok)]


def compare(g: pd.DataFrame, b: pd.DataFrame, col: str = "auc", reps: int = REPS,
            seed: int = BOOT_SEED) -> Dict[str, object]:
    """ΔIQM and IQM ratio of ``col`` (group minus / over baseline) and the probability of improvement, each with
    its interval: the bootstrap 95% CI (resampled by seed when the seeds match) from 5 runs per side, the range
    of the per-seed (paired) or pairwise differences below."""
    is_paired = paired(g, b)
    if is_paired:
        g, b = _finite_pairs(_by_seed(g), _by_seed(b), col)
    xt, tasks = _tasks(g, col)
    yt, _ = _tasks(b, col, tasks)
    n = min(sum(map(len, xt)), sum(map(len, yt)))
    out: Dict[str, object] = {"paired": is_paired, "n_compared": n}
    if n == 0:
        return out
    if n >= MIN_CI_RUNS:
        out["delta"], out["delta_low"], out["delta_high"] = stats.interval2(stats.difference(stats.iqm), xt, yt,
                                                                            is_paired, reps, seed=seed)
        out["ratio"], out["ratio_low"], out["ratio_high"] = stats.interval2(stats.ratio(stats.iqm), xt, yt,
                                                                            is_paired, reps, seed=seed)
        out["poi"], out["poi_low"], out["poi_high"] = stats.interval2(stats.probability_of_improvement, xt, yt,
                                                                      False, reps, seed=seed)
        out["interval"] = "bootstrap 95% CI"
    else:
        x, y = np.concatenate(xt), np.concatenate(yt)
        d = x - y if is_paired else (x[:, None] - y[None, :]).ravel()
        with np.errstate(divide="ignore", invalid="ignore"):
            r = x / y if is_paired else (x[:, None] / y[None, :]).ravel()
        out["delta"], (out["delta_low"], out["delta_high"]) = stats.iqm(xt) - stats.iqm(yt), stats.seed_range(d)
        out["ratio"], (out["ratio_low"], out["ratio_high"]) = stats.iqm(xt) / stats.iqm(yt), stats.seed_range(r)
        out["poi"], out["poi_low"], out["poi_high"] = stats.probability_of_improvement(xt, yt), float("nan"), float("nan")
        out["interval"] = "seed range"
    return out


def _code(g: pd.DataFrame) -> str:
    c, d = "provenance.git_commit", "provenance.git_dirty"
    if c not in g:
        return "unknown"
    vals = sorted({(str(a)[:7] if isinstance(a, str) else "unknown") + ("+dirty" if str(x) == "True" else "")
                   for a, x in zip(g[c], g[d] if d in g else [False] * len(g))})
    return " ".join(vals)


def summarize(df: pd.DataFrame, by: Optional[Sequence[str]] = None, baseline: Optional[Dict[str, str]] = None,
              measures: Sequence[str] = MEASURES, reps: int = REPS, seed: int = BOOT_SEED) -> pd.DataFrame:
    """One row per group of the used runs of ``df`` (:func:`analysis.load_runs`): ``runs``, per measure
    ``<m>_iqm``, ``<m>_mean``, ``<m>_low``, ``<m>_high`` (the interval named in ``interval``), ``reached`` for the
    threshold, the code (``git commit[+dirty]``) the group ran, and against the matched baseline (``baseline``:
    {key: value}) ``baseline``, ``paired``, ``auc_delta``, ``auc_ratio``, ``auc_poi`` with ``_low`` / ``_high``."""
    used = df[df["used"]] if "used" in df else df
    by = list(varying_keys(used) if by is None else by)
    baseline = {k: str(v) for k, v in (baseline or {}).items()}
    grouped = groups_of(used, by)
    base_of = matched_baselines([k for k, _ in grouped], by, baseline)
    table = dict(grouped)
    out = []
    for key, g in grouped:
        row: Dict[str, object] = {b: g[b].iloc[0] for b in by}
        n = len(g)
        row["runs"] = n
        row["interval"] = "bootstrap 95% CI" if n >= MIN_CI_RUNS else "seed range"
        for m in measures:
            if m not in g:
                continue
            xt, _ = _tasks(g, m)
            # over the runs where the measure exists (steps and time to a threshold: the runs that reached it; the
            # others are counted by ``reached``), and a CI only from enough of them
            k = int(sum(np.isfinite(a).sum() for a in xt))
            row[f"{m}_iqm"] = stats.iqm(xt)
            row[f"{m}_mean"] = stats.mean(xt)
            if k >= MIN_CI_RUNS:
                _, row[f"{m}_low"], row[f"{m}_high"] = stats.interval(stats.iqm, xt, reps, seed=seed)
                row[f"{m}_interval"] = "bootstrap 95% CI"
            else:
                row[f"{m}_low"], row[f"{m}_high"] = stats.seed_range(np.concatenate(xt))
                row[f"{m}_interval"] = "seed range"
        if "reached" in g and g["reached"].notna().any():
            row["reached"] = int(g["reached"].astype(bool).sum())
        row["code"] = _code(g)
        if baseline:
            bk = base_of[key]
            row["baseline"] = label(by, bk) if bk is not None else "none"
            if bk is not None and "auc" in g:
                c = compare(g, table[bk], "auc", reps, seed)
                row["paired"] = c["paired"]
                for k in ("delta", "ratio", "poi"):
                    for s in ("", "_low", "_high"):
                        row[f"auc_{k}{s}"] = c.get(f"{k}{s}", float("nan"))
                row["comparison_interval"] = c.get("interval", "")
        out.append(row)
    return pd.DataFrame(out)


def _matched_groups(df: pd.DataFrame, by: Sequence[str], baseline: Optional[Dict[str, str]]):
    """(baseline as strings, {group key: its used runs}, {group key: its baseline's key}); the groups are empty
    when there is no baseline."""
    baseline = {k: str(v) for k, v in (baseline or {}).items()}
    if not baseline:
        return baseline, {}, {}
    used = df[df["used"]] if "used" in df else df
    grouped = dict(groups_of(used, by))
    return baseline, grouped, matched_baselines(list(grouped), by, baseline)


def cost_differences(df: pd.DataFrame, by: Sequence[str], baseline: Dict[str, str], col: str = "auc",
                     reps: int = REPS, seed: int = BOOT_SEED) -> pd.DataFrame:
    """The difference in cost between two families at each treatment level: (IQM(a, level) - IQM(a, baseline)) -
    (IQM(b, level) - IQM(b, baseline)), for every pair of families that differ in one key (e.g. two algorithms),
    with its bootstrap 95% CI (each family resampled by seed when its seeds match; the seed range of the per-seed
    differences of differences below 5 runs)."""
    baseline, grouped, base_of = _matched_groups(df, by, baseline)
    if not baseline:
        return pd.DataFrame()
    fam_keys = [b for b in by if b not in baseline]
    fams: Dict[tuple, List[tuple]] = {}
    for k, bk in base_of.items():
        if bk is not None and k != bk:
            fams.setdefault(family(by, k, baseline), []).append(k)
    level = lambda k: tuple(v for b, v in zip(by, k) if b in baseline)  # noqa: E731
    rows = []
    for fa, fb in itertools.combinations(sorted(fams), 2):
        diff = [i for i in range(len(fa)) if fa[i] != fb[i]]
        if len(diff) != 1:
            continue
        lv_b = {level(k): k for k in fams[fb]}
        for ka in fams[fa]:
            kb = lv_b.get(level(ka))
            if kb is None:
                continue
            a, a0, b, b0 = grouped[ka], grouped[base_of[ka]], grouped[kb], grouped[base_of[kb]]
            pa, pb = paired(a, a0), paired(b, b0)
            row = {"key": fam_keys[diff[0]], "a": fa[diff[0]], "b": fb[diff[0]],
                   **{f"level.{b_}": v for b_, v in zip(baseline, level(ka))}}
            if pa:
                a, a0 = _finite_pairs(_by_seed(a), _by_seed(a0), col)
            if pb:
                b, b0 = _finite_pairs(_by_seed(b), _by_seed(b0), col)
            ts = _tasks(a, col)[1]
            at, a0t, bt, b0t = (_tasks(x, col, ts)[0] for x in (a, a0, b, b0))
            n = min(len(a), len(a0), len(b), len(b0))
            if n >= MIN_CI_RUNS:
                p, lo, hi = stats.difference_of_differences(stats.iqm, at, a0t, bt, b0t, pa, pb, reps, seed=seed)
                kind = "bootstrap 95% CI"
            else:
                p = (stats.iqm(at) - stats.iqm(a0t)) - (stats.iqm(bt) - stats.iqm(b0t))
                da = (a[col].to_numpy(float) - a0[col].to_numpy(float)) if pa else \
                    (a[col].to_numpy(float)[:, None] - a0[col].to_numpy(float)[None, :]).ravel()
                db = (b[col].to_numpy(float) - b0[col].to_numpy(float)) if pb else \
                    (b[col].to_numpy(float)[:, None] - b0[col].to_numpy(float)[None, :]).ravel()
                lo, hi = stats.seed_range((da[:, None] - db[None, :]).ravel())
                kind = "seed range"
            row.update({"cost_a": stats.iqm(at) - stats.iqm(a0t), "cost_b": stats.iqm(bt) - stats.iqm(b0t),
                        "difference": p, "low": lo, "high": hi, "interval": kind, "runs": n})
            rows.append(row)
    return pd.DataFrame(rows)


def reference_family(families: Sequence[tuple], with_baseline: Sequence[tuple], by: Sequence[str],
                     baseline: Dict[str, str], reference: Dict[str, str]) -> Optional[tuple]:
    """The family every other is measured against: of the families with a baseline group, the one whose keys
    take the values of ``reference`` ({key: value}). Without ``reference``: the one family with a baseline
    group, or None when none or several have one (each family then has its own cost, nothing to buy back)."""
    fam_by = [b for b in by if b not in baseline]
    bad = [k for k in reference if k not in fam_by]
    if bad:
        raise AnalysisError(f"--reference {', '.join(bad)}: not a grouping key other than the baseline's (families "
                            f"are by {', '.join(fam_by) or 'nothing'})")
    pos = {k: fam_by.index(k) for k in reference}
    same = lambda a, b: a == b or label(["k"], (a,)) == label(["k"], (b,))  # noqa: E731  (null spelled as the config does)
    cand = [f for f in with_baseline if all(same(f[pos[k]], str(v)) for k, v in reference.items())]
    if len(cand) == 1:
        return cand[0]
    if not reference:  # a lag-cost study (every algorithm with its own lag 0): nothing to buy back from
        return None
    if not cand:
        if reference:
            raise AnalysisError(f"--reference {';'.join(f'{k}={v}' for k, v in reference.items())}: no family with "
                                f"that value has a baseline run ({', '.join(f'{k}={v}' for k, v in baseline.items())})")
        return None
    raise AnalysisError("several families have a baseline run (" + "; ".join(label(fam_by, f) for f in cand) +
                        f"): name the one the others are measured against, e.g. --reference {fam_by[0]}={cand[0][0]}")


def recovery(df: pd.DataFrame, by: Sequence[str], baseline: Dict[str, str], reference: Optional[Dict[str, str]] = None,
             col: str = "auc", reps: int = REPS, seed: int = BOOT_SEED) -> pd.DataFrame:
    """What a method buys back of the reference's cost: for every family but the reference (e.g. the remedies,
    the reference being PPO) at every treatment level where the reference ran too (e.g. lag 8), with ``m`` the
    method there, ``r`` the reference there and ``r0`` the reference at the baseline (lag 0), the IQMs' ``cost``
    (r0 - r, what the reference loses), ``gain`` (m - r), ``vs_baseline`` (m - r0) and ``recovered``
    ((m - r) / (r0 - r), the fraction of the cost bought back), each with its bootstrap 95% CI (the groups
    resampled by seed together when their seeds match, else independently; no interval when a group has fewer
    than 5 runs). Empty when there is no baseline or no family with a baseline run to be the reference."""
    baseline, grouped, base_of = _matched_groups(df, by, baseline)
    if not baseline:
        return pd.DataFrame()
    fam_of = {k: family(by, k, baseline) for k in grouped}
    with_base = sorted({fam_of[k] for k, bk in base_of.items() if bk == k})
    ref = reference_family(sorted(set(fam_of.values())), with_base, by, baseline, reference or {})
    if ref is None:
        return pd.DataFrame()
    level = lambda k: tuple(v for b, v in zip(by, k) if b in baseline)  # noqa: E731
    ref_at = {level(k): k for k in grouped if fam_of[k] == ref}
    r0_key = next(k for k in grouped if fam_of[k] == ref and base_of[k] == k)
    fam_by = [b for b in by if b not in baseline]
    rows = []
    for k in grouped:
        if fam_of[k] == ref or base_of[k] == k or level(k) not in ref_at:
            continue
        m, r, r0 = grouped[k], grouped[ref_at[level(k)]], grouped[r0_key]
        sets = [m, r, r0]
        is_paired = paired(m, r) and paired(m, r0)
        if is_paired:
            ok = set(m.loc[np.isfinite(m[col].astype(float)), "cfg.seed"])
            for g in (r, r0):
                ok &= set(g.loc[np.isfinite(g[col].astype(float)), "cfg.seed"])
            sets = [_by_seed(g[g["cfg.seed"].isin(ok)]) for g in sets]
        tasks = _tasks(sets[0], col)[1]
        mt, rt, r0t = (_tasks(g, col, tasks)[0] for g in sets)
        n = min(sum(map(len, t)) for t in (mt, rt, r0t))
        differ = [i for i, (a, b) in enumerate(zip(fam_of[k], ref)) if a != b]  # name the method by what differs
        row = {"method": label([fam_by[i] for i in differ], tuple(fam_of[k][i] for i in differ)),
               "reference": label(fam_by, ref),
               **{f"level.{b}": v for b, v in zip(baseline, level(k))},
               "runs": sum(map(len, mt)), "reference_runs": sum(map(len, rt)), "baseline_runs": sum(map(len, r0t)),
               "paired": is_paired, "interval": "bootstrap 95% CI" if n >= MIN_CI_RUNS else f"none (n < {MIN_CI_RUNS})"}
        stats_of = {"cost": (lambda a, b, c: stats.iqm(c) - stats.iqm(b)),
                    "gain": (lambda a, b, c: stats.iqm(a) - stats.iqm(b)),
                    "vs_baseline": (lambda a, b, c: stats.iqm(a) - stats.iqm(c)),
                    "recovered": stats.recovered(stats.iqm)}
        for name, f in stats_of.items():
            if n >= MIN_CI_RUNS:
                row[name], row[f"{name}_low"], row[f"{name}_high"] = stats.interval_k(f, [mt, rt, r0t], is_paired,
                                                                                      reps, seed=seed)
            else:
                with np.errstate(divide="ignore", invalid="ignore"):
                    row[name] = float(f(mt, rt, r0t))
                row[f"{name}_low"] = row[f"{name}_high"] = float("nan")
        if not (row["cost_low"] > 0 if np.isfinite(row["cost_low"]) else row["cost"] > 0):
            # the reference loses nothing measurable at this level: a fraction of nothing is undefined (its sign
            # flips and its resamples are unbounded), so none is reported
            row["recovered"] = row["recovered_low"] = row["recovered_high"] = float("nan")
            row["interval"] = "undefined: the reference's cost is not above 0" + (
                " (its CI includes 0)" if np.isfinite(row["cost_low"]) else "")
        rows.append(row)
    return pd.DataFrame(rows)


def select(df: pd.DataFrame, key: str, on_seeds: Sequence[int], by: Sequence[str],
           col: str = "auc") -> Tuple[pd.DataFrame, pd.DataFrame]:
    """Tuning without selection bias: per group of ``by`` (``key`` excluded), the value of ``key`` with the best
    IQM of ``col`` over the runs of the selection seeds; the group is then reported on the other seeds only.
    Returns (the runs with ``used`` kept only for the held-out runs of the chosen values and a ``selection``
    column, one row per group with the chosen value, ``how`` it was chosen and each candidate's selection IQM).
    A group whose runs are all held-out at one value is kept as "fixed" (its value chosen elsewhere); a group
    whose chosen value has no held-out run yet (a study in progress) has ``held_out_runs`` 0 and no used run.
    A value at which a selection run diverged (``summary.diverged_at_update``: a non-finite loss) is not chosen
    while another value has no diverged run (if every value has one: the fewest diverged runs, then the best IQM).
    After the break a run's actions are NaN, its fragments are refused and its returns undefined, and the AUC
    carries its last finite return to the budget, so it can score above a value that trains (a step size that
    diverges is not a tuned one). The table then counts the diverged runs per value, and ``how`` says what was
    passed over."""
    if key not in df:
        raise AnalysisError(f"--select {key}: no such column; config columns look like cfg.learner.lr")
    by = [b for b in by if b != key]
    df = df.copy()
    used = df["used"].copy() if "used" in df else pd.Series(True, index=df.index)
    sel_seed = df["cfg.seed"].isin(list(on_seeds))
    df["selection"] = np.where(sel_seed, "selection", "held-out")
    rows = []
    keep = pd.Series(False, index=df.index)
    for gk, g in groups_of(df[used], by):
        cand, n_runs, n_div = {}, {}, {}
        for v, gv in g[sel_seed[g.index]].groupby(key, dropna=False, sort=True):
            cand[str(v)] = stats.iqm(gv[col].to_numpy(float))
            n_runs[str(v)] = int(np.isfinite(gv[col].to_numpy(float)).sum())
            n_div[str(v)] = int(gv[DIVERGED].notna().sum()) if DIVERGED in gv else 0
        finite = {v: s for v, s in cand.items() if np.isfinite(s)}
        trained = {v: s for v, s in finite.items() if not n_div[v]}
        held_values = g.loc[~sel_seed[g.index], key].astype(str).unique()
        if not finite and not cand and len(held_values) == 1:
            # a group run at one value chosen elsewhere (e.g. the reference arm of another study's selection):
            # kept, and the selection table says it was not selected here
            best, how = held_values[0], "fixed (not selected in these runs)"
        elif not finite:
            raise AnalysisError(f"group {label(by, gk)}: no run of the selection seeds {list(on_seeds)} to select "
                                f"on" + (f", and its held-out runs have {len(held_values)} values of {key}"
                                         if len(held_values) > 1 else ""))
        elif trained:
            best, how = max(trained, key=lambda v: trained[v]), "selected"
            passed = [v for v in finite if v not in trained and finite[v] > trained[best]]
            if passed:
                how += f" (passed over, diverged on a selection seed: {', '.join(passed)})"
        else:  # the fewest diverged runs first: a diverged run's AUC is inflated (see above), so the best IQM among
            # them would bring back what passing over removes
            best = min(finite, key=lambda v: (n_div[v], -finite[v]))
            how = f"selected (every value diverged on a selection seed; the fewest here: {n_div[best]})"
        held = g[(g[key].astype(str) == best) & ~sel_seed[g.index]]
        keep[held.index] = True
        rows.append({**{b: g[b].iloc[0] for b in by}, key: g.loc[g[key].astype(str) == best, key].iloc[0],
                     "how": how, "held_out_runs": len(held),
                     **{f"selection {col} IQM at {v}": s for v, s in cand.items()},
                     **{f"selection runs at {v}": n for v, n in n_runs.items()},
                     **({f"selection diverged at {v}": n for v, n in n_div.items()} if any(n_div.values()) else {})})
    df.loc[~keep, "selection"] = np.where(sel_seed[~keep], "selection", "not chosen")
    df["used"] = used & keep
    table = pd.DataFrame(rows)

    def value_order(c):  # each kind of column in the order of the values it is at
        v = c.rsplit(" at ", 1)[1]
        try:
            return (0, float(v), v)
        except ValueError:
            return (1, 0.0, v)
    per_value = [c for c in table.columns if c.startswith("selection ")]
    first = [c for c in table.columns if c not in per_value]
    kinds = ("selection runs", "selection diverged")  # (after the IQMs, in this order)
    by_kind = sorted(per_value, key=lambda c: (next((i + 1 for i, k in enumerate(kinds) if c.startswith(k)), 0),
                                               value_order(c)))
    return df, table[first + by_kind]


def normalized_aggregates(df: pd.DataFrame, by: Sequence[str], cols: Sequence[str] = ("final_return", "auc"),
                          reps: int = REPS, seed: int = BOOT_SEED) -> pd.DataFrame:
    """rliable's set on scores normalized per env (``references.normalize``): median, IQM, mean and optimality
    gap across tasks with stratified bootstrap 95% CIs, per group. Empty when no env has a reference."""
    from .references import normalize  # (here, not at the top: `python -m analysis.references` runs that module)

    used = df[df["used"]] if "used" in df else df
    if "cfg.env.id" not in used:
        return pd.DataFrame()
    rows = []
    for key, g in groups_of(used, by):
        row: Dict[str, object] = {**{b: g[b].iloc[0] for b in by}, "runs": len(g)}
        any_ref = False
        for c in cols:
            ns = normalize(g[c].to_numpy(float), g["cfg.env.id"])
            if not np.isfinite(ns).any():
                continue
            any_ref = True
            h = g.assign(_ns=ns)
            xt, _ = _tasks(h, "_ns")
            for name, f in stats.AGGREGATES.items():
                if len(g) >= MIN_CI_RUNS:
                    v = stats.interval(f, xt, reps, seed=seed)
                else:  # no CI below 5 runs
                    v = (f(xt), float("nan"), float("nan"))
                row[f"{c}_{name}"], row[f"{c}_{name}_low"], row[f"{c}_{name}_high"] = v
        if any_ref:
            rows.append(row)
    return pd.DataFrame(rows)
