"""How many tasks are runnable while a command runs: samples /proc/stat's ``procs_running`` every ~0.5 ms through
the middle half of the command's busy time and prints how often one or none besides the sampler was runnable and the
period of the count's swings. Written for laglab.sim's validation (README: what the model misses): when a machine
stands idle while tasks are runnable, the loss is the scheduler's (a run queue per core, the VM waking an idle core),
which the model's single pool of cores does not have; when it stands idle with nothing runnable, it is the work's.

    python benchmarks/runnable.py -- python train.py env=latency env.latency_ms=[2] actors=64 \\
        total_env_steps=163840 tracking.wandb.mode=disabled tracking.progress=false

Linux only. The sampler itself is one more runnable task (subtracted) and costs a few percent of a core.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np


def sample() -> tuple[int, int, int]:
    """(procs_running, the machine's idle ticks, all its ticks) from one read of /proc/stat."""
    with open("/proc/stat") as f:
        text = f.read()
    cpu = [int(x) for x in text.split("\n", 1)[0].split()[1:]]
    i = text.index("procs_running")
    return int(text[i + 14:text.index("\n", i)]), cpu[3] + cpu[4], sum(cpu[:8])  # (idle + iowait; steal is busy)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        argv = argv[argv.index("--") + 1:]
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    t, n, idle, ticks = [], [], [], []
    while child.poll() is None:
        running, i, k = sample()
        t.append(time.monotonic())
        n.append(running - 1)  # (less the sampler, running as it reads)
        idle.append(i)
        ticks.append(k)
        time.sleep(0.0005)
    t, n = np.asarray(t), np.asarray(n)
    busy = np.flatnonzero(n >= 4)  # the command's busy stretch: from its start-up to its last actors
    if len(busy) < 100:
        print("the command was never busy (4 or more runnable tasks): nothing to read", file=sys.stderr)
        return 1
    a, b = t[busy[0]], t[busy[-1]]
    keep = (t > a + (b - a) / 4) & (t < b - (b - a) / 4)
    x, dt = n[keep], float(np.median(np.diff(t[keep])))
    first, last = np.flatnonzero(keep)[[0, -1]]
    idle_share = (idle[last] - idle[first]) / max(ticks[last] - ticks[first], 1)
    print(f"{keep.sum()} samples over the middle half of {b - a:.1f} s of busy time, every {1e3 * dt:.2f} ms "
          f"(exit {child.returncode}); the machine stood {idle_share:.1%} idle over it (the sampler included)")
    cores = len(os.sched_getaffinity(0))
    print(f"  (fewer than {cores} runnable besides the sampler is the only state in which the command's own work "
          f"could leave one of the {cores} cores idle)")
    for k in (0, 1, 2, 4, 8, 16, 32, 64):
        print(f"  P(runnable besides the sampler <= {k:2d}) = {(x <= k).mean():.3f}")
    print(f"  mean {x.mean():.1f}, median {np.median(x):g}")
    y = x[:4000] - x[:4000].mean()
    if y.std() > 0:
        ac = np.correlate(y, y, "full")[len(y) - 1:] / (y.var() * len(y))
        peaks = [i for i in range(2, min(400, len(ac) - 1)) if ac[i - 1] < ac[i] >= ac[i + 1] and ac[i] > 0.1]
        if peaks:
            print(f"  the count swings with a period of {1e3 * peaks[0] * dt:.1f} ms (autocorrelation {ac[peaks[0]]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
