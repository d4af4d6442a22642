"""Queue lab: a fluid model of the bounded fragment queue, and a check of it (and of Little's law) against a
real run.

The fluid model: items arrive at rate ``a`` and are served at rate ``s`` (items per unit time) from a backlog
that starts at ``q0``; the backlog moves at ``a - s`` until it empties or reaches the capacity, where the policy
decides: ``block`` slows arrivals to the service rate, ``reject`` refuses the excess, ``drop_oldest`` evicts
it. The age of the item leaving at time t is the time it waited in that FIFO backlog. Arrival 4 / service 3
from 4 items grows by one per unit time; arrival 2 / service 3 drains in four.

The instrument (``python -m analysis.queue_lab --lab --out queue_lab.html``): a self-contained page with Reset, the arrival and
service rates, the prediction shown before running, Play and Step (analysis/queue_lab.html; no server, no network).
What the fluid model omits, the fixture shows (``python -m analysis.queue_lab --fixture --arrival 4 --service 3
--capacity 8 --policy drop_oldest``): the real :class:`laglab.transport.FragmentQueue` on a virtual clock, fed
discrete fragments from N actors at the same rates and served one fragment at a time by a learner that publishes
a version every ``--per-update`` fragments: capacity and its overflow policy, bytes, fragment ages and policy
lag, next to the fluid prediction.

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
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import pandas as pd

PAGE = Path(__file__).with_name("queue_lab.html")


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
    for f in ("metrics.parquet", "summary.json"):
        if not (run_dir / f).is_file():
            raise LabError(f"{run_dir}: no {f} (a run dir of train.py is expected)")
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


class LabError(ValueError):
    """A rate, capacity or count out of its range (the message names the option and the allowed range)."""


def _check(name: str, value: float, low: float, *, inclusive: bool = False, integer: bool = False) -> None:
    ok = np.isfinite(value) and (value >= low if inclusive else value > low)
    if integer and ok:
        ok = float(value) == int(value)
    if not ok:
        kind = "an integer" if integer else "a number"
        raise LabError(f"{name} must be {kind} {'>=' if inclusive else '>'} {low:g}, got {value:g}")


def write_lab(path: str | Path, q0: float = 4.0) -> Path:
    """Write the queue lab page (self-contained HTML: inline script and SVG, nothing fetched)."""
    _check("--q0", q0, 0, inclusive=True)
    path = Path(path)
    text = PAGE.read_text()
    line = "const Q0 = 4;"
    if line not in text:
        raise LabError(f"{PAGE} has no '{line}' line to set the initial items in")
    path.write_text(text.replace(line, f"const Q0 = {q0:g};", 1))
    return path


@dataclass
class Fixture:
    """What the fixture measured: ``samples`` (one row per sample time: depth, bytes, fluid backlog, counters),
    ``departures`` (one row per fragment the learner took: time, age, lag) and totals."""
    samples: pd.DataFrame
    departures: pd.DataFrame
    totals: Dict[str, float]


def _fragment(actor: int, seq: int, steps: int, version: int):
    from laglab.fragment import Fragment, FragmentId

    fid = FragmentId(actor_id=actor, incarnation=1, env_index=0, episode_id=0, episode_t0=0,
                     t_start=seq * steps, t_end=seq * steps + steps - 1, behavior_version=version)
    z = np.zeros(steps, np.float32)
    obs = np.zeros((steps, 4), np.float32)  # the tagged env's observation shape
    return Fragment(fid, obs, np.zeros(steps, np.int64), z, np.zeros(steps, bool), np.zeros(steps, bool), z, z,
                    np.zeros((0, 4), np.float32), z, np.zeros(4, np.float32))


MAX_EVENTS = 200_000  # arrivals plus service instants a fixture run may simulate (a bigger one is a mistake)


def run_fixture(arrival: float, service: float, q0: int = 4, horizon: float = 8.0, capacity: Optional[int] = None,
                max_bytes: Optional[int] = None, policy: str = "block", actors: int = 4, steps: int = 32,
                per_update: int = 1, dt: float = 0.25) -> Fixture:
    """Drive the real FragmentQueue in virtual time.

    ``q0`` fragments are in the queue at time 0; then fragment k arrives at k / arrival, from actor k mod
    ``actors``; the learner takes one fragment at each j / service (an empty queue wastes that service instant,
    as the fluid server idles) and publishes a new policy version after every ``per_update`` fragments. A
    fragment's behavior version is the version when it was made; its lag is the version when the learner takes
    it minus that. Simultaneous events: arrivals first. Under ``block`` an arrival that finds no room waits with
    its producer (FIFO) until a service makes room; when all ``actors`` producers wait, arrivals pause and resume
    1 / arrival after a producer is released (block slows arrivals to the service rate). Under ``reject`` and
    ``drop_oldest`` the queue's own policy refuses the new fragment or evicts the oldest.
    """
    from laglab.config import Overflow
    from laglab.transport import FragmentQueue

    _check("--arrival", arrival, 0)
    _check("--service", service, 0)
    _check("--q0", q0, 0, inclusive=True, integer=True)
    _check("--horizon", horizon, 0)
    if capacity is not None:
        _check("--capacity", capacity, 1, inclusive=True, integer=True)
    if (arrival + service) * horizon + q0 > MAX_EVENTS:
        raise LabError(f"(--arrival + --service) x --horizon + --q0 must be <= {MAX_EVENTS:,} events, got "
                       f"{(arrival + service) * horizon + q0:,.0f}: shorten the horizon or lower the rates")
    _check("--actors", actors, 1, inclusive=True, integer=True)
    _check("--steps", steps, 1, inclusive=True, integer=True)
    _check("--per-update", per_update, 1, inclusive=True, integer=True)
    _check("--dt", dt, 0)
    if policy not in {p.value for p in Overflow}:
        raise LabError(f"--policy must be one of {', '.join(p.value for p in Overflow)}, got {policy!r}")
    one = _fragment(0, 0, steps, 0).nbytes
    unbounded = capacity is None
    capacity = 2**62 if unbounded else capacity
    if max_bytes is None:
        max_bytes = 2**62 if unbounded else capacity * one
    _check("--max-bytes", max_bytes, 1, inclusive=True, integer=True)
    now = [0.0]
    q = FragmentQueue(int(capacity), int(max_bytes), Overflow(policy), clock=lambda: now[0])
    version, made, served_since = 0, 0, 0
    seq = [0] * int(actors)
    waiting: List = []  # (fragment, time it started waiting): blocked producers, in arrival order
    blocked_s = 0.0
    departures = []

    def make():
        nonlocal made
        actor = made % int(actors)
        f = _fragment(actor, seq[actor], int(steps), version)
        seq[actor] += 1
        made += 1
        return f

    def offer(f) -> None:
        if waiting or not q.try_put(f):  # FIFO: nobody passes a producer already waiting
            waiting.append((f, now[0]))

    for _ in range(int(q0)):
        offer(make())
    next_arrival, j = 1.0 / arrival, 1
    rows = []
    sample_t = 0.0

    def sample(t: float) -> None:
        rows.append({"t": t, "depth": q.depth, "bytes": q.bytes, "waiting_producers": len(waiting),
                     "made": made, "admitted": q.stats.put_fragments, "served": q.stats.got_fragments,
                     "dropped_steps": sum(q.stats.dropped_steps.values()),
                     "rejected_steps": sum(q.stats.rejected_steps.values()), "version": version,
                     "fluid_backlog": float(backlog(t, arrival, service, q0)),
                     "fluid_backlog_capped": float(backlog(t, arrival, service, q0, float(capacity)))})

    eps = 1e-9
    while True:
        next_service = j / service
        t_next = min(next_arrival, next_service)
        while sample_t <= horizon + eps and sample_t < t_next - eps:
            sample(round(sample_t, 9))
            sample_t += dt
        if t_next > horizon + eps:
            break
        now[0] = t_next
        if next_arrival <= next_service + eps:  # arrivals first on a tie
            if len(waiting) >= int(actors):
                next_arrival = float("inf")  # every producer waits: arrivals pause until a release
            else:
                offer(make())
                next_arrival = t_next + 1.0 / arrival
            continue
        j += 1
        got = q.get(0)
        if got is not None:
            f, _, age = got
            departures.append({"t": t_next, "age": age, "lag": version - f.id.behavior_version,
                               "actor": f.id.actor_id, "fluid_age": float(age_at_departure(np.array([t_next]),
                                                                                            arrival, service, q0)[0])})
            served_since += 1
            if served_since == int(per_update):
                version, served_since = version + 1, 0
        released = False
        while waiting and q.try_put(waiting[0][0]):
            blocked_s += now[0] - waiting.pop(0)[1]
            released = True
        if released and next_arrival == float("inf"):
            next_arrival = now[0] + 1.0 / arrival
    dep = pd.DataFrame(departures, columns=["t", "age", "lag", "actor", "fluid_age"])
    totals = {"made": made, "admitted": q.stats.put_fragments, "served": q.stats.got_fragments,
              "depth_end": q.depth, "max_depth": q.stats.max_depth, "max_bytes": q.stats.max_bytes,
              "bytes_per_fragment": one, "dropped_fragments": sum(q.stats.dropped_steps.values()) // steps,
              "rejected_fragments": sum(q.stats.rejected_steps.values()) // steps,
              "waiting_producers_end": len(waiting), "blocked_s": blocked_s,
              "age_mean": float(dep["age"].mean()) if len(dep) else float("nan"),
              "age_max": float(dep["age"].max()) if len(dep) else float("nan"),
              "lag_mean": float(dep["lag"].mean()) if len(dep) else float("nan"),
              "lag_max": float(dep["lag"].max()) if len(dep) else float("nan"),
              "versions": version}
    return Fixture(pd.DataFrame(rows), dep, totals)
def plot_fixture(fx: Fixture, out: str | Path, title: str) -> Path:
    """Depth against the fluid prediction, and each departure's age and lag against the fluid age."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sm, dep = fx.samples, fx.departures
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
    ax[0].step(sm["t"], sm["depth"], where="post", label="FragmentQueue depth (fragments)", color="#c05621")
    ax[0].plot(sm["t"], sm["fluid_backlog"], "--", color="#2b6cb0", label="fluid prediction (no capacity)")
    if (sm["fluid_backlog_capped"] != sm["fluid_backlog"]).any():
        ax[0].plot(sm["t"], sm["fluid_backlog_capped"], ":", color="#2b6cb0", label="fluid, capped at capacity")
    if sm["waiting_producers"].any():
        ax[0].step(sm["t"], sm["waiting_producers"], where="post", color="#718096", label="producers blocked")
    ax[0].set(xlabel="time (units)", ylabel="items", title="backlog")
    ax[0].legend(fontsize=8, loc="upper left")
    if len(dep):
        ax[1].plot(dep["t"], dep["age"], "o", color="#c05621", ms=4, label="fragment age on leaving")
        ax[1].plot(dep["t"], dep["fluid_age"], "--", color="#2b6cb0", label="fluid age (FIFO, no capacity)")
        ax[2].plot(dep["t"], dep["lag"], "o", color="#c05621", ms=4)
    ax[1].set(xlabel="time (units)", ylabel="time in the queue (units)", title="age of the fragment leaving")
    ax[1].legend(fontsize=8, loc="upper left")
    ax[2].set(xlabel="time (units)", ylabel="versions behind", title="policy lag of the fragment leaving")
    fig.suptitle(title)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.queue_lab", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*", help="run dirs to check against the model")
    ap.add_argument("--arrival", type=float, default=4.0, help="items per unit time (default 4)")
    ap.add_argument("--service", type=float, default=3.0, help="items per unit time (default 3)")
    ap.add_argument("--q0", type=float, default=4.0, help="items at time 0 (default 4)")
    ap.add_argument("--lab", action="store_true", help="write the queue lab page (to --out, default queue_lab.html)")
    ap.add_argument("--fixture", action="store_true", help="drive the real FragmentQueue at these rates")
    ap.add_argument("--horizon", type=float, default=8.0, help="fixture: time units to run (default 8)")
    ap.add_argument("--capacity", type=int, default=None, help="fixture: queue capacity in fragments (default: "
                                                                 "unbounded, as the fluid model)")
    ap.add_argument("--max-bytes", type=int, default=None, help="fixture: queue byte bound (default: capacity x "
                                                                  "one fragment's bytes)")
    ap.add_argument("--policy", default="block", help="fixture: block, reject or drop_oldest (default block)")
    ap.add_argument("--actors", type=int, default=4, help="fixture: producers (default 4)")
    ap.add_argument("--steps", type=int, default=32, help="fixture: transitions per fragment (default 32)")
    ap.add_argument("--per-update", type=int, default=1, help="fixture: fragments per learner update (default 1)")
    ap.add_argument("--out", help="--lab: the page's path (default queue_lab.html); --fixture: the figure (PNG)")
    ap.add_argument("--json", action="store_true", help="fixture: print the totals and samples as JSON")
    args = ap.parse_args(argv)
    try:
        if args.out and not Path(args.out).resolve().parent.is_dir():
            raise LabError(f"--out {args.out}: its directory does not exist")
        if args.lab:
            page = write_lab(args.out or "queue_lab.html", args.q0)
            print(f"queue lab: {page} (open it in a browser; nothing is fetched)")
            return 0
        if args.fixture:
            return _fixture_main(args)
        _check("--arrival", args.arrival, 0)
        _check("--service", args.service, 0)
        _check("--q0", args.q0, 0, inclusive=True)
    except LabError as e:
        print(f"queue_lab: {e}", file=sys.stderr)
        return 2
    if args.runs:  # run dirs: their checks alone, as JSON (one object, or a list for several)
        try:
            checks = [run_check(r) for r in args.runs]
        except LabError as e:
            print(f"queue_lab: {e}", file=sys.stderr)
            return 2
        print(json.dumps(checks[0] if len(checks) == 1 else checks, indent=2, default=float))
        return 0
    t = np.arange(0, 9)
    print(f"fluid model: arrival {args.arrival:g}, service {args.service:g}, from {args.q0:g} items")
    print("t:       " + " ".join(f"{x:5.1f}" for x in t))
    print("backlog: " + " ".join(f"{x:5.1f}" for x in backlog(t, args.arrival, args.service, args.q0)))
    print("age out: " + " ".join(f"{x:5.2f}" for x in age_at_departure(t, args.arrival, args.service, args.q0)))
    print(f"drains at t = {drain_time(args.arrival, args.service, args.q0):g}")
    return 0


def _fixture_main(args) -> int:
    fx = run_fixture(args.arrival, args.service, q0=args.q0, horizon=args.horizon, capacity=args.capacity,
                     max_bytes=args.max_bytes, policy=args.policy, actors=args.actors, steps=args.steps,
                     per_update=args.per_update)
    if args.json:  # strict JSON: a figure that does not exist (nothing served yet) is null
        clean = lambda v: None if isinstance(v, float) and not np.isfinite(v) else v  # noqa: E731
        print(json.dumps({"totals": {k: clean(v) for k, v in fx.totals.items()},
                          "samples": fx.samples.to_dict("list"), "departures": fx.departures.to_dict("list")},
                         default=float))
        return 0
    cap = "unbounded" if args.capacity is None else f"capacity {args.capacity}, policy {args.policy}"
    title = (f"FragmentQueue fixture: arrival {args.arrival:g}, service {args.service:g}, from {args.q0:g}, "
             f"{cap}, {args.actors} actors")
    print(title)
    whole = fx.samples[np.isclose(fx.samples["t"] % 1, 0) | np.isclose(fx.samples["t"] % 1, 1)]
    print(whole[["t", "depth", "fluid_backlog", "bytes", "waiting_producers", "made", "served", "dropped_steps",
                 "rejected_steps", "version"]].to_string(index=False))
    tot = fx.totals
    print(f"fragments made {tot['made']}, admitted {tot['admitted']}, served {tot['served']}, dropped "
          f"{tot['dropped_fragments']}, rejected {tot['rejected_fragments']}, still waiting to enter "
          f"{tot['waiting_producers_end']}; max depth {tot['max_depth']} ({tot['max_bytes']:,} bytes, "
          f"{tot['bytes_per_fragment']:,} per fragment); age on leaving mean {tot['age_mean']:.2f} max "
          f"{tot['age_max']:.2f}; lag mean {tot['lag_mean']:.2f} max {tot['lag_max']:g} versions")
    if args.out:
        print(f"figure: {plot_fixture(fx, args.out, title)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
