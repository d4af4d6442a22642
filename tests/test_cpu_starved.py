"""Actors starved of CPU by other processes: the process runner's actors run at nice 19 so that the learner keeps
its core, which also hands the cores to any busy process of the same session. A run measures its actors' waits for
a CPU (the kernel's run delay), says so while it happens and in its footer and summary.json, and the doctor
names the override. Real busy processes here, one per usable CPU, in this test's session (as a job started from
the same shell): with them the default actors get ~1% of a CPU; at runner.actor_nice=0 they compete fairly."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from laglab.console import STARVED_IDLE, STARVED_WAIT, cpu_starved, footer

ROOT = Path(__file__).resolve().parents[1]
QUIET = ["tracking.wandb.mode=disabled", "tracking.console_every_s=1e9", "tracking.progress=false"]
LINUX = sys.platform.startswith("linux") and os.path.exists("/proc/thread-self/schedstat")


def test_the_rule_needs_both_starved_actors_and_an_idle_learner():
    # a default run on a quiet machine: two nice-19 actors beside a busy learner wait for it about half the time
    assert cpu_starved(3.3, 3.1, 0.10) is None
    # the actors wait almost always, but the learner computes (it has the cores: the run is just learner-bound)
    assert cpu_starved(0.5, 20.0, 0.2) is None
    # the actors wait almost always and so does the learner: someone else has the CPUs
    assert cpu_starved(0.7, 48.9, 0.98) == pytest.approx(48.9 / 49.6)
    # busy processes of other sessions: the run gets its session's share (~0.83 measured), no setting buys more
    assert cpu_starved(1.0, 4.9, 0.9) is None
    # at the thresholds, and just under them
    assert STARVED_WAIT == 0.9 and cpu_starved(1.0, 9.0, STARVED_IDLE) == pytest.approx(STARVED_WAIT)
    assert cpu_starved(1.0, 8.9, 0.99) is None and cpu_starved(1.0, 99.0, STARVED_IDLE - 0.01) is None
    # nothing measured: no verdict
    assert cpu_starved(0.0, 0.0, 0.9) is None and cpu_starved(1.0, 0.0, 0.9) is None and cpu_starved(1, 9, None) is None


def test_the_footer_says_it_only_for_a_starved_run():
    base = {"status": "completed", "runner": "process", "actors": 2, "env_steps": 10, "total_env_steps": 10}
    cpu = {"actors_cpu_s": 0.7, "actors_wait_s": 48.9, "actors_wait_frac": 0.986, "learner_wait_frac": 0.976,
           "actor_nice": 19, "starved": True}
    text = footer({**base, "cpu": cpu}, "/r")
    assert "waited for a CPU 99% of the time" in text and "runner.actor_nice=0" in text
    assert "waited for a CPU" not in footer({**base, "cpu": {**cpu, "starved": False}}, "/r")
    assert "waited for a CPU" not in footer(base, "/r")  # (runs from before the figure)
    ray = footer({**base, "runner": "ray", "cpu": {**cpu, "actor_nice": 0}}, "/r")  # Ray workers are not niced
    assert "waited for a CPU" in ray and "actor_nice" not in ray and "free the CPUs" in ray


def _busy(n):
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def _run(tmp, name, *ovs):
    d = tmp / name
    p = subprocess.run([sys.executable, "train.py", "total_env_steps=10000", "actors=2", *ovs, *QUIET,
                        f"hydra.run.dir={d}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return d, json.loads((d / "summary.json").read_text()), p.stdout + p.stderr


@pytest.mark.skipif(not LINUX, reason="the run delay is read from Linux's /proc/thread-self/schedstat")
def test_busy_processes_of_the_session_starve_nice_actors_and_the_run_says_so(tmp_path):
    from analysis.doctor import diagnose

    hogs = _busy(len(os.sched_getaffinity(0)))
    try:
        d, s, out = _run(tmp_path, "nice19")
        _, fair, fair_out = _run(tmp_path, "nice0", "runner.actor_nice=0")
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    c = s["cpu"]
    # measured, not assumed: the actors' waits for a CPU dwarf their CPU time (a broken reading gives 0 or noise)
    assert c["actors_wait_s"] > 5 * c["actors_cpu_s"] > 0, c
    assert c["starved"] and c["actor_nice"] == 19 and c["learner_wait_frac"] >= STARVED_IDLE, c
    assert "waited for a CPU" in out and "runner.actor_nice=0" in out
    f = next(f for f in diagnose(d)["findings"] if f["rule"] == "cpu")
    assert f["severity"] == "act" and f["overrides"] == ["runner.actor_nice=0"], f
    # the same busy processes, actors at the learner's priority: they get their share and nothing is said
    assert not fair["cpu"]["starved"] and fair["cpu"]["actors_wait_frac"] < STARVED_WAIT, fair["cpu"]
    assert "waited for a CPU" not in fair_out
    assert fair["sps"] > 3 * s["sps"], (fair["sps"], s["sps"])
