"""What action masks buy on a task that needs them, and what they cost in throughput: PPO on env=masked_pick (pick
the best legal item; an illegal pick ends the episode) with the env's masks and with env.action_mask=false, side by
side, seeds interleaved.

    python benchmarks/masks.py [--seeds 10] [--steps 100000] [--runner sync]

Each run is its own process (``python train.py``, W&B off). Prints per arm the IQM of the final return (mean of the
last 20 episodes) with a 95% bootstrap interval over seeds, env steps per episode (50: no illegal pick), and SPS
(start-up included) with the masked / unmasked ratio. Learning figures do not depend on the machine's load (the sync
runner is deterministic); SPS does: run nothing else meanwhile.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from throughput import ROOT, train

sys.path.insert(0, str(ROOT))
from analysis import stats  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--runner", default="sync")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="laglab-masks-"))
    arms = {"masked": "true", "unmasked": "false"}
    res = {k: [] for k in arms}
    for seed in range(a.seeds):  # seed-major: drift spreads over both arms
        for arm, flag in arms.items():
            r = train(out, f"{arm}_s{seed}", ["env=masked_pick", f"runner={a.runner}", "actors=1", f"seed={seed}",
                                              f"total_env_steps={a.steps}", f"env.action_mask={flag}"])
            s = json.loads((out / f"{arm}_s{seed}" / "summary.json").read_text())
            r["length"] = s["env_steps"] / max(1, s["episodes"])
            res[arm].append(r)
            print(f"  {arm:9s} seed {seed}: final return {r['final']:.1f}, {r['sps']:,.0f} sps", flush=True)
    print(f"\nenv=masked_pick, runner={a.runner}, {a.steps:,} env steps, {a.seeds} seeds per arm (runs in {out})")
    print("| arm | final return IQM [95% CI] | env steps per episode | SPS (median) |")
    print("| --- | --- | --- | --- |")
    sps = {}
    for arm, rows in res.items():
        final = np.array([r["final"] for r in rows], float)
        point, lo, hi = stats.interval(stats.iqm, final)
        sps[arm] = float(np.median([r["sps"] for r in rows]))
        print(f"| {arm} | {point:.1f} [{lo:.1f}, {hi:.1f}] | "
              f"{np.mean([r['length'] for r in rows]):.1f} | {sps[arm]:,.0f} |")
    print(f"\nSPS masked / unmasked: {sps['masked'] / sps['unmasked']:.2f}")


if __name__ == "__main__":
    main()
