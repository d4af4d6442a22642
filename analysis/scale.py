"""The scaling study (``benchmarks/scale.py``: laglab.sim on a cluster, every actor and the learner on a CPU of its
own) as a report rebuilt from its committed compact data::

    python -m analysis.report reports/scale          # report.md from scale.parquet and scale.json, nothing re-run

``scale.parquet``: one row per (preset, actor count): the model's steady SPS, learner utilisation, mean and p95 lag,
data age, the share ``learner.max_policy_lag`` = 4 or 16 would drop, the KL the lag-cost study's map gives at the mean
lag (and whether that lag lies past the study's); and, in studies from 2026-12-07 on, the same count as ``runner=ray``
moves it (``sps_ray``, ``learner_util_ray``, ``board_util_ray``: the snapshot board's busy share, ``lag_mean_ray``;
``steps_per_call``: a rollout's env steps). ``scale.json``: the command, the KL band (``kl_max``) and the Ray path's
costs (``ray_path``).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import List

import pandas as pd

DATA, META = "scale.parquet", "scale.json"
SATURATED = 0.95  # learner busy at least this: saturated (laglab.sim.SATURATED, the --scan's: a test keeps them one)


def is_scale_dir(p: str | Path) -> bool:
    return (Path(p) / DATA).is_file() and (Path(p) / META).is_file()


def write(d: str | Path, rows: pd.DataFrame, meta: dict) -> None:
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    rows.to_parquet(d / DATA, index=False)
    (d / META).write_text(json.dumps(meta, indent=1) + "\n")


def findings(df: pd.DataFrame, kl_max: float) -> List[str]:
    """Per preset: where the learner saturates, and the actor count seed 004's rule recommends (KL within
    ``kl_max`` at a lag the study measured, throughput still at its knee)."""
    out = []
    for preset, g in df.groupby("preset", sort=False):
        g = g.sort_values("actors")
        sat = g[g["learner_util"] >= SATURATED]
        where = f"the learner saturates by N = {int(sat['actors'].iloc[0])}" if len(sat) else \
            f"the learner is not saturated at N = {int(g['actors'].max())}"
        rec = "no KL map (no lag-cost study for this env)"
        if g["kl_pred"].notna().all():
            ok = g[(g["kl_pred"] <= kl_max) & ~g["kl_extrapolated"]]  # (no claim beyond the lags measured)
            from laglab.sim import pays  # (seed 004's knee, as `python -m laglab.sim --scan` applies it)

            n, sps = g["actors"].tolist(), g["sps"].tolist()
            knee = g[[i == 0 or pays(n[i - 1], sps[i - 1], n[i], sps[i]) for i in range(len(g))]]
            both = sorted(set(ok["actors"]) & set(knee["actors"]))
            rec = f"seed 004's rule recommends N = {both[-1]}" if both else "no N in range meets seed 004's rule"
        out.append(f"{preset}: {where}; {rec}")
    return out


def ray_findings(df: pd.DataFrame, ray_path: dict) -> List[str]:
    """Per preset, under ``runner=ray``: where its learner saturates, the steady SPS at the largest count against
    the process runner's, and how busy the snapshot board gets, with the ceiling it sets alone (a call's steps per
    second of the board's answer)."""
    if "sps_ray" not in df:
        return []
    out = []
    board = float(ray_path.get("board_cpu_s", 0.0) or 0.0)
    for preset, g in df.groupby("preset", sort=False):
        g = g.sort_values("actors")
        top = g.iloc[-1]
        sat = g[g["learner_util_ray"] >= SATURATED]
        where = f"the learner saturates by N = {int(sat['actors'].iloc[0])}" if len(sat) else \
            f"the learner is not saturated at N = {int(top['actors'])}"
        flat = g[g["sps_ray"] >= 0.99 * g["sps_ray"].max()]  # (the plateau: within 1% of the most)
        line = (f"{preset} on Ray: {where}; {top['sps_ray']:.4g} SPS at N = {int(top['actors'])} "
                f"({top['sps_ray'] / top['sps']:.2f}x the process runner's; within 1% of it from N = "
                f"{int(flat['actors'].iloc[0])}); the board at most {g['board_util_ray'].max():.0%} busy")
        if board > 0 and "steps_per_call" in g:
            line += (f" (alone it would cap near {float(top['steps_per_call']) / board:.3g} SPS: "
                     f"{int(top['steps_per_call'])} steps a call, {1e3 * board:.2f} ms an answer)")
        out.append(line)
    return out


def build(d: str | Path) -> str:
    d = Path(d)
    df = pd.read_parquet(d / DATA)
    meta = json.loads((d / META).read_text())
    lines = ["# On a cluster, on paper: laglab.sim for 1-4096 actors", "",
             f"Rebuilt by `python -m analysis.report reports/{d.name}` from `{DATA}` and `{META}` (nothing re-run); "
             f"made by `{meta.get('command', 'benchmarks/scale.py')}`. The model with the learner and every actor on a "
             "CPU of its own; an extrapolation (validated on two cores to 64 actors: reports/sim_validation).", ""]
    lines += [f"- {f}" for f in findings(df, float(meta.get("kl_max", 0.03)))]
    lines += [f"- {f}" for f in ray_findings(df, meta.get("ray_path") or {})] + [""]
    if "ray_path" in meta:
        rp = meta["ray_path"]
        own = (f", the worker's own CPU per call {1e3 * rp['snapshot_cpu_s']:.2f} ms on its core"
               if "snapshot_cpu_s" in rp else "")
        own += (f", the learner's post of each publication {1e3 * rp['publish_s']:.2f} ms after its update (the board "
                "takes it in turn with the calls)" if "publish_s" in rp else "")
        lines += [f"The `*_ray` columns: `runner=ray` with the board's answer {1e3 * rp['board_cpu_s']:.2f} ms{own}, "
                  f"the rest of a call's round trip {1e3 * rp['call_s']:.2f} ms and the learner's time per fragment "
                  f"through Ray {1e3 * rp['fragment_s']:.2f} ms ({'; '.join(rp.get('calibrated_from', []))}); the "
                  "board on a CPU of its own.", ""]
    cols = ["preset", "actors", "costs", "sps", "learner_util", "lag_mean", "lag_p95", "age_s", "drop@4", "drop@16",
            "kl_pred", "kl_extrapolated", "sps_ray", "learner_util_ray", "board_util_ray", "lag_mean_ray"]
    cols = [c for c in cols if c in df]  # (studies before 2026-12-07 have no Ray columns)
    t = df[cols]
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in t.iterrows():
        lines.append("| " + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in r) + " |")
    return "\n".join(lines) + "\n"


def rebuild(d: str | Path) -> Path:
    (Path(d) / "report.md").write_text(build(d))
    return Path(d) / "report.md"
