"""The run doctor: the practitioner's troubleshooting table (seed 004) applied to a run.

    python -m analysis.doctor <run dir or sweep dir> [--json] [--md report.md]

Reads a run's metrics.parquet, actors.parquet, histograms.parquet (the version lags) and summary.json and reports, rule by rule, what it found (the
evidence: update range and numbers), how serious it is (``ok``, ``watch``, ``act``) and what to change, as config
overrides to paste after ``python train.py`` (each checked against laglab's config validation on the run's own
config: one it would refuse is left out, and the advice says why). The rules are the guide's; of the thresholds,
the KL bands (0.01 / 0.03, tune to 0.02) are the guide's, the others are laglab's own reading of its words (data
older than 2 / 5 updates' wall time, snapshot fetching above 10% / 25% of an actor's time, explained variance below
0.2 / -0.2 with a value loss varying by more than 0.5 of its mean, SPS windows below half the level before them,
a worker 2x / 4x the other actors' lag behind):

* ``kl_behavior``: KL(behavior || current) below 0.01 is fine, 0.01-0.03 needs watching, above 0.03 the stale samples
  hurt convergence: fewer actors, a shorter queue (its 4.2 and 4.3). Watched too when one update in ten is above
  0.03. Data at most a version or so old that is still far from the policy was moved by the step size, not by
  staleness: then the advice is a smaller step size.
* ``loss_explosion``: loss jumps or diverges; check KL and version lag first; lower the clip, dual-clip, force a
  refresh of stale actors (5.1). Spikes the return came back from (it ended within 10% of its best) are watched,
  not acted on: a step size tuned for the best AUC makes them.
* ``lagging_worker``: an actor far behind the learner's version (5.1: the worker still on version 120 while the
  learner is at 200): forced refresh.
* ``parameter_wait``: actors spending their time fetching parameters (5.2): a minimum sync interval.
* ``queue_age``: data waiting in the queue for several updates (4.2, 5.4's sawtooth curves), in the wall time from
  one update to the next: a shorter queue, fewer actors.
* ``late_jitter``: the return falls back after it peaked (5.3): check seeds, raise GAE lambda, fewer epochs.
* ``value_instability``: the critic does not explain the returns (5.3/5.4): update the value function less.
* ``throughput``: updates whose SPS drops below half the run's usual (5.2): look at actor utilisation and sync
  time.
* ``cpu``: the actors waited for a CPU most of the time they were ready to run while the learner waited for data:
  other processes have the cores (process actors run at nice 19 and yield to them): ``runner.actor_nice=0``.
* ``books``: every transition accounted for (the transport seed): produced = admitted + dropped + rejected +
  in flight, nothing misattributed.

It also says where the run is in the guide's tuning order (4.3): 1. hold KL under 0.02 with the actor count and the
queue length; 2. add actors up to the throughput/KL knee; 3. then the batch size; 4. then clip and epochs.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np
import pandas as pd
import yaml

from .load import is_run_dir as _has_run_files, run_config

SEVERITY = ("ok", "watch", "act")
CONFIG_GROUPS = ("algo", "env", "runner", "chaos", "transport", "tracking", "actor", "learner")  # conf/<group>/
CV_UNSTABLE = 0.5  # a value loss whose coefficient of variation over the second half exceeds this is unstable
KL_FINE, KL_HARM, KL_TUNE = 0.01, 0.03, 0.02  # seed 004: < 0.01 fine, 0.01-0.03 watch, > 0.03 harmful; tune to < 0.02


class DoctorError(ValueError):
    """Not a run the doctor can read (the message says what it is instead)."""


@dataclass
class Finding:
    rule: str
    severity: str  # ok | watch | act
    title: str
    evidence: str
    overrides: List[str] = field(default_factory=list)
    advice: str = ""


@dataclass
class Run:
    path: Path
    summary: Dict
    cfg: Dict
    metrics: pd.DataFrame
    actors: pd.DataFrame

    @property
    def n_actors(self) -> int:
        """The run's actor count: its config's, or (actors=auto in a run killed before summary.json said what auto
        chose) the actors actors.parquet saw, else 1."""
        n = self.get("actors", 1)
        if isinstance(n, int) and not isinstance(n, bool):
            return max(1, n)
        a = self.actors
        return max(1, int(a["actor"].nunique())) if len(a) and "actor" in a else 1

    def get(self, dotted: str, default=None):
        node = self.cfg
        for k in dotted.split("."):
            if not isinstance(node, dict) or k not in node:
                return default
            node = node[k]
        return node

    @property
    def steady(self) -> pd.DataFrame:
        """The second half of the updates: past the start, where a run's habits show."""
        m = self.metrics
        return m.iloc[len(m) // 2:] if len(m) >= 4 else m


def read_run(path: Path) -> Run:
    path = Path(path)
    if (path / "summary.json").is_file():
        try:
            summary = json.loads((path / "summary.json").read_text())
        except json.JSONDecodeError as e:
            raise DoctorError(f"{path}/summary.json is not JSON ({e}): the run was cut off while writing it") \
                from None
    elif is_run_dir(path):  # killed (SIGKILL, out of memory) before it could write one, or still running
        summary = {"status": "killed or still running (no summary.json: the process has not written one)"}
    else:
        raise DoctorError(f"{path}: not a run dir (no summary.json, no .hydra/config.yaml beside a train.log or "
                          "metrics.parquet)")
    cfg_file = path / ".hydra" / "config.yaml"
    cfg = run_config(cfg_file, summary) if cfg_file.is_file() else {}
    m = pd.read_parquet(path / "metrics.parquet") if (path / "metrics.parquet").is_file() else pd.DataFrame()
    a = pd.read_parquet(path / "actors.parquet") if (path / "actors.parquet").is_file() else pd.DataFrame()
    return Run(path, summary, cfg or {}, m, a)


def _upd(m: pd.DataFrame, mask) -> str:
    u = m.loc[mask, "update"] if "update" in m else pd.Series(dtype=float)
    if not len(u):
        return ""
    return f"update {int(u.iloc[0])}" if len(u) == 1 else f"updates {int(u.iloc[0])}-{int(u.iloc[-1])} ({len(u)} of them)"


def _col(m: pd.DataFrame, name: str) -> Optional[pd.Series]:
    return m[name].astype(float) if name in m and len(m) else None


# ---- the rules ---------------------------------------------------------------------------------------------
def lag_p95(r: Run) -> Optional[float]:
    """The 95th percentile of the trained transitions' version lag over the second half of the run, from the
    per-transition samples in histograms.parquet (None when the run wrote none)."""
    p = Path(r.path) / "histograms.parquet"
    if not p.is_file():
        return None
    h = pd.read_parquet(p)
    h = h[h["metric"] == "lag/version_lag"] if "metric" in h else h.iloc[0:0]
    if h.empty:
        return None
    h = h[h["update"] >= h["update"].max() / 2]
    vals = np.concatenate([np.asarray(v, float) for v in h["values"]]) if len(h) else np.array([])
    return float(np.percentile(vals, 95)) if len(vals) else None


def rule_kl(r: Run) -> Finding:
    kl = _col(r.steady, "lag/kl_behavior")
    if kl is None or kl.isna().all():
        return Finding("kl_behavior", "ok", "KL(behavior || current)", "not measured in this run")
    # with learner.max_kl_behavior the trained data's KL is held under the cap by dropping the rest: judge the
    # data the actors offered (its KL before the cap), and say what the cap threw away
    offered = _col(r.steady, "lag/kl_offered_mean")
    capped = r.get("learner.max_kl_behavior") is not None and offered is not None and offered.notna().any()
    judged = offered if capped else kl
    col = "lag/kl_offered_mean" if capped else "lag/kl_behavior"
    med, p90, hi = float(judged.median()), float(judged.quantile(0.9)), float(judged.max())
    over = r.steady[col] > KL_HARM
    sev = "act" if med > KL_HARM else "watch" if med > KL_FINE or p90 > KL_HARM else "ok"
    ev = (f"{'offered (before the KL cap): ' if capped else ''}median {med:.4f}, 90th percentile {p90:.4f}, "
          f"max {hi:.4f} over the second half of the updates")
    if over.any():
        ev += f"; above {KL_HARM} at {_upd(r.steady, over)}"
    kept = _col(r.steady, "lag/kept_frac")
    if capped:
        ev += f"; trained (after the cap): median {float(kl.median()):.4f}"
    if kept is not None and kept.notna().any() and float(kept.mean()) < 0.99:
        ev += f"; {1 - float(kept.mean()):.1%} of the data dropped before the updates (lag or KL limits)"
    lag, step = _col(r.steady, "lag/mean"), _col(r.steady, "losses/approx_kl")
    lag_m = float(lag.mean()) if lag is not None else float("nan")
    step_m = float(step.median()) if step is not None else float("nan")
    if np.isfinite(lag_m):
        ev += f"; mean version lag {lag_m:.2f}"
        p95 = lag_p95(r)
        if p95 is not None:
            ev += f", 95th percentile {p95:g} (histograms.parquet)"
    if np.isfinite(step_m):
        ev += f"; each update moves the policy by KL {step_m:.4f} (median)"
    ov, advice = [], "fine (seed 004: below 0.01)"
    if sev != "ok":
        # KL(behavior || current) is the movement of the lag's updates: data L versions old after updates that
        # each move the policy by u is about L u apart. With the data nearly fresh (L <= 1.5) fewer actors cannot
        # lower it: the step size is the lever; with older data both are
        fresh = np.isfinite(lag_m) and lag_m <= 1.5
        big_steps = np.isfinite(step_m) and step_m > KL_FINE
        lr = r.get("learner.lr")
        lr_ov = [f"learner.lr={float(lr) / 2:g}"] if isinstance(lr, (int, float)) and (fresh or big_steps) else []
        n, cap = r.n_actors, int(r.get("transport.capacity", 64) or 64)
        stale_ov = [] if fresh else (([f"actors={max(1, n // 2)}"] if n > 1 else []) +
                                     [f"transport.capacity={max(1, cap // 2)}"])
        ov = stale_ov + lr_ov + ([f"learner.max_kl_behavior={KL_TUNE}"] if not fresh else [])
        if fresh:
            advice = ("the data is at most a version or so old, so the distance comes from how far each update "
                      "moves the policy: a smaller step size (or learner.target_kl), not fewer actors")
        else:
            advice = ("stale samples: hold KL under 0.02 with fewer actors or a shorter queue first; the KL cap drops "
                      "what is still too far off" + ("; each update also moves the policy far, so a smaller step "
                                                      "size helps too" if big_steps else ""))
        if capped:
            advice += "; the cap holds the trained KL down only by throwing data away"
        if r.get("actor.fixed_lag") is not None:
            advice = (f"this run fixes the lag (actor.fixed_lag={r.get('actor.fixed_lag')}): the staleness is the "
                      "experiment; in a production run, " + advice)
    return Finding("kl_behavior", sev, "KL(behavior || current)", ev, ov, advice)


def rule_loss(r: Run) -> Finding:
    m = r.metrics
    div = r.summary.get("diverged_at_update")
    if div is not None:
        ev = f"the loss became non-finite at update {div}"
    else:
        kl = _col(m, "losses/approx_kl")
        vl = _col(m, "losses/value_loss")
        if kl is None or kl.isna().all() or len(m) < 8:
            return Finding("loss_explosion", "ok", "loss explosion", "too few updates to judge" if len(m) else
                           "no updates")
        # a jump against the trailing median of the 10 updates before (losses shrink as a run converges and
        # its step size anneals: a whole-run median would call a healthy start an explosion)
        prev_kl = kl.rolling(10, min_periods=3).median().shift(1).fillna(0.0)  # (the first: against 0.2 alone)
        # (healthy PPO: approx KL 0.02-0.05; a NaN is a value not measured — a non-finite loss is diverged_at_update)
        kl_jump = (kl > np.maximum(20 * prev_kl, 0.2)) | np.isinf(kl)
        v_jump = pd.Series(False, index=kl.index)
        if vl is not None:
            # a critic that has fit a solved task's returns has a tiny loss, and the next failed episode multiplies it
            # by 1000 (CartPole at 500: 4e-4 -> 6, within what the same run saw while it learned): an explosion is
            # also an order of magnitude beyond every value loss the run had before
            prev_v = vl.rolling(10, min_periods=3).median().shift(1).fillna(np.inf)
            prior_max = vl.cummax().shift(1).fillna(np.inf)
            v_jump = ((vl > 100 * np.maximum(prev_v, 1e-8)) & (vl > 10 * prior_max)) | np.isinf(vl)
        jump = kl_jump | v_jump
        if not jump.any():
            return Finding("loss_explosion", "ok", "loss explosion",
                           "no update's approx KL above max(20x the median of the 10 before, 0.2), nor value loss "
                           "above 100x theirs and 10x any before it")
        parts = []
        if kl_jump.any():
            parts.append(f"approx KL jumped at {_upd(m, kl_jump)} (max {float(kl[kl_jump].max()):.3g}; the run's "
                         f"median {float(kl.median()):.4f})")
        if v_jump.any():
            parts.append(f"value loss jumped more than 100x over the 10 updates before, and 10x past any earlier "
                         f"update, at {_upd(m, v_jump)} (max "
                         f"{float(vl[v_jump].max()):.4g}; the run's median {float(vl.median()):.4g})")
        ev = "; ".join(parts)
        m = m[jump]
    bkl, lag = _col(m, "lag/kl_behavior"), _col(m, "lag/mean")
    if bkl is not None and len(m):
        ev += f"; there, KL(behavior || current) {bkl.max():.4f} and version lag {lag.max():.2f}"
    lr = float(r.get("learner.lr", 1e-3) or 1e-3)
    clip = float(r.get("algo.loss.clip_eps", 0.2) or 0.2)
    stale = lag is not None and len(m) and float(lag.max()) >= 1
    ov = [f"algo.loss.clip_eps={max(0.05, round(clip / 2, 3))}", f"learner.lr={lr / 2:g}"]
    kind = r.get("algo.loss.kind")
    if kind == "clip":  # dual-clip for the algorithm the run uses (V-trace keeps its targets)
        ov.append("algo=vtrace_dual_clip" if r.get("algo.advantage.estimator") == "vtrace" else "algo=dual_clip")
    elif kind == "decoupled":
        ov.append("algo.loss.kind=decoupled_dual_clip")
    if stale and refresh_acts(r):
        ov.append(f"actor.refresh_lag={refresh_lag_for(r, float(lag.max()) / 3)}")
    sev = "act"
    ret = _col(r.metrics, "episodic_return_mean")
    ret = ret.dropna() if ret is not None else None
    if div is None and ret is not None and len(ret) >= 2:
        span = float(ret.max() - ret.min())
        end = float(ret.iloc[-1])
        if span > 0 and end >= float(ret.max()) - 0.1 * span and end >= float(ret.iloc[0]) + 0.5 * span:
            # spikes the run came back from (a large step size, tuned for the best AUC, does this): worth a look,
            # not an alarm
            sev = "watch"
            ev += f"; the return recovered: it ended at {end:.1f}, its best {float(ret.max()):.1f}"
    return Finding("loss_explosion", sev, "loss explosion", ev, ov,
                   "the guide's first check is KL and version lag; then a smaller clip (or dual-clip) bounds what "
                   "one stale sample can do" + (", and a forced refresh stops actors acting with very old versions"
                                                if any(o.startswith("actor.refresh_lag") for o in ov) else ""))


def refresh_acts(r: Run) -> bool:
    """Whether actor.refresh_lag can do anything in this run: not on the sync runner (it never publishes while
    collecting) and not under actor.fixed_lag (the actors are handed the version they act with)."""
    return r.get("runner.name") != "sync" and r.get("actor.fixed_lag") is None


def rule_lagging_worker(r: Run) -> Finding:
    a = r.actors
    if not len(a) or "lag" not in a or a["actor"].nunique() < 2:
        return Finding("lagging_worker", "ok", "a worker far behind", "fewer than two actors")
    half = a[a["update"] >= a["update"].max() / 2]
    per = half.groupby("actor")["lag"].median().dropna()
    if per.empty:
        return Finding("lagging_worker", "ok", "a worker far behind", "no actor versions recorded")
    # the worst against the others (with two actors a median over all would be their mean, never half the worst)
    who = int(per.idxmax())
    worst, typical = float(per.max()), float(per.drop(who).median())
    sev = "ok"
    if worst > max(4.0, 4 * typical):
        sev = "act"
    elif worst > max(2.0, 2 * typical):
        sev = "watch"
    ev = (f"actor {who}: median {worst:g} versions behind the learner over the second half; the other actors' "
          f"median {typical:g}")
    ov = [f"actor.refresh_lag={refresh_lag_for(r, 2 * max(typical, 1))}"] if sev != "ok" and refresh_acts(r) else []
    return Finding("lagging_worker", sev, "a worker far behind", ev, ov,
                   "a forced refresh makes a far-behind actor drop its rollout and load the newest version" if ov
                   else "")


def refresh_lag_for(r: Run, want: float) -> int:
    """A forced-refresh threshold that composes with the run's own and the doctor's other suggestions: at least 2
    (the parameter-wait rule may suggest actor.sync_min_lag=2) and at least the run's sync_min_lag."""
    return max(2, int(r.get("actor.sync_min_lag", 0) or 0), int(np.ceil(want)))


def _shares(r: Run) -> Optional[pd.DataFrame]:
    a = r.actors
    if not len(a):
        return None
    last = a.sort_values("update").groupby("actor").last()
    keys = [k for k in ("env_s", "infer_s", "snapshot_s", "throttle_s", "blocked_s") if k in last]
    total = last[keys].sum(axis=1).replace(0, np.nan)
    return last[keys].div(total, axis=0)


def rule_parameter_wait(r: Run) -> Finding:
    sh = _shares(r)
    if sh is None or "snapshot_s" not in sh:
        return Finding("parameter_wait", "ok", "time waiting for parameters", "no actor timings")
    frac = float(sh["snapshot_s"].mean())
    sev = "act" if frac > 0.25 else "watch" if frac > 0.10 else "ok"
    ev = f"actors spend {frac:.1%} of their time fetching and loading snapshots (mean over actors)"
    ov = ["actor.sync_min_lag=2", "learner.broadcast_every=2"] if sev != "ok" else []
    return Finding("parameter_wait", sev, "time waiting for parameters", ev, ov,
                   "sync less often: keep acting with a snapshot until it is a few versions old (a minimum sync "
                   "interval), or publish every few updates" if ov else "")


def rule_queue_age(r: Run) -> Finding:
    m = r.steady
    age = _col(m, "transport/age_s_mean")
    # an update's time is the wall clock from one update to the next (what a queued fragment waits through: the
    # update's compute and the wait for its batch), not its compute alone, which would read an idle learner's
    # queue as many updates deep
    wall = _col(m, "wall_time")
    upd = wall.diff().iloc[1:] if wall is not None and len(wall) > 2 else _col(m, "learner/compute_s")
    if age is None or upd is None or r.get("runner.name") == "sync":
        return Finding("queue_age", "ok", "queue age vs update time", "no queue in this run")
    a, u = float(age.median()), float(upd.median())
    ratio = a / u if u > 0 else float("nan")
    sev = "act" if ratio > 5 else "watch" if ratio > 2 else "ok"
    depth = _col(m, "transport/queue_depth")
    ev = (f"fragments wait {a * 1e3:.1f} ms in the queue (median), {ratio:.1f} updates' time "
          f"({u * 1e3:.1f} ms from one update to the next)")
    if depth is not None:
        ev += f"; queue depth median {depth.median():g} of {r.get('transport.capacity', '?')}"
    ov = []
    if sev != "ok":
        n, cap = r.n_actors, int(r.get("transport.capacity", 64) or 64)
        ov = [f"transport.capacity={max(1, cap // 2)}"] + ([f"actors={max(1, n // 2)}"] if n > 1 else [])
    return Finding("queue_age", sev, "queue age vs update time", ev, ov,
                   "data waits for several updates before it is used: a shorter queue or fewer actors (the guide's "
                   "cure for sawtooth curves)" if ov else "")


def rule_late_jitter(r: Run) -> Finding:
    ret = _col(r.metrics, "episodic_return_mean")
    if ret is None or ret.notna().sum() < 10:
        return Finding("late_jitter", "ok", "the return after it peaked", "too few updates with returns")
    upd = r.metrics.loc[ret.notna(), "update"].reset_index(drop=True) if "update" in r.metrics else None
    ret = ret.dropna().reset_index(drop=True)
    span = float(ret.max() - ret.min())
    if span <= 0:
        return Finding("late_jitter", "ok", "the return after it peaked", "a flat return curve")
    if float(ret.iloc[0]) >= float(ret.max()) - 0.2 * span:
        return Finding("late_jitter", "ok", "the return after it peaked",
                       f"the return never rose well above its start ({ret.iloc[0]:.1f}, best {ret.max():.1f}): "
                       "not learning, rather than falling back")
    peak_at = int(ret.idxmax())
    after = ret.iloc[peak_at:]
    drop = float(ret.max() - after.min()) / span  # how far it fell back after its best, as a share of its range
    late = ret.iloc[int(len(ret) * 0.7):]
    final_gap = float(ret.max() - late.iloc[-1]) / span
    sev = "act" if drop > 0.5 and final_gap > 0.3 else "watch" if drop > 0.2 else "ok"
    at = int(upd.iloc[peak_at]) if upd is not None else peak_at + 1
    last = int(r.metrics["update"].iloc[-1]) if "update" in r.metrics else len(ret)
    ev = (f"best rolling return {ret.max():.1f} at update {at} of {last}; afterwards it fell to "
          f"{after.min():.1f} ({drop:.0%} of the curve's range) and ended at {ret.iloc[-1]:.1f}")
    lam = float(r.get("algo.advantage.lam", 0.95) or 0.95)
    epochs = int(r.get("learner.epochs", 4) or 4)
    ov = ([f"algo.advantage.lam={min(0.99, round(lam + 0.03, 2))}"] if lam < 0.99 else []) + \
        [f"learner.epochs={max(1, epochs // 2)}"] \
        if sev != "ok" else []
    return Finding("late_jitter", sev, "the return after it peaked", ev, ov,
                   "check the run over several seeds (python train.py -m seed=0,1,2,3,4) before changing anything; "
                   "then a higher GAE lambda smooths the advantages and fewer epochs overfit old samples less"
                   if ov else "")


def rule_value(r: Run) -> Finding:
    ev_ = _col(r.steady, "losses/explained_variance")
    if ev_ is None or ev_.isna().all():
        return Finding("value_instability", "ok", "value estimates", "not measured")
    if len(r.metrics) < 10:
        return Finding("value_instability", "ok", "value estimates",
                       f"too few updates to judge ({len(r.metrics)}; a critic starts from nothing)")
    vl = _col(r.steady, "losses/value_loss")
    peak = _col(r.metrics, "losses/value_loss")
    peak = float(peak.max()) if peak is not None else float("nan")
    if vl is not None and np.isfinite(peak) and peak > 0:
        # a critic whose loss fell a thousandfold has fit targets that barely vary (a solved CartPole: every return
        # 500); there explained variance divides noise by noise and says nothing about the critic
        informative = vl >= 1e-3 * peak
        if not informative.any():
            return Finding("value_instability", "ok", "value estimates",
                           f"value loss {float(vl.median()):.2g} over the second half, under 1/1000 of its peak "
                           f"{peak:.3g}: the targets barely vary, so explained variance is not informative")
        ev_ = ev_[informative]
    med = float(ev_.median())
    cv = float(vl.std() / vl.mean()) if vl is not None and vl.mean() > 0 else float("nan")
    sev = "act" if med < -0.2 else "watch" if med < 0.2 else "ok"  # (near 0: the critic explains nothing)
    ev = f"explained variance median {med:.2f} over the second half; value loss coefficient of variation {cv:.2f}"
    vf = r.get("algo.loss.vf_coef")
    vf = 0.5 if vf is None else float(vf)
    if vf == 0 and sev != "ok":  # the critic is not trained at all: no weight to halve
        return Finding("value_instability", sev, "value estimates", ev + "; the value loss weight is 0",
                       ["algo.loss.vf_coef=0.5"], "algo.loss.vf_coef=0 trains no critic, so its estimates (and "
                       "the advantages built on them) stay where they started: give the value loss a weight")
    if sev != "ok" and not cv > CV_UNSTABLE:
        # a critic that explains little while its loss stays steady is under-fitted (early in a run, or too
        # small a weight), not unstable: training it less would be the wrong way
        return Finding("value_instability", sev, "value estimates", ev, [],
                       f"the critic explains little, but its loss is steady (variation {cv:.2f} <= {CV_UNSTABLE}): "
                       "it is still fitting, not unstable; look again later in the run, or give it more weight "
                       f"(algo.loss.vf_coef above {vf:g}) if it stays there")
    ov = [f"algo.loss.vf_coef={vf / 2:g}", f"learner.epochs={max(1, int(r.get('learner.epochs', 4) or 4) // 2)}"] \
        if sev != "ok" else []
    return Finding("value_instability", sev, "value estimates", ev, ov,
                   "the critic does not explain the returns: the guide updates the value function less often "
                   "(here: a smaller value loss weight, fewer epochs)" if ov else "")


def rule_throughput(r: Run) -> Finding:
    m = r.metrics
    if "env_steps" in m and len(m):
        # env_steps counts the steps produced: once the budget is out the learner drains the queue and the rate
        # reads 0, which is the end of the run, not a drop
        m = m[m["env_steps"] < m["env_steps"].max()] if m["env_steps"].iloc[-1] == m["env_steps"].max() and \
            (m["env_steps"] == m["env_steps"].max()).sum() > 1 else m
    if len(m) < 12 or "wall_time" not in m:
        return Finding("throughput", "ok", "throughput drops", "too few updates to judge")
    # SPS over windows of k updates (one update's window is noise in an asynchronous run: batches arrive in
    # bursts), each against the median of the windows before it: a drop is a window below half of that
    k = max(3, len(m) // 20)
    sps = (m["env_steps"].diff(k) / m["wall_time"].diff(k)).iloc[k + 1:].reset_index(drop=True)
    upd = m["update"].iloc[k + 1:].reset_index(drop=True)
    before = sps.expanding().median().shift(1)
    drop = (sps < 0.5 * before) & (sps.index >= 5)
    frac = float(drop.mean())
    sev = "act" if frac > 0.3 else "watch" if drop.sum() >= 2 and frac > 0.1 else "ok"
    ev = f"SPS over {k}-update windows: median {sps.median():,.0f}"
    if drop.any():
        lo = upd[drop]
        ev += (f"; below half of the level before it in {int(drop.sum())} windows ({frac:.0%}), ending at updates "
               f"{int(lo.iloc[0])}-{int(lo.iloc[-1])}, lowest {sps[drop].min():,.0f}")
    else:
        ev += "; no window below half of the level before it"
    sh = _shares(r)
    if sh is not None:
        ev += "; actors' time: " + ", ".join(f"{k_[:-2]} {v:.0%}" for k_, v in sh.mean().items())
    # the override follows where the actors' time went: only snapshot loading is cured by syncing less often
    snap = float(sh["snapshot_s"].mean()) if sh is not None and "snapshot_s" in sh else float("nan")
    waiting = float((sh[[k for k in ("throttle_s", "blocked_s") if k in sh]].sum(axis=1)).mean()) \
        if sh is not None else float("nan")
    n = r.n_actors
    ov = ["actor.sync_min_lag=2"] if sev != "ok" and snap > 0.10 else \
        [f"actors={max(1, n // 2)}"] if sev != "ok" and waiting > 0.5 and n > 1 else []
    advice = ""
    if sev != "ok":
        advice = ("the actors spend their time loading snapshots: sync less often" if snap > 0.10 else
                  f"the actors spend {waiting:.0%} of their time throttled or blocked: the learner is the "
                  "bottleneck, so fewer actors lose no throughput and make the data fresher" if ov else
                  "look at where the actors' time went (above): throttled or blocked means the learner is the "
                  "bottleneck (fewer actors or a larger batch), an actor that stopped shows in summary.json's "
                  "restarts; waiting for parameters is not the cause here, so no minimum sync interval")
    return Finding("throughput", sev, "throughput drops", ev, ov, advice)


def rule_books(r: Run) -> Finding:
    t = r.summary.get("transport") or {}
    if not t:
        return Finding("books", "watch", "the books", "summary.json has no transport books")
    un, worst = int(t.get("unaccounted", 0) or 0), int(t.get("worst_unaccounted_at_update", 0) or 0)
    mis = int(t.get("misattributed", 0) or 0)
    produced = int(t.get("produced", 0) or 0)
    dropped, rejected = t.get("dropped") or {}, t.get("rejected") or {}
    def part(name: str, d: Dict[str, int]) -> str:
        why = ", ".join(f"{k} {v:,}" for k, v in d.items() if v)
        return f"{name} {sum(d.values()):,}" + (f" ({why})" if why else "")

    ev = (f"produced {produced:,} = admitted {int(t.get('admitted', 0) or 0):,} + {part('dropped', dropped)} + "
          f"{part('rejected', rejected)} + in flight {int(t.get('in_flight', 0) or 0):,}; unaccounted {un}, worst "
          f"at any update {worst}, misattributed {mis}")
    if un or worst or mis:
        return Finding("books", "act", "the books", ev, [],
                       "transitions are unaccounted for or misattributed: a transport bug; keep this run dir and "
                       "report it")
    return Finding("books", "ok", "the books", ev)


def rule_cpu(r: Run) -> Finding:
    """Actors starved of CPU by other processes (summary.json's ``cpu``, laglab.console.cpu_starved): not one of
    the guide's rows, but what its 5.2 ("look at actor utilisation") finds first on a shared machine."""
    from laglab.console import starved_text

    c = r.summary.get("cpu") or {}
    if not c or c.get("actors_wait_frac") is None:
        return Finding("cpu", "ok", "CPU for the actors", "not measured (runner=sync or thread, a kernel without "
                       "schedstat, or a run of an older laglab)")
    idle = c.get("learner_wait_frac")
    ev = (f"the actors waited for a CPU {c['actors_wait_frac']:.0%} of the time they were ready to run "
          f"({c.get('actors_wait_s', 0):,.1f} s, against {c.get('actors_cpu_s', 0):,.1f} s of CPU)"
          + (f"; the learner waited for data {idle:.0%} of its time" if idle is not None else ""))
    runner, nice, raised = str(r.summary.get("runner")), int(c.get("actor_nice") or 0), c.get("raised") or {}
    if raised and not raised.get("refused"):  # starved, and the run raised the actors' priority itself
        return Finding("cpu", "watch", "CPU for the actors", ev, ["runner.actor_nice=0"],
                       starved_text(float(raised.get("wait_frac") or 0),
                                    float(raised.get("learner_wait_frac", idle if idle is not None else 1.0)), runner,
                                    nice, raised))
    if not c.get("starved"):
        return Finding("cpu", "ok", "CPU for the actors", ev)
    ov = ["runner.actor_nice=0"] if runner == "process" and nice > 0 else []
    return Finding("cpu", "act", "CPU for the actors", ev, ov,
                   starved_text(c["actors_wait_frac"], idle if idle is not None else 1.0, runner, nice, raised))


RULES: List[Callable[[Run], Finding]] = [rule_kl, rule_loss, rule_lagging_worker, rule_parameter_wait,
                                         rule_queue_age, rule_late_jitter, rule_value, rule_throughput, rule_cpu,
                                         rule_books]
TUNING = {1: "hold KL under 0.02 with the actor count and the queue length",
          2: "add actors until throughput stops paying or KL rises (the knee)",
          3: "then the batch size (more samples per update, rather than more actors)",
          4: "then clip and epochs, for learning per sample"}


def tuning_step(r: Run, findings: Dict[str, Finding]) -> Dict[str, object]:
    """Where the run is in the guide's order (4.3): the first step whose condition is not met yet."""
    offered = _col(r.steady, "lag/kl_offered_mean")
    kl = offered if r.get("learner.max_kl_behavior") is not None and offered is not None and offered.notna().any() \
        else _col(r.steady, "lag/kl_behavior")
    kept = _col(r.steady, "lag/kept_frac")
    dropped = 1 - float(kept.mean()) if kept is not None and kept.notna().any() else 0.0
    if (kl is not None and float(kl.median()) > KL_TUNE) or findings["queue_age"].severity == "act" or dropped > 0.1:
        step, why = 1, ("KL is above 0.02, data waits in the queue, or the lag / KL limits drop more than 10% of the "
                        "data: fix staleness before anything else")
    else:
        wait = _col(r.steady, "learner/wait_frac")
        n = r.n_actors
        cores = int((r.summary.get("provenance") or {}).get("cpu_count") or 0)
        cpu_bound = r.get("env.id") != "laglab/Latency-v0"  # (latency-env actors sleep: they need no core)
        lost = [k for k in ("parameter_wait", "throughput", "cpu") if k in findings and findings[k].severity == "act"]
        if lost:
            step, why = 2, ("the actors lose throughput (" + " and ".join(findings[k].title for k in lost) +
                            "): get it back with that finding's overrides before adding actors, or more actors "
                            "would only lose more")
        elif wait is not None and float(wait.median()) > 0.2 and r.get("runner.name") != "sync":
            if cores and cpu_bound and n + 1 >= cores:
                step, why = 3, (f"the learner waits for data {float(wait.median()):.0%} of the time, but {n} actors "
                                f"and the learner already fill this machine's {cores} cores: more actors would share "
                                "them; more data per update comes from the batch size")
            else:
                step, why = 2, (f"KL is in hand and the learner waits for data {float(wait.median()):.0%} of the "
                                f"time: more actors would pay (try actors={2 * n})")
        elif any(findings[k].severity != "ok" for k in ("late_jitter", "loss_explosion", "value_instability")):
            step, why = 4, "staleness and throughput are in hand; the learning itself is what to tune"
        else:
            step, why = 3, "KL is in hand and the learner is busy: more data per update comes from the batch size"
    return {"step": step, "what": TUNING[step], "why": why}


def refused(r: Run, overrides: List[str]) -> Optional[str]:
    """Why ``python train.py <this run's config> <overrides>`` would be refused (laglab's own validation), or
    None when it would start (or when the run's config cannot be checked: no .hydra/config.yaml)."""
    if not r.cfg or not overrides:
        return None
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException
    from laglab.config import ConfigError, register_configs, validate

    own_file = Path(r.path) / ".hydra" / "overrides.yaml"
    if any(o.split("=", 1)[0] in CONFIG_GROUPS for o in overrides) and own_file.is_file():
        # a config group (algo=dual_clip) is a whole file Hydra composes in: compose the run's own command line
        # with the suggestions, as train.py would
        from laglab.preflight import compose

        own = [o for o in (yaml.safe_load(own_file.read_text()) or [])
               if not str(o).startswith(("hydra.", "learner.device="))]
        try:  # (on this machine's CPU: a run trained on a GPU is judged here all the same)
            compose(list(own) + list(overrides) + ["learner.device=cpu"])
        except (ConfigError, ValueError) as e:
            return str(e).removeprefix("invalid config: ")
        return None
    register_configs()  # (the resolvers a run's composed config uses)
    try:
        validate(OmegaConf.merge(OmegaConf.create(r.cfg), OmegaConf.from_dotlist(
            [o for o in overrides if o.split("=", 1)[0] not in CONFIG_GROUPS] + ["learner.device=cpu"])))
    except (ConfigError, OmegaConfBaseException, ValueError) as e:
        return str(e).removeprefix("invalid config: ")
    return None


def check_overrides(r: Run, findings: Dict[str, Finding]) -> List[str]:
    """Every suggestion must start: a finding's overrides that laglab would refuse on this run's config are
    taken out one by one (the refusal said in its advice), and the overrides of all findings that act or watch,
    pasted together, are checked as one line. Returns notes on what cannot be combined."""
    for f in findings.values():
        why = refused(r, f.overrides)
        while why is not None and f.overrides:
            bad = next((o for o in f.overrides if o.split("=", 1)[0] in why), None)
            if bad is None:  # a refusal that names none of them: say so rather than guess which to drop
                f.advice += f" (these overrides could not be checked against this run's config: {why})"
                break
            f.overrides = [o for o in f.overrides if o != bad]
            f.advice += f" ({bad} left out: with this run's config laglab refuses it: {why})"
            why = refused(r, f.overrides)
    notes = []
    active = [f for f in findings.values() if f.severity != "ok" and f.overrides]
    union = list(dict.fromkeys(o for f in active for o in f.overrides))
    keys = [o.split("=", 1)[0] for o in union]
    clash = sorted({k for k in keys if keys.count(k) > 1})
    if clash:
        notes.append("the findings suggest different values of " + ", ".join(clash) + ": apply one finding's "
                     "overrides at a time")
    elif len(active) > 1:
        why = refused(r, union)
        if why is not None:
            notes.append(f"the findings' overrides cannot all be pasted together ({why}): apply one finding's "
                         "overrides at a time, in the tuning order")
    return notes


def diagnose(path: str | Path) -> Dict[str, object]:
    """Every rule on one run dir: {"run", "status", "notes", "findings": [...], "tuning_step": {...}}."""
    r = read_run(Path(path))
    status = r.summary.get("status", "unknown")
    notes = []
    if status != "completed":
        err = (r.summary.get("error") or "").strip().splitlines()
        why = f": {err[0][:300]}" if err else ""
        notes.append(f"the run is {status}{why}; what it recorded is below" +
                     (" (summary.json has the whole error)" if r.summary.get("error") else ""))
    if not len(r.metrics):
        books = bool(r.summary.get("transport"))
        notes.append("no updates: the run stopped before its first learner update, or has not made one yet" +
                     (" (only the books can be read)" if books else "; nothing it measured can be read yet, so "
                      "every rule below says 'ok' for want of data, not for health"))
    findings = {f.rule: f for f in (rule(r) for rule in RULES)}
    notes += check_overrides(r, findings)
    out = {"run": str(r.path), "status": status, "notes": notes,
           "findings": [asdict(f) for f in findings.values()],
           "tuning_step": tuning_step(r, findings) if len(r.metrics) else None}
    return out


def is_run_dir(path: Path) -> bool:
    """What the doctor reads: a run dir as analysis.load knows one (a summary, or a config beside a log or
    metrics), or a bare metrics.parquet."""
    return _has_run_files(path) or (path / "metrics.parquet").is_file()


def find_run_dirs(path: Path) -> List[Path]:
    if not path.exists():
        raise DoctorError(f"{path}: no such run or sweep dir")
    if is_run_dir(path):
        return [path]
    runs = sorted({p.parent for p in path.rglob("summary.json")} | {p.parent for p in path.rglob("metrics.parquet")}
                  | {c.parent.parent for c in path.rglob(".hydra/config.yaml") if _has_run_files(c.parent.parent)})
    if not runs:
        raise DoctorError(f"{path}: no run dirs under it (a run dir has a summary.json; is this the run's output "
                          "dir, e.g. outputs/<date>/<time>_...?)")
    return runs


# ---- output ------------------------------------------------------------------------------------------------
def markdown(results: List[Dict[str, object]]) -> str:
    lines = []
    for res in results:
        lines += [f"## {res['run']}", "", f"status: {res['status']}"]
        lines += [f"- {n}" for n in res["notes"]]
        lines += ["", "| rule | severity | evidence | change |", "|---|---|---|---|"]
        for f in res["findings"]:
            change = " ".join(f"`{o}`" for o in f["overrides"]) or "—"
            lines.append(f"| {f['rule']} | {f['severity']} | {f['evidence']} | {change} |")
        ts = res["tuning_step"]
        if ts:
            lines += ["", f"Tuning order (seed 004, 4.3): step {ts['step']} — {ts['what']}. {ts['why']}."]
        lines.append("")
    return "\n".join(lines)


COLOUR = {"ok": "green", "watch": "yellow", "act": "red"}
SHORT = {"kl_behavior": "KL", "loss_explosion": "loss", "lagging_worker": "worker", "parameter_wait": "params",
         "queue_age": "queue", "late_jitter": "late", "value_instability": "value", "throughput": "SPS",
         "books": "books"}


def run_labels(dirs: List[Path]) -> List[str]:
    """A short name per run of a sweep: the overrides that differ between its runs (else the dir's name)."""
    ovs = []
    for d in dirs:
        f = d / ".hydra" / "overrides.yaml"
        ovs.append(dict(str(o).split("=", 1) for o in (yaml.safe_load(f.read_text()) or []) if "=" in str(o))
                   if f.is_file() else {})
    keys = sorted({k for o in ovs for k in o if len({str(x.get(k)) for x in ovs}) > 1})
    return [" ".join(f"{k.split('.')[-1]}={o[k]}" for k in keys if k in o) or d.name for d, o in zip(dirs, ovs)]


def print_sweep(results: List[Dict[str, object]], con) -> None:
    """One row per run, one column per rule: the severities at a glance (details of what is not ok follow)."""
    from rich.table import Table

    names = [f["rule"] for f in next((r["findings"] for r in results if r["findings"]), [])]
    t = Table(title=f"{len(results)} runs")
    t.add_column("run", no_wrap=True, overflow="ellipsis", min_width=18)
    for n in names:
        t.add_column(SHORT.get(n, n), justify="center")
    t.add_column("step", justify="center")
    labels = run_labels([Path(r["run"]) for r in results])
    for res, label in zip(results, labels):
        sev = {f["rule"]: f["severity"] for f in res["findings"]}
        cells = [f"[{COLOUR[sev[n]]}]{sev[n]}[/]" if n in sev else "-" for n in names]
        ts = res["tuning_step"]
        t.add_row(label + ("" if res["status"] == "completed" else f" ({res['status']})"), *cells,
                  str(ts["step"]) if ts else "-")
    con.print(t)
    con.print("columns: " + ", ".join(f"{v} = {k}" for k, v in SHORT.items() if k in names))
    for res, label in zip(results, labels):
        bad = [f for f in res["findings"] if f["severity"] != "ok"]
        if bad or res["notes"]:
            con.print(f"[bold]{label}[/bold]  ({res['run']})")
            for n in res["notes"]:
                con.print(f"  [yellow]{n}[/yellow]")
            for f in bad:
                con.print(f"  [{COLOUR[f['severity']]}]{f['rule']}[/]: {f['evidence']}")
                if f["overrides"]:
                    con.print(f"    change: {' '.join(f['overrides'])}")


def print_rich(results: List[Dict[str, object]]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    colour = COLOUR
    if len(results) > 1:
        print_sweep(results, con)
        return
    for res in results:
        con.print(f"[bold]{res['run']}[/bold]  status: {res['status']}")
        for n in res["notes"]:
            con.print(f"  [yellow]{n}[/yellow]")
        t = Table(show_lines=False, expand=False)
        for c in ("rule", "severity", "evidence", "paste after python train.py"):
            t.add_column(c, overflow="fold")
        for f in res["findings"]:
            t.add_row(f["rule"], f"[{colour[f['severity']]}]{f['severity']}[/]", f["evidence"],
                      " ".join(f["overrides"]))
        con.print(t)
        for f in res["findings"]:
            if f["severity"] != "ok" and f["advice"]:
                con.print(f"  [{colour[f['severity']]}]{f['rule']}[/]: {f['advice']}")
        ts = res["tuning_step"]
        if ts:
            con.print(f"  tuning order (seed 004): [bold]step {ts['step']}[/bold] — {ts['what']}: {ts['why']}")
        con.print()


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.doctor", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", help="a run dir or a sweep dir (every run under it)")
    ap.add_argument("--json", action="store_true", help="print one JSON object (a list under 'runs' for a sweep)")
    ap.add_argument("--md", metavar="FILE", help="also write the findings as markdown")
    a = ap.parse_args(argv)
    try:
        runs = find_run_dirs(Path(a.path))
        results = []
        for d in runs:
            try:
                results.append(diagnose(d))
            except Exception as e:  # noqa: BLE001 - one unreadable run must not hide the others
                why = str(e) if isinstance(e, DoctorError) else f"could not read it: {type(e).__name__}: {e}"
                results.append({"run": str(d), "status": "unreadable", "notes": [why], "findings": [],
                                "tuning_step": None})
    except DoctorError as e:
        print(f"doctor: {e}", file=sys.stderr)
        return 2
    if a.md:
        Path(a.md).write_text(markdown(results))
    if a.json:
        print(json.dumps(results[0] if len(results) == 1 and (Path(a.path) / "summary.json").is_file()
                         else {"runs": results}, default=float))
    else:
        print_rich(results)
    return 0


def _cli() -> int:
    from .cli import interruptible

    return interruptible(lambda: main(), "doctor")  # (main looked up when called)


if __name__ == "__main__":
    sys.exit(_cli())
