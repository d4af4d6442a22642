"""What the process runner's actor niceness (``runner.actor_nice``) buys on a quiet machine and costs on a busy
one: the default run at nice 19 / 10 / 5 / 0 beside the sync runner, on CartPole and HalfCheetah, first on the
quiet machine, then with busy processes (one per usable CPU, ``while True: pass``) started from this benchmark's
own session — as a job started from the same shell would be — and, with ``--other-session``, from sessions of
their own (where Linux groups processes by session, its autogroup, those share the CPUs with the run's session
as a whole and the actors' niceness no longer decides).

    python benchmarks/actor_nice.py [--repeats 3] [--loaded-repeats 1] [--other-session] [--out DIR]

Each run is ``python train.py`` (W&B off), repeats interleaved; SPS is summary.json's (from the runner's start).
The loaded runs are short (the starved ones take ~20x longer): 40k CartPole steps, 20k HalfCheetah steps, so
their start weighs more in their SPS. Prints per task a table of median SPS and ratios to sync, and each loaded
run's ``cpu`` verdict (summary.json: the actors' waits for a CPU).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import train  # noqa: E402 - the same run helper and SPS definition

NICES = (19, 10, 5, 0)
TASKS = {"cartpole": ([], ["total_env_steps=40000"]),
         "halfcheetah": (["env=halfcheetah", "total_env_steps=100000"], ["env=halfcheetah", "total_env_steps=20000"])}


def busy(n: int, own_session: bool) -> List[subprocess.Popen]:
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=own_session)
             for _ in range(n)]
    time.sleep(0.5)
    return procs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="quiet runs per arm")
    ap.add_argument("--loaded-repeats", type=int, default=1, help="runs per arm under busy processes")
    ap.add_argument("--other-session", action="store_true", help="also with the busy processes in sessions of "
                                                                  "their own")
    ap.add_argument("--only", default="cartpole,halfcheetah")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="laglab-actor-nice-"))
    cpus = len(os.sched_getaffinity(0))
    arms = [(f"process nice {n}", [f"runner.actor_nice={n}"]) for n in NICES] + [("sync", ["runner=sync"])]
    modes = [("quiet", a.repeats, None)] + [("busy, same session", a.loaded_repeats, False)]
    if a.other_session:
        modes.append(("busy, own sessions", a.loaded_repeats, True))
    print(f"(run dirs under {out}; {cpus} CPUs; load average at start {os.getloadavg()[0]:.2f})\n")
    for task in a.only.split(","):
        quiet_ovs, loaded_ovs = TASKS[task]
        for mode, reps, own in modes:
            sps: Dict[str, List[float]] = {name: [] for name, _ in arms}
            verdicts: Dict[str, List[str]] = {name: [] for name, _ in arms}
            for r in range(reps):
                for name, ovs in arms:
                    hogs = busy(cpus, own) if own is not None else []
                    try:
                        tag = "".join(c if c.isalnum() else "_" for c in f"{task}-{mode}-{name}-r{r}")
                        x = train(out, tag, [*ovs, *(quiet_ovs if own is None else loaded_ovs)])
                    finally:
                        for h in hogs:
                            h.kill()
                            h.wait()
                    sps[name].append(float(x["sps"]))
                    c = json.loads((out / tag / "summary.json").read_text()).get("cpu") or {}
                    if c:
                        verdicts[name].append(f"{c['actors_wait_frac']:.0%}{' starved' if c['starved'] else ''}")
            base = statistics.median(sps["sync"])
            print(f"### {task}, {mode} ({reps} run{'s' if reps > 1 else ''} per arm)\n")
            print("| run | SPS (median) | x sync | runs | actors' CPU wait |")
            print("| --- | --- | --- | --- | --- |")
            for name, _ in arms:
                med = statistics.median(sps[name])
                print(f"| {name} | {med:,.0f} | {med / base:.2f} | {', '.join(f'{v:,.0f}' for v in sps[name])} | "
                      f"{', '.join(verdicts[name]) or '-'} |")
            print()
    print(f"load average at end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
