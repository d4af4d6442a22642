"""What ``actors=auto`` should pick: env steps per second of the process and thread runners against the actor
count, on 1 CPU and on every CPU of this machine (the CPU count is the process's affinity, set per run with
``os.sched_setaffinity`` as ``taskset`` does), with the count ``actors=auto`` picks beside the fastest one.

    python benchmarks/actors_auto.py [--repeats 3] [--tasks cartpole,halfcheetah] [--actors 1,2,3,4,6,8] [--cpus 1,all]

Each run is its own process (``python train.py``, W&B off); SPS is summary.json's ``sps`` (start-up included),
the median of ``--repeats`` runs interleaved over every contender so that drift spreads over all of them. A pick
is good when its SPS is within noise of the fastest count's (the table prints the ratio, and the fewest actors within
5% of the fastest). Throughput is half of what "fastest" means: more actors also mean more policy lag; the
actors-knee study
(reports/actors_knee_cartpole) measures what that costs per env step and in time to a solved CartPole.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

from throughput import ROOT, median_of, train

sys.path.insert(0, str(ROOT / "platform"))
from laglab.config import auto_actors, usable_cpus  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tasks", default="cartpole,halfcheetah")
    ap.add_argument("--actors", default="1,2,3,4,6,8")
    ap.add_argument("--runners", default="process,thread")
    ap.add_argument("--cartpole-steps", type=int, default=100_000)
    ap.add_argument("--halfcheetah-steps", type=int, default=30_000)
    ap.add_argument("--cpus", default="1,all", help="the CPU sets: 1 (one CPU), all (every usable CPU), or both")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="laglab-actors-auto-"))
    mine = sorted(os.sched_getaffinity(0))
    want = set(a.cpus.split(","))
    cpu_sets = ([tuple(mine[:1])] if "1" in want else []) + ([tuple(mine)] if len(mine) > 1 and "all" in want else [])
    counts = [int(x) for x in a.actors.split(",")]
    extra = {"cartpole": [f"total_env_steps={a.cartpole_steps}"],
             "halfcheetah": ["env=halfcheetah", f"total_env_steps={a.halfcheetah_steps}"]}
    print(f"(run dirs under {out}; this process may use CPUs {mine})\n")
    for task in a.tasks.split(","):
        cells = [(cpus, runner, n) for cpus in cpu_sets for runner in a.runners.split(",") for n in counts]
        reps: Dict[tuple, List[Dict[str, object]]] = {c: [] for c in cells}
        for i in range(a.repeats):  # interleaved
            for cpus, runner, n in cells:
                os.sched_setaffinity(0, cpus)  # the child inherits it; usable_cpus() there reads it back
                try:
                    r = train(out, f"{task}-c{len(cpus)}-{runner}-a{n}-r{i}",
                              [f"runner={runner}", f"actors={n}", *extra[task]])
                finally:
                    os.sched_setaffinity(0, mine)
                reps[(cpus, runner, n)].append(r)
        print(f"### {task}\n")
        print("| CPUs | runner | " + " | ".join(f"a{n}" for n in counts)
              + " | fastest | fewest within 5% of it | auto picks | auto / fastest |")
        print("| --- | --- | " + " | ".join("---" for _ in counts) + " | --- | --- | --- | --- |")
        for cpus in cpu_sets:
            for runner in a.runners.split(","):
                sps = {n: median_of("", reps[(cpus, runner, n)])["sps"] for n in counts}
                best = max(sps, key=sps.get)
                fewest = min(n for n in counts if sps[n] >= 0.95 * sps[best])  # (fewer actors: less policy lag)
                pick = auto_actors(runner, len(cpus))
                have = sps.get(pick)
                ratio = f"{have / sps[best]:.2f}" if have is not None else "(not measured)"
                print(f"| {len(cpus)} | {runner} | " + " | ".join(f"{sps[n]:,.0f}" for n in counts)
                      + f" | a{best} | a{fewest} | a{pick} | {ratio} |")
        print()
    print(f"(this machine: {usable_cpus()} usable CPUs; actors=auto here: process "
          f"{auto_actors('process', usable_cpus())}, thread {auto_actors('thread', usable_cpus())})")


if __name__ == "__main__":
    main()
