"""What the kernel's scheduler does with a run's actors, from a ``perf sched`` trace: the facts laglab.sim's cores
(``_Cores``) are built on, measured on this machine.

    python benchmarks/sched_trace.py                                   # 64 process actors of env=latency, 2 ms
    python benchmarks/sched_trace.py --seconds 2 -- python train.py env=latency actors=16 total_env_steps=400000
    python benchmarks/sched_trace.py --from perf.txt                   # a saved `perf script` text

It starts the command, waits ``--warm`` seconds (the actors' start), records ``--seconds`` of scheduler events on
every CPU (``perf sched record``) and reads them back (``perf script``), then prints:

* each core's idle share, and its share idle while a task waited behind a running one on another core;
* wake-ups that found their core busy and another idle, and how many the wake-up itself moved to another core
  (``Costs.wake_move_p``; a migration in the same instant as the waking) and how many were pulled there later;
* cores that went idle while another had tasks waiting, and how many ran one of those next (a pull);
* how the learner (the traced command: train.py; ``--learner <pid>`` with ``--from``) shares its core: how often a
  waking task took it while the learner could run, for how long, and how many of those were of lower priority.

The run queues are rebuilt from ``sched_waking`` (a task joins its target core's queue), ``sched_migrate_task``
(it moves) and ``sched_switch`` (a preempted task rejoins the queue; the next task leaves it). Needs ``perf``
(Debian: ``apt-get install linux-perf``) and the right to trace (root, or kernel.perf_event_paranoid <= 1). 2026-12-06,
this VM (kernel 6.18, two CPUs), six traces at 16-64 actors (reports/sim_validation/sched_trace.txt): the wake-up
moved the task to the idle core in 7-21% of cases; a core that went idle took a waiting task next in 0.4-1.1%; 5-9%
of the cores' time idle while a task waited behind another elsewhere.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterable, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = [sys.executable, "train.py", "env=latency", "env.latency_ms=[2]", "actors=64", "total_env_steps=400000",
           "runner=process"]
LINE = re.compile(r"\[(\d+)\]\s+([\d.]+):\s+(?:sched:)?(\w+):\s+(.*)")
KV = re.compile(r"(\w+)=(\S+)")
WAKE_S = 5e-6  # a migration this soon after a task's waking is the wake-up's own choice of core (the same instant)


def analyse(lines: Iterable[str]) -> Dict[str, float]:
    """The figures above from ``perf script -F cpu,time,event,trace`` lines of sched_waking, sched_migrate_task and
    sched_switch events (other lines are skipped); the learner's are :func:`preemptions`'."""
    cur: Dict[int, int] = {}  # core -> the task running on it (0: idle)
    queue: Dict[int, set] = collections.defaultdict(set)  # core -> tasks waiting on it
    where: Dict[int, int] = {}  # task -> the core whose queue it is in / it last ran on
    cores: set = set()
    idle = collections.Counter()
    idle_queued = collections.Counter()
    woke_busy = moved = moved_later = went_idle = pulled = 0
    pending: Dict[int, list] = {}  # task -> [its target core, whether it found it busy and another idle, when it
    # woke, whether the wake-up itself moved it (a migration in the same instant: the kernel's choice of core)]
    watch: Dict[int, set] = {}  # core that went idle -> the tasks then waiting elsewhere
    t_first = t_last = None
    for line in lines:
        m = LINE.match(line)
        if not m:
            continue
        cpu, t, ev, rest = int(m[1]), float(m[2]), m[3], m[4]
        cores.add(cpu)
        if t_last is not None and t > t_last:
            dt = t - t_last
            behind_busy = any(queue[c] and cur.get(c, -1) != 0 for c in cores)  # (queued behind a running task;
            for c in cores:  # a task waking on an idle core is that core's wake-up, not work waiting elsewhere)
                if cur.get(c, -1) == 0:
                    idle[c] += dt
                    if behind_busy and not queue[c]:
                        idle_queued[c] += dt
        if t_first is None:
            t_first = t
        t_last = t
        kv = dict(KV.findall(rest))
        if ev == "sched_waking":
            pid, target = int(kv["pid"]), int(kv["target_cpu"])
            cores.add(target)
            if pid in cur.values():
                continue
            busy = cur.get(target, 0) != 0 or bool(queue[target])
            other_idle = any(cur.get(c, -1) == 0 and not queue[c] for c in cores if c != target)
            pending[pid] = [target, busy and other_idle, t, False]
            queue[where.get(pid, target)].discard(pid)
            queue[target].add(pid)
            where[pid] = target
        elif ev == "sched_migrate_task":
            pid, src, dst = int(kv["pid"]), int(kv["orig_cpu"]), int(kv["dest_cpu"])
            cores.update((src, dst))
            if pid in pending and t - pending[pid][2] <= WAKE_S:
                pending[pid][3] = True
            if pid in queue[src]:
                queue[src].discard(pid)
                queue[dst].add(pid)
            where[pid] = dst
        elif ev == "sched_switch":
            prev, nxt = int(kv["prev_pid"]), int(kv["next_pid"])
            if prev != 0 and kv.get("prev_state", "").startswith("R"):  # preempted: still runnable, on this core
                queue[cpu].add(prev)
                where[prev] = cpu
            for q in queue.values():
                q.discard(nxt)
            if prev == 0 and cpu in watch:
                pulled += nxt in watch.pop(cpu)
            cur[cpu] = nxt
            where[nxt] = cpu
            if nxt in pending:
                target, counted, _, at_wake = pending.pop(nxt)
                if counted:
                    woke_busy += 1
                    moved += at_wake
                    moved_later += cpu != target and not at_wake
            if nxt == 0:
                elsewhere = set().union(*(queue[c] for c in cores if c != cpu))
                if elsewhere:
                    went_idle += 1
                    watch[cpu] = elsewhere
    span = (t_last - t_first) if t_first is not None else 0.0
    if span <= 0:
        raise ValueError("no scheduler events in the trace (sched_waking, sched_migrate_task, sched_switch)")
    n = len(cores)
    return {"seconds": span, "cores": n,
            "idle_frac": sum(idle.values()) / (n * span),
            "idle_while_queued_frac": sum(idle_queued.values()) / (n * span),
            "woke_to_busy_core_with_another_idle": woke_busy,
            "wake_move_p": moved / woke_busy if woke_busy else float("nan"),
            "moved_later_frac": moved_later / woke_busy if woke_busy else float("nan"),
            "went_idle_with_tasks_waiting_elsewhere": went_idle,
            "pulled_frac": pulled / went_idle if went_idle else float("nan")}


def preemptions(lines: Iterable[str], learner: int) -> Dict[str, float]:
    """How the learner's thread shares its core: each time it left its core still runnable (``prev_state=R``: a
    waking task took the core) until it ran again, on whichever core. ``learner_preempted_frac``: that time's share
    of the learner's own run time plus it; ``learner_preempted_by_lower``: the share of those taken by a task of
    lower priority (a higher nice: the actors at 15 or 19, Ray's board at 15; laglab.sim's cores let the learner
    hold them off for its whole burst). Only gaps the trace holds whole count: one open at its end is left out, and
    so is a run whose start the trace missed (a missed switch-in ends at the next switch-out seen). Figures on this
    machine: reports/sim_validation/sched_trace.txt."""
    ran = 0.0
    gaps: List[float] = []
    lower: List[bool] = []  # per gap: whether a task of lower priority took the core
    running = None  # (core, since) while the learner runs: one at a time
    out = None  # (when it left its core runnable, whether to a task of lower priority)
    for line in lines:
        m = LINE.match(line)
        if not m or m[3] != "sched_switch":
            continue
        cpu, t = int(m[1]), float(m[2])
        before, _, after = m[4].partition("==>")
        kp, kn = dict(KV.findall(before)), dict(KV.findall(after))
        if int(kp.get("prev_pid", -1)) == learner:
            if running is not None and running[0] == cpu:
                ran += t - running[1]
                if kp.get("prev_state", "").startswith("R"):
                    out = (t, int(kn.get("next_prio", 0)) > int(kp.get("prev_prio", 0)))
            running = None
        if int(kn.get("next_pid", -1)) == learner:
            running = (cpu, t)
            if out is not None:
                gaps.append(t - out[0])
                lower.append(out[1])
                out = None
    if ran <= 0:
        raise ValueError(f"the learner's thread {learner} never ran in the trace")
    gone = sum(gaps)
    return {"learner_run_s": ran, "learner_preempted": len(gaps),
            "learner_preempted_per_run_s": len(gaps) / ran,
            "learner_preempted_s_mean": gone / len(gaps) if gaps else float("nan"),
            "learner_preempted_s_max": max(gaps) if gaps else float("nan"),
            "learner_preempted_frac": gone / (ran + gone),
            "learner_preempted_by_lower": sum(lower) / len(lower) if lower else float("nan")}


def record(cmd, seconds: float, warm: float) -> Tuple[list, int]:
    """Run ``cmd`` (in its own process group, from the repo), trace ``seconds`` of it after ``warm``; the lines and
    the command's pid (train.py's: the learner's main thread)."""
    if shutil.which("perf") is None:
        sys.exit("sched_trace: perf is not installed (Debian: apt-get install linux-perf)")
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "perf.data"
        run = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
        try:
            time.sleep(warm)
            if run.poll() is not None:
                sys.exit(f"sched_trace: the command ended (exit {run.returncode}) within --warm {warm:g} s")
            rec = subprocess.run(["perf", "sched", "record", "-o", str(data), "--", "sleep", str(seconds)],
                                 capture_output=True, text=True)
            if rec.returncode != 0:
                sys.exit("sched_trace: perf sched record failed (root, or kernel.perf_event_paranoid <= 1?):\n"
                         + rec.stderr[-2000:])
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGINT)
                try:
                    run.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(run.pid, signal.SIGKILL)
                    run.wait()
        out = subprocess.run(["perf", "script", "-i", str(data), "-F", "cpu,time,event,trace"],
                             capture_output=True, text=True, check=True)
        return out.stdout.splitlines(), run.pid


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=1.5, help="how long to trace (default 1.5: ~150k events at 64 "
                    "actors)")
    ap.add_argument("--warm", type=float, default=5.0, help="seconds from the command's start to the trace")
    ap.add_argument("--from", dest="source", help="read a saved `perf script -F cpu,time,event,trace` text instead")
    ap.add_argument("--learner", type=int, help="the learner's pid (its main thread), for how it shares its core "
                    "(default for a traced command: its own pid, train.py's; with --from: none)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to trace (default: 64 process actors)")
    a = ap.parse_args(argv)
    cmd = [x for x in a.command if x != "--"] or DEFAULT
    learner = a.learner
    if a.source:
        lines = Path(a.source).read_text().splitlines()
    else:
        if a.seconds <= 0 or a.warm < 0:
            ap.error("--seconds must be > 0 and --warm >= 0")
        lines, pid = record(cmd, a.seconds, a.warm)
        learner = a.learner if a.learner is not None else pid
    try:
        out = analyse(lines)
    except ValueError as e:
        sys.exit(f"sched_trace: {e}")
    if learner is not None:
        try:
            out.update(preemptions(lines, learner))
        except ValueError as e:
            if a.learner is not None:
                sys.exit(f"sched_trace: {e}")
            print(f"sched_trace: note: the traced command's pid {learner} never ran (a wrapper that starts the "
                  "learner?): no learner figures; give --learner <the learner's pid>", file=sys.stderr)
    if a.json:
        print(json.dumps(out))
        return 0
    print(f"{out['seconds']:.2f} s on {out['cores']} cores of: {' '.join(cmd) if not a.source else a.source}")
    print(f"  cores idle                                      {out['idle_frac']:.1%}")
    print(f"  idle while a task waited on another core        {out['idle_while_queued_frac']:.1%}")
    print(f"  wake-ups to a busy core with another idle       {out['woke_to_busy_core_with_another_idle']}, "
          f"of which the wake-up moved to another core: {out['wake_move_p']:.1%}  (laglab.sim Costs.wake_move_p); "
          f"pulled there later: {out['moved_later_frac']:.1%}")
    print(f"  cores gone idle with tasks waiting elsewhere    {out['went_idle_with_tasks_waiting_elsewhere']}, "
          f"of which next ran one of those: {out['pulled_frac']:.1%}")
    if "learner_run_s" in out:
        print(f"  the learner's core taken while it could run     {out['learner_preempted']} times, "
              f"{out['learner_preempted_per_run_s']:.0f} a second of its running, {out['learner_preempted_s_mean'] * 1e3:.2f} "
              f"ms each, at most {out['learner_preempted_s_max'] * 1e3:.2f} ({out['learner_preempted_frac']:.1%} of its "
              f"time); by a task of lower priority (the actors, Ray's board): {out['learner_preempted_by_lower']:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
