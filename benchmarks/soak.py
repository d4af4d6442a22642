"""Soak: a long `chaos=faults` run with aggressive actor kills, watching the learner's resources from outside.

    python benchmarks/soak.py --runner process --steps 3000000 --kill-every 512
    python benchmarks/soak.py --runner ray --steps 400000 --kill-every 1024

Starts `train.py` (CartPole, `chaos=faults` with `chaos.kill_every_steps=<kill-every>`, unlimited restarts, no
restart backoff) and samples, every `--every` seconds, the learner process's RSS, open file descriptors and
threads, the run's /dev/shm entries (its `laglab-<pid>-*` segments and, machine-wide, `sem.*` semaphores) and
the processes below it. At the end it prints, per resource, the value after warm-up (the first `--warmup`
fraction of samples is skipped), the last value, the maximum and the slope per 1,000 restarts (least squares
against time, times the run's seconds per restart), next to the run's restarts and books. The goal: every
slope ~0 after warm-up, the books balanced, the run completed.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _descendants(pid: int) -> int:
    parent = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                parent[int(p.name)] = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError):
                continue
    n, todo = 0, [pid]
    while todo:
        q = todo.pop()
        kids = [c for c, pp in parent.items() if pp == q]
        n += len(kids)
        todo += kids
    return n


def sample(pid: int) -> dict:
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kb = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
    shm = os.listdir("/dev/shm")
    return {"rss_mb": rss_kb / 1024, "fds": len(os.listdir(f"/proc/{pid}/fd")),
            "threads": len(os.listdir(f"/proc/{pid}/task")),
            "shm_segments": sum(n.startswith(f"laglab-{pid}-") for n in shm),
            "semaphores": sum(n.startswith("sem.") for n in shm), "children": _descendants(pid)}


def soak(args, kill_every: int) -> dict:
    """One run; returns its summary, wall time and the resource samples (warm-up and shutdown cut off)."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"laglab-soak-{args.runner}-"))
    cmd = [sys.executable, str(ROOT / "train.py"), f"runner={args.runner}", "chaos=faults",
           f"chaos.kill_every_steps={kill_every}", "runner.actors_max_restarts=1000000",
           "runner.restart_backoff_s=0", "tracking.wandb.mode=disabled", f"total_env_steps={args.steps}",
           f"hydra.run.dir={run_dir}", *args.overrides]
    if args.runner == "process":
        cmd.append(f"runner.start_method={args.start_method}")
    print("$", " ".join(cmd[1:]), flush=True)
    t0 = time.monotonic()
    err_path = run_dir / "soak-stderr.txt"  # (a file, not a pipe: a long run's output must never fill a pipe)
    with open(err_path, "w") as err_file:
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err_file)
    rows = []
    while p.poll() is None:
        try:
            rows.append({"t": time.monotonic() - t0, **sample(p.pid)})
        except (OSError, StopIteration):
            pass
        time.sleep(args.every)
    wall = time.monotonic() - t0
    s = json.loads((run_dir / "summary.json").read_text())
    t = s.get("transport", {})
    restarts = s.get("actor_restarts", 0)
    print(f"  run dir {run_dir}: status {s['status']} (exit {p.returncode}), {s['env_steps']:,} env steps in "
          f"{wall:.0f} s, {restarts:,} restarts ({restarts / wall:.1f}/s), kills injected "
          f"{s.get('chaos', {}).get('kills', 0):,}; books: produced {t.get('produced', 0):,}, unaccounted "
          f"{t.get('unaccounted')}, worst at any update {t.get('worst_unaccounted_at_update')}, balanced "
          f"{t.get('balanced')}", flush=True)
    if p.returncode:
        print(err_path.read_text()[-3000:])
    keep = rows[int(len(rows) * args.warmup): max(int(len(rows) * 0.97), 1)]  # (the last 3%: shutdown)
    return {"summary": s, "wall": wall, "restarts": restarts, "rows": keep}


def _slope(rows, key) -> float:
    """Least-squares growth of ``key`` per second."""
    ts = np.array([r["t"] for r in rows])
    v = np.array([r[key] for r in rows], dtype=float)
    return float(np.polyfit(ts, v, 1)[0]) if len(rows) >= 3 and np.ptp(ts) > 0 else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runner", default="process", choices=["process", "thread", "ray"])
    ap.add_argument("--steps", type=int, default=3_000_000)
    ap.add_argument("--kill-every", type=int, default=512)
    ap.add_argument("--start-method", default="forkserver", help="process runner: spawn | forkserver")
    ap.add_argument("--every", type=float, default=0.5, help="seconds between samples")
    ap.add_argument("--warmup", type=float, default=0.1, help="fraction of samples skipped before 'first'")
    ap.add_argument("--no-control", action="store_true",
                    help="skip the control run without kills (it separates what restarts cost from what a run of "
                         "that length holds anyway: the tracker keeps every update's row and every episode)")
    ap.add_argument("overrides", nargs="*", help="more train.py overrides")
    args = ap.parse_args()
    control = None if args.no_control else soak(args, 10 ** 12)
    run = soak(args, args.kill_every)
    rows, restarts = run["rows"], run["restarts"]
    if len(rows) < 3:
        print("too few samples to fit a slope")
        return
    per_restart = run["wall"] / max(restarts, 1)
    print(f"{'resource':<14} {'first':>9} {'last':>9} {'max':>9} {'slope / 1k restarts':>20}")
    for key in ("rss_mb", "fds", "threads", "shm_segments", "semaphores", "children"):
        v = np.array([r[key] for r in rows], dtype=float)
        print(f"{key:<14} {v[0]:>9.1f} {v[-1]:>9.1f} {v.max():>9.1f} {_slope(rows, key) * per_restart * 1000:>20.2f}")
    if control is not None and len(control["rows"]) >= 3:
        grow = lambda r: _slope(r["rows"], "rss_mb") * r["wall"]  # noqa: E731 - MB over the run
        g_kill, g_ctrl = grow(run), grow(control)
        print(f"RSS growth over {args.steps:,} env steps: {g_kill:.1f} MB with {restarts:,} restarts, {g_ctrl:.1f} MB "
              f"without kills; attributable to restarts: {1024 * (g_kill - g_ctrl) / max(restarts, 1):+.1f} KB per "
              "restart")


if __name__ == "__main__":
    main()
