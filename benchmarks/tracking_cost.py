"""What tracking costs: CartPole runs with W&B offline (+ the parquet store) vs W&B disabled, interleaved,
in one invocation.

    python benchmarks/tracking_cost.py [--repeats 3] [--runners thread sync]

Prints, per runner, the median SPS of each mode, the ratio offline / disabled, and the share of wall time
the learner thread spent inside the tracker (``summary.json: tracking_s``). The parquet store is always on
(it is the run's record); W&B is the part that can be switched off. The W&B writer runs as a separate
process, so its cost shows in SPS, not in ``tracking_s``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one(runner: str, mode: str, seed: int, out: Path) -> dict:
    d = out / f"{runner}-{mode}-{seed}"
    subprocess.run([sys.executable, str(ROOT / "train.py"), f"runner={runner}", f"seed={seed}",
                    f"tracking.wandb.mode={mode}", "tracking.console_every_s=1e9", f"hydra.run.dir={d}"],
                   check=True, cwd=ROOT, capture_output=True)
    s = json.loads((d / "summary.json").read_text())
    return {"sps": s["sps"], "tracking_frac": s["tracking_s"] / s["wall_time_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--runners", nargs="+", default=["thread", "sync"])
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="laglab-tracking-"))
    for runner in args.runners:
        res = {"disabled": [], "offline": []}
        for rep in range(args.repeats):
            order = ("disabled", "offline") if rep % 2 == 0 else ("offline", "disabled")
            for mode in order:  # interleaved, alternating order, same seed for both modes
                res[mode].append(one(runner, mode, rep, out))
        sps = {m: statistics.median(r["sps"] for r in v) for m, v in res.items()}
        frac = {m: statistics.median(r["tracking_frac"] for r in v) for m, v in res.items()}
        print(f"runner={runner}: median SPS disabled {sps['disabled']:,.0f}, offline {sps['offline']:,.0f}; "
              f"offline/disabled = {sps['offline'] / sps['disabled']:.3f}; time in tracker: "
              f"{100 * frac['disabled']:.2f}% (disabled), {100 * frac['offline']:.2f}% (offline)")
        per_rep = [f"{o['sps'] / d['sps']:.3f}" for o, d in zip(res["offline"], res["disabled"])]
        print(f"  per repeat offline/disabled: {', '.join(per_rep)}")


if __name__ == "__main__":
    main()
