"""Past one machine on paper: laglab.sim's predictions for 100-4096 actors on a cluster (every actor and the learner
on its own CPU; the learner's cost per fragment as calibrated, or the Ray path's where the costs have none), for
three presets — CartPole, HalfCheetah and a 20 ms robot-like simulator — with where the learner saturates, the lag
and data age that follow, what ``learner.max_policy_lag`` would drop, and the actor count seed 004's rule recommends.

    python benchmarks/scale.py [--actors 1,2,4,...,4096] [--costs-dir benchmarks/costs] [--out DIR] [--ray-fragment-s S]

Costs: ``<costs-dir>/<preset>.json`` from ``python -m laglab.sim --calibrate <real runs of that preset>`` on a quiet
machine; a preset without one runs on laglab.sim's default costs and its rows say ``uncalibrated``.

Each count runs twice: as the process runner moves fragments (``sps``, ``learner_util``, ...) and as ``runner=ray``
does (the ``*_ray`` columns): rollout calls, ``runner.max_inflight``, and the snapshot board, one process answering
one call at a time, on a CPU of its own; the Ray path's costs from ``<costs-dir>/ray_path.json`` (the board's answer,
the rest of a call's round trip, the learner's time per fragment through Ray and, where calibrated, the worker's own
CPU per call and the learner's post of each publication; no ``fetch_s``: a snapshot's load is part of a Ray call) over the preset's. ``board_util_ray`` is the
board's busy share: where it nears 1, the board sets the pace, not the learner. Ray's other processes' CPU per call
(``call_cpu_s``) is left out: on a cluster it runs on the workers' nodes, beside them. Without ``ray_path.json`` the
study has no Ray columns.

Seed 004's rule: grow the actor count while throughput still pays and the policy lag keeps KL(behavior || current)
within its band (< 0.01 fine, 0.01-0.03 watch, > 0.03 too stale). KL is not in the model (it depends on the
policy): it comes from the lag-cost studies, which measured KL at each fixed lag at the tuned step size
(``--kl env_id=reports/<study>``), interpolated in log2(1 + lag). The recommendation is the largest N whose
predicted KL at its mean lag is <= --kl-max (default 0.03) and whose SPS grew from the previous N's by >= 1.1x per
doubling of the actors (the knee: laglab.sim.pays, as ``python -m laglab.sim --scan`` has it); presets without a study
say so.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from analysis import scale as scale_report  # noqa: E402
RAY_FRAGMENT_S = 220e-6  # the Ray path's learner-side cost per fragment, measured (README: runner=ray)
PRESETS = {
    "cartpole": ["env=cartpole"],
    "halfcheetah": ["env=halfcheetah"],
    "robot20ms": ["env=latency", "env.latency_ms=[20]"],
}
LATENCY = {"robot20ms": "lognormal:20,0.2"}  # a simulator's step time jitters (fixed steps would phase-lock)
KL_STUDIES = {"CartPole-v1": "reports/lag_cost_tuned_cartpole", "Pendulum-v1": "reports/lag_cost_tuned_pendulum"}
ENV_IDS = {"cartpole": "CartPole-v1", "halfcheetah": "HalfCheetah-v5", "robot20ms": None}
RAY_PATH = ("board_cpu_s", "call_s", "fragment_s")  # what ray_path.json must set over a preset's costs
RAY_OPTIONAL = ("snapshot_cpu_s", "publish_s")  # and may (calibrations from 2026-12-07 05:00 on: a call's own CPU;
# from 08:38 on: the learner's post of each publication)


def per_call(preset: str) -> int:
    """A rollout's env steps in the preset (envs_per_actor x rollout_len): one Ray call's."""
    from laglab.sim import compose

    cfg = compose(PRESETS[preset])
    return int(cfg.actor.envs_per_actor * cfg.actor.rollout_len)


def steps_for(n: int, per_rollout: int) -> int:
    """At least 10 rollouts per actor and 200 batches: a steady state after the start."""
    return int(max(10 * n * per_rollout, 200 * 1024))


def simulate(preset: str, n: int, costs: Optional[Path], per_rollout: int, ray: Optional[dict] = None
             ) -> Dict[str, float]:
    """The model's outputs for ``preset`` at ``n`` actors, each on a CPU of its own (``per_rollout``: its rollout's
    env steps, :func:`per_call`); ``ray``: as ``runner=ray`` with those Ray path costs (ray_path.json) over the
    preset's (the snapshot board on a CPU of its own too)."""
    ovs = [*PRESETS[preset], f"runner={'ray' if ray else 'process'}", f"actors={n}"]
    ovs.append(f"total_env_steps={steps_for(n, per_rollout)}")
    cmd = [sys.executable, "-m", "laglab.sim", *ovs, "--json", "--cost", f"cores={n + (2 if ray else 1)}"]
    if costs is not None:
        cmd += ["--costs", str(costs)]
    if costs is None or "fragment_s" not in json.loads(costs.read_text()):
        cmd += ["--cost", f"fragment_s={RAY_FRAGMENT_S}"]
    if ray is not None:  # (a snapshot's load is part of a Ray call's way, as Ray's calibrations have it: no fetch_s)
        cmd += [x for k in (*RAY_PATH, *RAY_OPTIONAL) if k in ray for x in ("--cost", f"{k}={ray[k]}")]
        cmd += ["--cost", "fetch_s=0"]
    if preset in LATENCY:
        cmd += ["--latency", LATENCY[preset]]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{preset} N={n}: {p.stderr}")
    return json.loads(p.stdout)


def dropped_by(hist: List[int], k: int) -> float:
    """The fraction of trained transitions older than k versions: what learner.max_policy_lag=k would drop."""
    h = np.asarray(hist, float)
    return float(h[k + 1:].sum() / h.sum()) if h.sum() else float("nan")


def kl_map(study: Path, algo: str = "ppo"):
    """KL(behavior || current) against lag at each arm's selected step size, from a committed lag-cost study."""
    runs = pd.read_csv(study / "runs.csv")
    sel = pd.read_csv(study / "selection.csv")
    sel = sel[sel["cfg.algo.name"] == algo]
    pts = []
    for _, s in sel.iterrows():
        r = runs[(runs["cfg.algo.name"] == algo) & (runs["cfg.actor.fixed_lag"] == s["cfg.actor.fixed_lag"])
                 & np.isclose(runs["cfg.learner.lr"], s["cfg.learner.lr"])]
        pts.append((float(r["lag_mean"].median()), float(r["kl_behavior"].median())))
    pts.sort()
    x = np.log2(1 + np.array([p[0] for p in pts]))
    y = np.array([p[1] for p in pts])
    return lambda lag: float(np.interp(np.log2(1 + lag), x, y)), max(p[0] for p in pts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--actors", default="1,2,4,8,16,32,64,100,256,512,1024,2048,4096")
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--costs-dir", default=str(ROOT / "benchmarks" / "costs"))
    ap.add_argument("--kl-max", type=float, default=0.03)
    ap.add_argument("--ray-fragment-s", type=float, default=None,
                    help="what if: the learner's time per fragment on Ray set to this (s) over ray_path.json's "
                         "(Ray's bare path measured 220e-6: README, runner=ray); the report says so")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    out = Path(a.out or f"/tmp/scale_{time.strftime('%Y%m%d_%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    ray_file, ray = Path(a.costs_dir) / "ray_path.json", None
    if not ray_file.exists():
        if a.ray_fragment_s is not None:
            ap.error(f"--ray-fragment-s needs the Ray path's costs ({ray_file}: none)")
        print(f"{ray_file}: none, so no runner=ray columns", file=sys.stderr)
    else:
        ray = json.loads(ray_file.read_text())
        if any(k not in ray for k in RAY_PATH):
            ap.error(f"{ray_file}: the Ray path's costs need {', '.join(RAY_PATH)}")
        if a.ray_fragment_s is not None:
            if not a.ray_fragment_s > 0:
                ap.error(f"--ray-fragment-s must be > 0 seconds, got {a.ray_fragment_s}")
            ray["calibrated_from"] = [*ray.get("calibrated_from", []), f"fragment_s set to {a.ray_fragment_s:g} s "
                                      f"by --ray-fragment-s (a what-if; calibrated {ray['fragment_s']:g})"]
            ray["fragment_s"] = a.ray_fragment_s
    for preset in a.presets.split(","):
        costs = Path(a.costs_dir) / f"{preset}.json"
        costs = costs if costs.exists() else None
        steps = per_call(preset)  # (one composition per preset)
        env_id = ENV_IDS[preset]
        study = ROOT / KL_STUDIES[env_id] if env_id in KL_STUDIES else None
        kl, kl_lag_max = kl_map(study) if study is not None and (study / "selection.csv").exists() else (None, None)
        for n in map(int, a.actors.split(",")):
            o = simulate(preset, n, costs, steps)
            kl_at = kl(o["lag_mean"]) if kl is not None else float("nan")
            rows.append({"preset": preset, "actors": n, "costs": "calibrated" if costs else "uncalibrated",
                         "sps": o["sps_steady"], "learner_util": o["learner_utilization"],
                         "lag_mean": o["lag_mean"], "lag_p95": o["lag_p95"], "age_s": o["age_s_mean"],
                         "drop@4": dropped_by(o["lag_hist"], 4), "drop@16": dropped_by(o["lag_hist"], 16),
                         "kl_pred": kl_at,
                         "kl_extrapolated": bool(kl is not None and o["lag_mean"] > kl_lag_max)})
            if ray is not None:
                r = simulate(preset, n, costs, steps, ray)
                rows[-1].update({"sps_ray": r["sps_steady"], "learner_util_ray": r["learner_utilization"],
                                 "board_util_ray": r["board_utilization"], "lag_mean_ray": r["lag_mean"],
                                 "steps_per_call": steps})
            print(json.dumps(rows[-1], default=float), flush=True)
    df = pd.DataFrame(rows)
    meta = {"command": "python benchmarks/scale.py " + " ".join(sys.argv[1:]), "kl_max": a.kl_max}
    if ray is not None:
        meta["ray_path"] = ray
    scale_report.write(out, df, meta)
    print()
    print(df.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    print()
    for line in scale_report.findings(df, a.kl_max) + scale_report.ray_findings(df, meta.get("ray_path") or {}):
        print(line)
    print(f"\nwritten: {scale_report.rebuild(out)} (python -m analysis.report {out} rebuilds it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
