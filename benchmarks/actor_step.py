"""What one actor costs per env step, and where it goes: ``Actor.collect`` in a loop (the preset's envs per actor and
rollout length, a fixed snapshot, no learner, no transport), split into the env's step, inference and the rest
(the rollout's own bookkeeping, fragments). One process per measurement; with ``--checkout`` (a git worktree of
another commit) both run interleaved, side by side, with the ratio of their medians: an actor-bound run (the
default CartPole run since the learner's numpy step) goes as fast as this.

    python benchmarks/actor_step.py [--envs cartpole halfcheetah] [--repeats 5] [--rollouts 300]
                                    [--checkout <worktree>]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRESETS = {"cartpole": ("CartPole-v1", 8, 32, False), "halfcheetah": ("HalfCheetah-v5", 4, 128, True)}

CHILD = r"""
import json, sys, time, warnings
warnings.filterwarnings("ignore")
import numpy as np
from omegaconf import OmegaConf
from laglab.actor import Actor
from laglab.config import Config, validate
from laglab.learner import Learner
from laglab.policy import Snapshot
from laglab.run import env_spec
env_id, E, T, norm, rollouts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1", int(sys.argv[5])
cfg = validate(OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.create(
    {"actors": 1, "env": {"id": env_id, "normalize_obs": norm}, "actor": {"envs_per_actor": E, "rollout_len": T}})))
spec = env_spec(cfg)
snap = Snapshot.make(0, Learner(cfg, spec).model, np.zeros(spec.obs_shape), np.ones(spec.obs_shape))
actor = Actor(cfg, 0, 1)
actor.load(snap)
for _ in range(max(5, rollouts // 10)):
    actor.collect()
s0 = (actor.stats.env_s, actor.stats.infer_s)
t = time.perf_counter()
for _ in range(rollouts):
    actor.collect()
wall = time.perf_counter() - t
n = rollouts * T * E
env_s, infer_s = actor.stats.env_s - s0[0], actor.stats.infer_s - s0[1]
print(json.dumps({"us": wall / n * 1e6, "env": env_s / n * 1e6, "infer": infer_s / n * 1e6,
                  "other": (wall - env_s - infer_s) / n * 1e6}))
"""


def measure(checkout: Path, env: str, rollouts: int) -> dict:
    env_id, E, T, norm = PRESETS[env]
    run_env = dict(os.environ, PYTHONPATH=str(checkout / "platform"), OPENBLAS_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-c", CHILD, env_id, str(E), str(T), "1" if norm else "0", str(rollouts)],
                       cwd=checkout, env=run_env, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{checkout} {env}: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rollouts", type=int, default=300, help="rollouts per measurement (CartPole: 256 steps each)")
    ap.add_argument("--checkout", type=Path, default=None, help="another checkout, measured interleaved beside this")
    args = ap.parse_args()
    trees = [ROOT] + ([args.checkout.resolve()] if args.checkout else [])
    print("| env | checkout | us per env step (median of %d) | env | inference | rest | vs this checkout |"
          % args.repeats)
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for env in args.envs:
        rollouts = args.rollouts if env == "cartpole" else max(1, args.rollouts // 8)
        got = {t: [] for t in trees}
        for _ in range(args.repeats):
            for t in trees:  # interleaved: the machine's drift spreads over both
                got[t].append(measure(t, env, rollouts))
        base = statistics.median(r["us"] for r in got[ROOT])
        for t in trees:
            med = {k: statistics.median(r[k] for r in got[t]) for k in ("us", "env", "infer", "other")}
            name = "this" if t == ROOT else str(t)
            print(f"| {env} | {name} | {med['us']:.2f} | {med['env']:.2f} | {med['infer']:.2f} | "
                  f"{med['other']:.2f} | {med['us'] / base:.2f} |", flush=True)


if __name__ == "__main__":
    main()
