"""Start-up: from the command to the first env step, the first update and a solved CartPole, milestone by milestone.

    python benchmarks/startup.py [--repeats 5] [--variants default runner.start_method=spawn] [--budget 200000]

Each repeat runs ``python train.py seed=<repeat> total_env_steps=<budget>`` once per variant, interleaved (variant
A, B, A, B, ...), each in its own process, timed from just before the process is created. A run records its
milestones on the host's monotonic clock (``summary.json``'s ``startup``; see ``laglab/timeline.py``), so they
line up with the launch time here:

    interpreter     Python started, train.py's first line runs
    config          Hydra composed the config (and the command line was checked)
    imports         the learner's side is imported (torch)
    learner         the model and optimizer are built
    tracker         the metrics store is open (W&B starts in the background)
    actors_started  every actor process is started
    first_env_step  the first actor's first env step
    first_fragment  the learner receives its first fragment
    first_update    the first update is done
    return_475      the rolling mean of the last 20 episodes first reaches 475 (CartPole's bar)
    exit            the process has exited

It also times ``train.py --help``, a config error (``actors=0``) and a bare ``python -c pass``. Prints the median
and the minimum of each over the repeats, per variant, with the machine's load (wall-clock figures need a quiet
machine: this machine has 2 cores and a second job halves everything).

laglab's modules are byte-compiled first (``__pycache__`` in each checkout), as a user's first run leaves them: a
run imports ~30 of them before its first env step. Where ``PYTHONDONTWRITEBYTECODE`` is set (as on the machines
this was developed on) no run would write them, and every run would compile them again (~0.07 s more to the first
env step, measured 2026-12-05: 1.55 s vs 1.48, medians of 5 side by side); ``--no-compile`` measures that.
"""
from __future__ import annotations

import argparse
import compileall
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
MILESTONES = ("interpreter", "config", "imports", "learner", "tracker", "actors_started", "first_env_step",
              "first_fragment", "first_update")
THRESHOLD, WINDOW = 475.0, 20


def timed(cmd: List[str]) -> float:
    t0 = time.monotonic()
    subprocess.run(cmd, cwd=ROOT, capture_output=True)
    return time.monotonic() - t0


def one_run(variant: str, seed: int, budget: int, out: Path, root: Path = ROOT) -> Dict[str, Optional[float]]:
    run_dir = out / f"{len(list(out.iterdir()))}"
    cmd = [sys.executable, str(root / "train.py"), f"seed={seed}", f"total_env_steps={budget}",
           "tracking.console_every_s=1e9", f"hydra.run.dir={run_dir}", *shlex.split(variant if variant != "default" else "")]
    t0 = time.monotonic()
    env = dict(os.environ, PYTHONPATH=str(root / "platform"))  # (that checkout's laglab, wherever it is installed)
    p = subprocess.run(cmd, cwd=root, capture_output=True, text=True, env=env)
    end = time.monotonic() - t0
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    s = json.loads((run_dir / "summary.json").read_text())
    st = s.get("startup", {})
    origin = st.get("origin_monotonic")
    row: Dict[str, Optional[float]] = {}
    for m in MILESTONES:
        row[m] = (origin + st[m] - t0) if origin is not None and m in st else None
    row["return_475"] = None
    ep = pd.read_parquet(run_dir / "episodes.parquet") if (run_dir / "episodes.parquet").exists() else None
    if ep is not None and len(ep) and row["tracker"] is not None:
        ep = ep.sort_values("wall_time", kind="stable").reset_index(drop=True)
        hit = ep[ep["return"].rolling(WINDOW).mean() >= THRESHOLD]
        if not hit.empty:  # (the tracker's clock, episodes' wall_time, starts at the "tracker" milestone)
            row["return_475"] = row["tracker"] + float(hit["wall_time"].iloc[0])
    row["exit"] = end
    return row


def _fmt(values: List[Optional[float]]) -> str:
    v = [x for x in values if x is not None]
    if not v:
        return "-"
    return f"{statistics.median(v):6.2f} ({min(v):.2f})" + ("" if len(v) == len(values) else f" [{len(v)}/{len(values)}]")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5, help="runs per variant (seeds 0..repeats-1)")
    ap.add_argument("--variants", nargs="+", default=["default"],
                    help="train.py overrides per variant, each one quoted string ('default': none)")
    ap.add_argument("--budget", type=int, default=200_000, help="total_env_steps of each run")
    ap.add_argument("--checkout", type=Path, action="append", default=[],
                    help="also run each variant from this checkout of laglab (e.g. a git worktree of an older commit), "
                         "interleaved with this one; a checkout that records no milestones shows only its exit time")
    ap.add_argument("--no-compile", action="store_true",
                    help="do not byte-compile laglab's modules first (see above: runs then use whatever __pycache__ "
                         "holds)")
    args = ap.parse_args()
    if not args.no_compile:
        for root in [ROOT, *args.checkout]:
            compileall.compile_dir(str(Path(root) / "platform" / "laglab"), quiet=1)
    if args.checkout:
        args.variants = [f"{v} @{c}" for v in args.variants for c in [ROOT, *args.checkout]]
    load0 = os.getloadavg()[0]
    out = Path(tempfile.mkdtemp(prefix="laglab-startup-"))
    rows: Dict[str, List[Dict[str, Optional[float]]]] = {v: [] for v in args.variants}
    fixed = {"python -c pass": [], "train.py --help": [], "train.py actors=0 (config error)": []}
    for r in range(args.repeats):
        fixed["python -c pass"].append(timed([sys.executable, "-c", "pass"]))
        fixed["train.py --help"].append(timed([sys.executable, str(ROOT / "train.py"), "--help"]))
        fixed["train.py actors=0 (config error)"].append(timed([sys.executable, str(ROOT / "train.py"), "actors=0"]))
        for v in args.variants:
            name, _, root = v.partition(" @")
            rows[v].append(one_run(name, r, args.budget, out, Path(root) if root else ROOT))
            print(f"repeat {r} {v}: first env step {rows[v][-1]['first_env_step']}, 475 at {rows[v][-1]['return_475']}",
                  file=sys.stderr, flush=True)
    load1 = os.getloadavg()[0]
    print(f"seconds from the command, median (min) over {args.repeats} runs; CartPole, budget {args.budget:,}; "
          f"load average {load0:.2f} at the start, {load1:.2f} at the end, {os.cpu_count()} CPUs; laglab's modules "
          + ("as __pycache__ held them (--no-compile)" if args.no_compile else "byte-compiled first"))
    w = max(len(v) for v in args.variants + ["milestone"])
    print(f"| {'milestone':<16} | " + " | ".join(f"{v:<{w}}" for v in args.variants) + " |")
    print("|" + "-" * 18 + "|" + "|".join("-" * (w + 2) for _ in args.variants) + "|")
    for m in (*MILESTONES, "return_475", "exit"):
        print(f"| {m:<16} | " + " | ".join(f"{_fmt([r[m] for r in rows[v]]):<{w}}" for v in args.variants) + " |")
    for name, vals in fixed.items():
        print(f"{name}: {_fmt(vals)} s")
    print(f"run dirs: {out}")


if __name__ == "__main__":
    main()
