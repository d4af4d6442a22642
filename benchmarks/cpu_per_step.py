"""CPU time per env step, process by process: where a run's CPU goes (the learner's process, each actor, the fork
server), which wall-clock SPS hides once every core is busy.

    python benchmarks/cpu_per_step.py [--steps 1000000] [--repeats 3] [-- <train.py overrides>]

Each repeat runs ``python train.py total_env_steps=<steps> <overrides>`` (W&B off) and reads ``/proc/<pid>/stat``
(user + system time) of the run's process tree every 50 ms; a process's last reading before it exits is its total.
Prints, per repeat, each process's CPU seconds and microseconds per env step, and the sum against the run's wall
time x the CPUs this process may use. The learner's figure includes its start-up (imports: ~1-2 s, so use a budget
long enough to make that small). Figures vary by a few percent from run to run, as wall clock does. The probe
itself costs ~1.2 ms of CPU per reading (a scan of /proc), ~1% of two CPUs at 20 readings a second.
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
from typing import Dict, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "platform"))
from laglab.run import descendants, proc_stats  # noqa: E402 - (imports torch: fine for a benchmark)

TICK = os.sysconf("SC_CLK_TCK")


def tree(root: int) -> Dict[int, Tuple[str, float]]:
    """{pid: (role, CPU seconds)} of ``root`` and its descendants now."""
    stats = proc_stats(reaped=False)
    out = {}
    for pid in descendants(stats, root):
        if pid not in stats:
            continue
        ppid, ticks = stats[pid]
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ")
        except OSError:
            cmd = b""
        if pid == root:
            role = "learner (main process)"
        elif b"forkserver" in cmd and ppid != root:
            role = "actor"
        elif b"forkserver" in cmd:
            role = "fork server"
        elif b"resource_tracker" in cmd:
            role = "resource tracker"
        elif not cmd.strip():
            role = "exited (its command line is gone)"
        else:
            role = "other: " + cmd.decode(errors="replace")[:60]
        out[pid] = (role, ticks / TICK)
    return out


def one(steps: int, overrides, out: Path) -> None:
    run_dir = out / f"run{len(list(out.iterdir()))}"
    cmd = [sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={run_dir}", "tracking.wandb.mode=disabled",
           "tracking.progress=false", f"total_env_steps={steps}", *overrides]
    log = out / f"{run_dir.name}.stderr"  # (a file, not a pipe read at the end: a chatty run cannot fill it and block)
    with open(log, "w") as err:
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        last: Dict[int, Tuple[str, float]] = {}
        while p.poll() is None:
            for pid, (role, cpu) in tree(p.pid).items():  # (a process that exited keeps the role it was seen with)
                last[pid] = (role if pid not in last or not role.startswith("exited") else last[pid][0], cpu)
            time.sleep(0.05)
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{log.read_text()[-2000:]}")
    s = json.loads((run_dir / "summary.json").read_text())
    n = max(1, int(s["env_steps"]))
    cpus = len(os.sched_getaffinity(0))
    print(f"\n{s['runner']}, {s['actors']} actor(s), {n:,} env steps, {s['sps']:,.0f} SPS, wall {s['wall_time_s']:.2f} s "
          f"(start-up excluded)")
    print("| process | role | CPU s | us per env step |")
    print("| --- | --- | --- | --- |")
    total = 0.0
    for pid, (role, cpu) in sorted(last.items()):
        total += cpu
        print(f"| {pid} | {role} | {cpu:.2f} | {cpu / n * 1e6:.2f} |")
    print(f"| all | | {total:.2f} | **{total / n * 1e6:.2f}** |")
    print(f"(the run's wall time x {cpus} CPUs: {s['wall_time_s'] * cpus:.2f} CPU s; its CPU includes the start-up)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("overrides", nargs="*", help="train.py overrides (after --), e.g. runner=sync")
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="laglab-cpu-"))
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    print(f"load average {load:.2f} at the start; run dirs under {out}")
    for _ in range(args.repeats):
        one(args.steps, args.overrides, out)


if __name__ == "__main__":
    main()
