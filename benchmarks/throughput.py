"""Throughput of the runners side by side, in one invocation on one machine: env steps per second of sync,
thread and process with 2 and 4 actors on CartPole (the default run) and HalfCheetah (a short budget), the
process runner's overhead against the ideal on the latency env, heterogeneous env latencies against sync,
where each actor's time goes (env, inference, throttle, blocked, snapshot copies), and runner=ray next to
runner=process with the Ray path's own cost per fragment.

    python benchmarks/throughput.py [--repeats 1] [--only cartpole,halfcheetah,latency,hetero,ray] [--out DIR]
                                    [--cartpole-steps N] [--halfcheetah-steps N] [--set KEY=VALUE ...]

CartPole and HalfCheetah also run the default process run (what a user gets without ``actors=``), repeats
interleaved, and print each run's fraction of the machine's ceiling: min(cores, actors + 1) x the sync runner's
SPS (the sync runner steps and learns on one core; an asynchronous run can at best do that on every core), and the
learner-bound estimate: with one serial learner, an asynchronous run can hide the sync run's acting behind
learning, not the learning, so it gains about wall / (wall - acting) of the sync run (acting: the time the sync
run's learner waited, less its time taking fragments in).

Each run is its own process (`python train.py ...`), W&B off; SPS is summary.json's `sps`: env steps over the
run's wall time from the moment its runner starts (the actors' start is in it; the process's interpreter, imports,
config and learner before it, ~1.3-1.4 s here, are not: `benchmarks/startup.py` times those). Prints markdown tables with ratios against the best in-process
runner (sync or thread) measured in the same invocation.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
EVERY_RUN: List[str] = []  # --set


def train(out: Path, name: str, overrides: List[str]) -> Dict[str, object]:
    run_dir = out / "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
    cmd = [sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={run_dir}", "tracking.wandb.mode=disabled",
           "tracking.console_every_s=1e9", "tracking.progress=false", *EVERY_RUN, *overrides]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{p.stderr[-3000:]}")
    s = json.loads((run_dir / "summary.json").read_text())
    a = pd.read_parquet(run_dir / "actors.parquet").groupby("actor").last()
    m = pd.read_parquet(run_dir / "metrics.parquet")
    wall = float(s["wall_time_s"])
    share = {k: float(a[k].mean()) / wall for k in ("env_s", "infer_s", "throttle_s", "blocked_s", "snapshot_s")
             if k in a}
    return {"name": name, "sps": float(s["sps"]), "wall": wall, "final": s["final_return_mean"], "actors": s["actors"],
            "runner": s["runner"],
            "lag": float(m["lag/mean"].mean()), "learner_wait": float(m["learner/wait_frac"].iloc[-1]),
            "wait_s": float(m["learner/wait_s"].sum()), "offer_s": float(m["learner/offer_s"].sum()), **share}


def learner_bound(sync_run: Dict[str, object]) -> float:
    """An estimate of the most an asynchronous run can gain over the sync run ``sync_run`` while its learner stays
    one serial thread (torch threads as in the sync run): it can hide the sync run's acting behind learning, not the
    learning, nor taking the fragments in (admission, books, staging: ``offer_s``, inside the sync learner's wait).
    acting = wait - offer; wall / (wall - acting), as a ratio to the sync run's SPS. Not a bound: an asynchronous
    learner's updates may run slower beside busy actors, or faster without the acting's cache traffic."""
    wall, acting = float(sync_run["wall"]), float(sync_run["wait_s"]) - float(sync_run["offer_s"])
    return wall / max(wall - acting, 1e-9)


def cores() -> int:
    """CPUs this process may use: what ``actors=auto`` counts (laglab.config.usable_cpus: the affinity, capped by a
    cgroup's CPU quota), not the machine's count."""
    if str(ROOT / "platform") not in sys.path:
        sys.path.insert(0, str(ROOT / "platform"))  # (this checkout's laglab)
    from laglab.config import usable_cpus

    return usable_cpus()


def ceiling(sync_sps: float, processes: int) -> float:
    """An estimate of the machine's limit for a run of ``processes`` busy processes (actors + learner): each core
    can do what the synchronous runner does on one core (it steps the envs and learns in one thread), so
    min(cores, processes) x sync SPS. An upper bound, not a promise: the learner is one serial thread, so a run
    whose learning alone takes longer than its env stepping cannot reach it; cores are this process's affinity capped
    by a cgroup's quota (not the load), and every SPS includes the actors' start (not the process's imports)."""
    return min(cores(), processes) * sync_sps


def table(rows: List[Dict[str, object]], base: float, sync_sps: float = 0.0) -> None:
    """``sync_sps``: the per-core rate for the ceiling column (0: no such column)."""
    print("| run | SPS | x best in-process | " + ("of the ceiling | " if sync_sps else "") + "final return | mean lag "
          "| learner waiting | actor time: env / infer / throttle / blocked / snapshot |")
    print("| --- | --- | --- | " + ("--- | " if sync_sps else "") + "--- | --- | --- | --- |")
    for r in rows:
        of = ""
        if sync_sps:
            procs = 1 if " sync " in r["name"] else int(r["actors"]) + 1
            of = f"{r['sps'] / ceiling(sync_sps, procs):.2f} | "
        print(f"| {r['name']} | {r['sps']:,.0f} | {r['sps'] / base:.2f} | {of}{r['final']:.1f} | {r['lag']:.2f} | "
              f"{r['learner_wait']:.0%} | {r['env_s']:.0%} / {r['infer_s']:.0%} / {r['throttle_s']:.0%} / "
              f"{r['blocked_s']:.0%} / {r['snapshot_s']:.0%} |")


def median_run(out: Path, name: str, overrides: List[str], repeats: int) -> Dict[str, object]:
    return median_of(name, [train(out, f"{name}-r{i}", overrides) for i in range(repeats)])


def actors_overridden() -> bool:
    """An ``--set actors=...`` makes the 'default' run another config than the explicit runs."""
    return any(x.split("=", 1)[0].lstrip("+") == "actors" for x in EVERY_RUN)


def median_of(name: str, runs: List[Dict[str, object]]) -> Dict[str, object]:
    """SPS: the median of the repeats (for an even count the mean of the middle two); the other columns: the run
    at the lower middle."""
    repeats = len(runs)
    runs = sorted(runs, key=lambda r: r["sps"])
    r = dict(runs[(len(runs) - 1) // 2])
    r["sps"] = statistics.median(float(x["sps"]) for x in runs)
    r["name"] = name
    if repeats > 1:
        r["name"] += f" (median of {repeats}: " + ", ".join(f"{x['sps']:,.0f}" for x in runs) + ")"
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--only", default="cartpole,halfcheetah,latency,hetero,ray")
    ap.add_argument("--halfcheetah-steps", type=int, default=100_000)
    ap.add_argument("--cartpole-steps", type=int, default=None,
                    help="CartPole's budget in its runner table (default: the preset's 200k; longer runs are less "
                         "noisy; the ray table keeps 200k)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an override for every run (e.g. --set learner.backend=torch: the update by autograd)")
    args = ap.parse_args()
    EVERY_RUN.extend(args.set)
    out = args.out or Path(tempfile.mkdtemp(prefix="laglab-throughput-"))
    only = set(args.only.split(","))
    print(f"(run dirs under {out}; every run: {' '.join(EVERY_RUN) or 'the defaults'})\n")
    cartpole = [f"total_env_steps={args.cartpole_steps}"] if args.cartpole_steps else []
    for task, extra in [("cartpole", cartpole), ("halfcheetah", ["env=halfcheetah",
                                                           f"total_env_steps={args.halfcheetah_steps}"])]:
        if task not in only:
            continue
        runs = [(f"{task} {runner} a{actors}", [f"runner={runner}", f"actors={actors}"])
                for runner in ("sync", "thread", "process") for actors in (2, 4)]
        runs.append((f"{task} process default", []))  # what a user gets: the default runner and actor count
        reps: Dict[str, List[Dict[str, object]]] = {name: [] for name, _ in runs}
        for i in range(args.repeats):  # interleaved: drift in the machine spreads over every contender
            for name, over in runs:
                reps[name].append(train(out, f"{name}-r{i}", [*over, *extra]))
        rows = [median_of(name, reps[name]) for name, _ in runs]
        base = max(r["sps"] for r in rows if " process " not in r["name"])
        sync_sps = max(r["sps"] for r in rows if " sync " in r["name"])
        print(f"### {task} ({cores()} cores: the ceiling is min(cores, actors + 1) x the best sync SPS, "
              f"{sync_sps:,.0f})\n")
        table(rows, base, sync_sps)
        best_p = max(r["sps"] for r in rows if " process " in r["name"])
        default = rows[-1]
        best_sync = max((r for r in rows if " sync " in r["name"]), key=lambda r: r["sps"])
        bound = learner_bound(best_sync)
        print(f"\nbest process / best in-process: **{best_p / base:.2f}x**; the default run "
              f"({default['actors']} actors) / sync: **{default['sps'] / sync_sps:.2f}x**, "
              f"{default['sps'] / ceiling(sync_sps, int(default['actors']) + 1):.2f} of the ceiling; "
              f"learner-bound estimate {bound:.2f}x sync (the sync run acted {best_sync['wait_s'] - best_sync['offer_s']:.1f} s "
              f"of {best_sync['wall']:.1f}: what an asynchronous run can hide behind learning), the default run "
              f"reaches {default['sps'] / (bound * sync_sps):.2f} of it")
        # the default run's config named explicitly: the same runner and actor count, nothing else set for every run
        same = f"{task} {default['runner']} a{default['actors']}"
        if same in reps and not actors_overridden():
            pooled = sorted(float(r["sps"]) for r in reps[same] + reps[f"{task} process default"])
            mid = statistics.median(pooled)
            print(f"pooled: the default run and '{same}' are one config here: the median of their {len(pooled)} runs, "
                  f"{mid:,.0f} SPS, is **{mid / sync_sps:.2f}x** sync (single runs: "
                  f"{pooled[0] / sync_sps:.2f}-{pooled[-1] / sync_sps:.2f}x)")
        else:
            print(f"(not pooled: the default run ({default['runner']}, {default['actors']} actors) has no explicit twin "
                  "here)")
        print()
    if "latency" in only:
        rows = []
        for actors in (2, 4):
            ideal = actors * 1000.0 / 2.0
            r = median_run(out, f"latency [2] ms process a{actors}", ["env=latency", "env.latency_ms=[2]",
                                                                      "runner=process", f"actors={actors}"],
                           args.repeats)
            r["ideal"] = ideal
            rows.append(r)
        print("### latency env, uniform 2 ms per step (process runner against the ideal sum of 1000/latency)\n")
        print("| run | SPS | ideal | SPS / ideal |")
        print("| --- | --- | --- | --- |")
        for r in rows:
            print(f"| {r['name']} | {r['sps']:,.0f} | {r['ideal']:,.0f} | {r['sps'] / r['ideal']:.2f} |")
        print()
    if "hetero" in only:
        rows = [median_run(out, f"latency [1,2,4,8] ms {runner} a4", ["env=latency", "env.latency_ms=[1,2,4,8]",
                                                                       "total_env_steps=20480",
                                                                       f"runner={runner}", "actors=4"], args.repeats)
                for runner in ("sync", "thread", "process")]
        ideal = sum(1000.0 / x for x in (1, 2, 4, 8))
        print(f"### heterogeneous latencies 1, 2, 4, 8 ms (4 actors; ideal {ideal:,.0f} SPS)\n")
        table(rows, rows[0]["sps"])
        print(f"\nprocess / sync: **{rows[2]['sps'] / rows[0]['sps']:.2f}x**; process / ideal: "
              f"{rows[2]['sps'] / ideal:.2f}\n")
    if "ray" in only:
        rows = [median_run(out, f"cartpole {runner} a{actors} (ray table)", [f"runner={runner}", f"actors={actors}"],
                           args.repeats)
                for actors in (2, 4) for runner in ("process", "ray")]
        print("### runner=ray next to runner=process, CartPole default (a local Ray instance, started by the run)\n")
        table(rows, max(r["sps"] for r in rows if " process " in r["name"]))
        print("\n(ratios against the best process run)\n")
        ray_path_overhead()


def ray_path_overhead(calls: int = 200) -> None:
    """The Ray path alone: a Ray actor answers ``rollout``-shaped calls with one real CartPole rollout's report
    (8 fragments of 32 steps), no env stepping, so the time per call is Ray's: the call, serializing the
    arrays into the reply, and the learner-side rebuilding of the fragments."""
    import time

    import numpy as np
    import ray
    from omegaconf import OmegaConf

    sys.path.insert(0, str(ROOT / "platform"))
    from laglab.actor import Actor
    from laglab.config import Config, validate
    from laglab.learner import Learner
    from laglab.run import env_spec
    from laglab.runners.ray import local_instance
    from laglab.runners.ray_actor import from_wire, to_wire

    cfg = validate(OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.create({"actors": 1})))
    actor = Actor(cfg, 0, 1)
    actor.load(Learner(cfg, env_spec(cfg)).snapshot())
    frags = actor.collect().fragments
    report = {"fragments": [to_wire(f) for f in frags], "sent": np.zeros((len(frags), 2), np.int64)}
    nbytes = sum(f.nbytes for f in frags)

    @ray.remote
    class Echo:
        def __init__(self, rep):
            self.rep = rep

        def rollout(self):
            return self.rep

    with local_instance():  # (its session in a directory of laglab's, removed at the end, as a run's)
        e = Echo.remote(report)
        ray.get(e.rollout.remote())
        t0 = time.perf_counter()
        for _ in range(calls):
            res = ray.get(e.rollout.remote())
            [from_wire(x) for x in res["fragments"]]
        dt = (time.perf_counter() - t0) / calls
    print("### the Ray path alone (one CartPole rollout report per call, 8 fragments of 32 steps)\n")
    print("| per call | per fragment | bytes per fragment (arrays, copied once into the reply) |")
    print("| --- | --- | --- |")
    print(f"| {dt * 1e6:,.0f} us | {dt * 1e6 / len(frags):,.0f} us | {nbytes / len(frags):,.0f} |\n")


if __name__ == "__main__":
    main()
