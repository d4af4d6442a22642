"""Reference returns per env for normalized scores: ``(score - random) / (reference - random)``, so 0 is a uniformly
random policy and 1 a published PPO result (rliable's aggregates and performance profiles are computed on these).

``random``: the mean undiscounted return of 100 episodes of uniformly random actions, measured here with
``python -m analysis.references`` (gymnasium 1.x; env seeds 0..99, action-space seed 0). ``reference``:

- CartPole-v1 492.40, Acrobot-v1 -89.93: CleanRL ``ppo.py``, 500k steps (CleanRL docs, rl-algorithms/ppo.md,
  "Experiment results": the average episodic return over seeds);
- HalfCheetah 1442.64, Hopper 2382.86, Walker2d 2287.95: CleanRL ``ppo_continuous_action.py``, 1M steps, MuJoCo
  v4 (same page, openrlbenchmark tag pr-424); laglab runs v5, whose dynamics match v4 (v5 fixes model details),
  so treat these as approximate;
- Pendulum-v1 -200: no published PPO table is cited here; -200 is the "solved" threshold this project uses
  (``measures.THRESHOLDS``), so a normalized Pendulum score of 1 means "at the solved level".

Envs without an entry (the test envs) have no normalized score (NaN)."""
from __future__ import annotations

import argparse
from typing import Dict, Optional, Sequence

import numpy as np

REFERENCES: Dict[str, Dict[str, object]] = {
    "CartPole-v1": {"random": 23.68, "reference": 492.40, "source": "CleanRL ppo.py, 500k steps"},
    "Acrobot-v1": {"random": -497.08, "reference": -89.93, "source": "CleanRL ppo.py, 500k steps"},
    "Pendulum-v1": {"random": -1207.56, "reference": -200.0, "source": "laglab's solved threshold (not published)"},
    "HalfCheetah-v5": {"random": -282.49, "reference": 1442.64, "source": "CleanRL ppo_continuous_action.py, 1M (v4)"},
    "Hopper-v5": {"random": 16.67, "reference": 2382.86, "source": "CleanRL ppo_continuous_action.py, 1M (v4)"},
    "Walker2d-v5": {"random": 1.77, "reference": 2287.95, "source": "CleanRL ppo_continuous_action.py, 1M (v4)"},
}


def normalize(scores: Sequence[float], env_ids: Sequence[str]) -> np.ndarray:
    """Normalized scores (NaN where the env has no reference)."""
    s = np.asarray(scores, float)
    out = np.full(len(s), np.nan)
    for i, (v, e) in enumerate(zip(s, env_ids)):
        ref = REFERENCES.get(str(e))
        if ref is not None:
            out[i] = (v - ref["random"]) / (ref["reference"] - ref["random"])
    return out


def measure_random(env_id: str, episodes: int = 100, seed: int = 0) -> Dict[str, float]:
    """Mean and std of the return of uniformly random actions (env seeds seed..seed+episodes-1)."""
    import gymnasium as gym

    env = gym.make(env_id)
    env.action_space.seed(seed)
    rets = []
    for i in range(episodes):
        env.reset(seed=seed + i)
        done, ret = False, 0.0
        while not done:
            _, r, term, trunc, _ = env.step(env.action_space.sample())
            ret += float(r)
            done = term or trunc
        rets.append(ret)
    env.close()
    return {"mean": float(np.mean(rets)), "std": float(np.std(rets))}


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.references", description="re-measure the random returns")
    ap.add_argument("envs", nargs="*", default=list(REFERENCES))
    ap.add_argument("--episodes", type=int, default=100)
    args = ap.parse_args(argv)
    for e in args.envs:
        r = measure_random(e, args.episodes)
        print(f"{e}: random {r['mean']:.2f} (std {r['std']:.2f}); table {REFERENCES.get(e, {}).get('random')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
