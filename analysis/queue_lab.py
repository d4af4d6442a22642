"""Queue lab: a fluid model of the bounded fragment queue, and a check of it (and of Little's law) against a
real run.

The fluid model: items arrive at rate ``a`` and are served at rate ``s`` (items per unit time) from a backlog
that starts at ``q0``; the backlog moves at ``a - s`` until it empties or reaches the capacity, where the policy
decides: ``block`` slows arrivals to the service rate, ``reject`` refuses the excess, ``drop_oldest`` evicts
it. The age of the item leaving at time t is the time it waited in that FIFO backlog. Arrival 4 / service 3
from 4 items grows by one per unit time; arrival 2 / service 3 drains in four.

For a real run (``python -m analysis.queue_lab <run dir>``): the arrival rate (fragments entering the queue
per second), the service rate (fragments the learner takes per second while it has work), the predicted
mean backlog and age, and Little's law (mean depth = arrival rate x mean time in the queue) against what the
run measured; with a learner stall (``chaos.stall_every_updates``) also how the depth and age rise during each
stall and recover after it.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, Optional

import numpy as np
import pandas as pd


def backlog(t: np.ndarray, arrival: float, service: float, q0: float, capacity: float = np.inf) -> np.ndarray:
    """Fluid backlog at times ``t``: q0 + (a - s) t, kept in [0, capacity] (at capacity the policy removes the
    excess: blocked, refused or evicted arrivals)."""
    return np.clip(q0 + (arrival - service) * np.asarray(t, float), 0.0, capacity)


def drain_time(arrival: float, service: float, q0: float) -> float:
    """When the backlog empties (inf if it never does)."""
    return q0 / (service - arrival) if service > arrival else float("inf")


def age_at_departure(t: np.ndarray, arrival: float, service: float, q0: float) -> np.ndarray:
    """Time in the queue of the item that leaves at time t (FIFO, unbounded fluid queue, q0 items present at 0,
    treated as having arrived at 0). While a backlog is left, the server has served s*t items; the item that
    leaves is the one at position s*t of the arrival order: one of the initial q0 (arrived at 0) or the arrival
    number s*t - q0, which came at (s*t - q0) / a."""
    t = np.asarray(t, float)
    served = service * t
    arrived_at = np.where(served <= q0, 0.0, (served - q0) / max(arrival, 1e-12))
    age = t - arrived_at
    empty = t >= drain_time(arrival, service, q0)
    return np.where(empty, 0.0, age)


def littles_law(mean_depth: float, arrival_rate: float, mean_age: float) -> Dict[str, float]:
    """L = lambda W: the depth the measured arrival rate and time in the queue imply, against the measured one."""
    implied = arrival_rate * mean_age
    return {"measured_mean_depth": mean_depth, "arrival_rate": arrival_rate, "measured_mean_age_s": mean_age,
            "littles_law_depth": implied, "ratio": mean_depth / implied if implied > 0 else float("nan")}


def run_check(run_dir: str | Path) -> Dict[str, object]:
    """Measured rates, the fluid prediction and Little's law for one run."""
    run_dir = Path(run_dir)
    m = pd.read_parquet(run_dir / "metrics.parquet")
    s = json.loads((run_dir / "summary.json").read_text())
    T = float(m["wall_time"].iloc[-1] - m["wall_time"].iloc[0])
    frags = float(m["transport/admitted_fragments"].iloc[-1] - m["transport/admitted_fragments"].iloc[0])
    arrival = frags / T if T > 0 else float("nan")
    compute = float(m["learner/compute_s"].sum()) if "learner/compute_s" in m else float("nan")
    need = float(s["transport"]["admitted_fragments"]) / max(1, int(s["updates"]))
    service = need * len(m) / compute if compute > 0 else float("nan")  # fragments per second of learner work
    out: Dict[str, object] = {"run_dir": str(run_dir), "arrival_rate": arrival, "service_rate": service,
                              "utilization": arrival / service if service > 0 else float("nan")}
    # the time-weighted mean depth: depth is sampled once per update; weight each sample by the time to the next
    w = np.diff(m["wall_time"].to_numpy(), append=m["wall_time"].iloc[-1])
    depth = float(np.average(m["transport/queue_depth"], weights=w)) if w.sum() > 0 else float("nan")
    out.update(littles_law(depth, arrival, float(m["transport/age_s_mean"].mean())))
    stall_every = (s.get("chaos") or {}).get("stalls", 0)
    if stall_every:
        out["stalls"] = stall_every
        out["max_depth"] = float(m["transport/queue_depth"].max())
        out["max_age_s"] = float(m["transport/age_s_max"].max())
    return out


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.queue_lab", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*", help="run dirs to check against the model")
    ap.add_argument("--arrival", type=float, default=4.0)
    ap.add_argument("--service", type=float, default=3.0)
    ap.add_argument("--q0", type=float, default=4.0)
    args = ap.parse_args(argv)
    t = np.arange(0, 9)
    print(f"fluid model: arrival {args.arrival:g}, service {args.service:g}, from {args.q0:g} items")
    print("t:       " + " ".join(f"{x:5.1f}" for x in t))
    print("backlog: " + " ".join(f"{x:5.1f}" for x in backlog(t, args.arrival, args.service, args.q0)))
    print("age out: " + " ".join(f"{x:5.2f}" for x in age_at_departure(t, args.arrival, args.service, args.q0)))
    print(f"drains at t = {drain_time(args.arrival, args.service, args.q0):g}")
    for r in args.runs:
        print(json.dumps(run_check(r), indent=2, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
