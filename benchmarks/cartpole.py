"""CartPole-v1 side by side: laglab's default run with the thread, process and sync runners, and
Stable-Baselines3 PPO (defaults, 4 envs; needs the `bench` extra), measured in one invocation on the same
machine.

    python benchmarks/cartpole.py --seeds 0 1 2 3 4 [--runners thread process sync] [--no-sb3] [--budget 200000]
                                  [-- extra overrides]

For each run: wall seconds and env steps until the rolling mean of the last 20 finished episodes first
reaches 475, env steps per wall second, and the final rolling-20 return. Each run is its own process, timed
from the start of training (imports excluded) for every contender alike. Prints a markdown table and the
ratios laglab / SB3 on the same seed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
THRESHOLD = 475.0
WINDOW = 20


def first_reach(episodes: pd.DataFrame) -> Dict[str, Optional[float]]:
    """First (wall_time, env_steps) at which the mean of the last WINDOW finished episodes >= THRESHOLD."""
    ep = episodes.sort_values("wall_time", kind="stable").reset_index(drop=True)
    rolling = ep["return"].rolling(WINDOW).mean()
    hit = ep[rolling >= THRESHOLD]
    if hit.empty:
        return {"t475": None, "steps475": None}
    return {"t475": float(hit["wall_time"].iloc[0]), "steps475": float(hit["env_steps"].iloc[0])}


def run_laglab(seed: int, runner: str, budget: int, extra: List[str], out: Path) -> Dict[str, object]:
    run_dir = out / f"laglab-{runner}-s{seed}"
    cmd = [sys.executable, str(ROOT / "train.py"), f"seed={seed}", f"runner={runner}", f"total_env_steps={budget}",
           f"hydra.run.dir={run_dir}", "tracking.console_every_s=1e9", *extra]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
    s = json.loads((run_dir / "summary.json").read_text())
    res = {"who": f"laglab {runner}", "seed": seed, "sps": s["sps"], "final": s["final_return_mean"],
           "wall": s["wall_time_s"], "steps": s["env_steps"]}
    res.update(first_reach(pd.read_parquet(run_dir / "episodes.parquet")))
    return res


SB3_SCRIPT = r"""
import json, sys, time
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.callbacks import BaseCallback
seed, budget, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rows = []
class Log(BaseCallback):
    def _on_step(self):
        for info in self.locals["infos"]:
            if "episode" in info:
                rows.append({"wall_time": time.perf_counter() - t0, "env_steps": self.num_timesteps,
                             "return": float(info["episode"]["r"])})
        return True
env = make_vec_env("CartPole-v1", n_envs=4, seed=seed)
model = PPO("MlpPolicy", env, seed=seed, device="cpu")
t0 = time.perf_counter()
model.learn(total_timesteps=budget, callback=Log())
wall = time.perf_counter() - t0
json.dump({"rows": rows, "wall": wall, "steps": model.num_timesteps}, open(out, "w"))
"""


def run_sb3(seed: int, budget: int, out: Path) -> Dict[str, object]:
    path = out / f"sb3-s{seed}.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, "-c", SB3_SCRIPT, str(seed), str(budget), str(path)], check=True, env=env,
                   capture_output=True)
    d = json.loads(path.read_text())
    ep = pd.DataFrame(d["rows"])
    res = {"who": "sb3 ppo", "seed": seed, "sps": d["steps"] / d["wall"], "wall": d["wall"], "steps": d["steps"],
           "final": float(ep["return"].tail(WINDOW).mean())}
    res.update(first_reach(ep))
    return res


def fmt(x: Optional[float], nd: int = 1) -> str:
    return "—" if x is None else f"{x:,.{nd}f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--budget", type=int, default=200_000)
    ap.add_argument("--no-sb3", action="store_true")
    ap.add_argument("--runners", nargs="+", default=["thread", "process", "sync"])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for the laglab runs")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="laglab-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    try:
        import stable_baselines3  # noqa: F401
        have_sb3 = not args.no_sb3
    except ImportError:
        have_sb3 = False
        print("(stable-baselines3 not installed: pip install -e '.[bench]' to compare against it)")
    rows = []
    for seed in args.seeds:
        for runner in args.runners:
            rows.append(run_laglab(seed, runner, args.budget, args.overrides, out))
        if have_sb3:
            rows.append(run_sb3(seed, args.budget, out))
        for r in rows[-(len(args.runners) + (1 if have_sb3 else 0)):]:
            print(f"  seed {seed} {r['who']:<14} t475={fmt(r['t475'])}s steps475={fmt(r['steps475'], 0)} "
                  f"sps={r['sps']:,.0f} final={r['final']:.1f}", flush=True)
    df = pd.DataFrame(rows)
    df.to_csv(out / "results.csv", index=False)
    print(f"\nCartPole-v1, budget {args.budget:,} env steps, threshold {THRESHOLD:g} (rolling {WINDOW}); "
          f"raw results: {out / 'results.csv'}\n")
    print("| who | seed | time to 475 (s) | env steps to 475 | SPS | final return (last 20) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['who']} | {r['seed']} | {fmt(r['t475'])} | {fmt(r['steps475'], 0)} | {r['sps']:,.0f} | "
              f"{r['final']:.1f} |")
    print()
    for who, g in df.groupby("who", sort=False):
        t = [x for x in g["t475"] if x == x and x is not None]
        print(f"{who}: median time to 475 {fmt(statistics.median(t)) if t else '—'} s "
              f"({len(t)}/{len(g)} seeds reached), median SPS {statistics.median(g['sps']):,.0f}, "
              f"seeds with final >= 475: {(g['final'] >= THRESHOLD).sum()}/{len(g)}")
    if have_sb3:
        print("\nratios on the same seed (laglab thread / SB3): time to 475, SPS")
        for seed in args.seeds:
            a = df[(df.who == "laglab thread") & (df.seed == seed)].iloc[0]
            b = df[(df.who == "sb3 ppo") & (df.seed == seed)].iloc[0]
            tr = (a.t475 / b.t475) if (a.t475 == a.t475 and b.t475 == b.t475 and a.t475 and b.t475) else None
            print(f"  seed {seed}: time {fmt(tr, 2)}, sps {a.sps / b.sps:.2f}")


if __name__ == "__main__":
    main()
