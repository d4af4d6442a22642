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

from laglab.console import STARVED_IDLE, STARVED_OWN, STARVED_WAIT, cpu_starved, footer

ROOT = Path(__file__).resolve().parents[1]
QUIET = ["tracking.wandb.mode=disabled", "tracking.console_every_s=1e9", "tracking.progress=false"]
LINUX = sys.platform.startswith("linux") and os.path.exists("/proc/thread-self/schedstat")


def test_the_rule_needs_starved_actors_an_idle_learner_and_cpus_the_run_did_not_use():
    # a default run on a quiet machine: two nice-19 actors beside a busy learner wait for it about half the time
    assert cpu_starved(3.3, 3.1, 0.10, 0.95) is None
    # the actors wait almost always, but the learner computes (it has the cores: the run is just learner-bound)
    assert cpu_starved(0.5, 20.0, 0.2, 0.6) is None
    # the actors wait almost always, the learner waits for data and the run used 3% of the CPUs: others had them
    assert cpu_starved(0.7, 48.9, 0.98, 0.03) == pytest.approx(48.9 / 49.6)
    # 64 latency-env actors on 2 CPUs: they wait 93% for each other, the learner is idle 70% of its time, but the
    # run itself used all the CPUs: oversubscribed by its own actors, not starved by others
    assert cpu_starved(2.0, 27.0, 0.70, 0.98) is None
    # busy processes of other sessions: the run gets its session's share (~0.83 measured), no setting buys more
    assert cpu_starved(1.0, 4.9, 0.9, 0.2) is None
    # at the thresholds, and just past them
    assert (STARVED_WAIT, STARVED_IDLE, STARVED_OWN) == (0.9, 0.5, 0.5)
    assert cpu_starved(1.0, 9.0, STARVED_IDLE, 0.49) == pytest.approx(STARVED_WAIT)
    assert cpu_starved(1.0, 8.9, 0.99, 0.1) is None and cpu_starved(1.0, 99.0, STARVED_IDLE - 0.01, 0.1) is None
    assert cpu_starved(1.0, 99.0, 0.9, STARVED_OWN) is None
    # nothing measured: no verdict
    assert cpu_starved(0.0, 0.0, 0.9, 0.1) is None and cpu_starved(1.0, 0.0, 0.9, 0.1) is None
    assert cpu_starved(1, 9, None, 0.1) is None and cpu_starved(1, 9, 0.9, None) is None


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
    given = {o.split("=", 1)[0] for o in ovs}
    base = [o for o in ("total_env_steps=10000", "actors=2") if o.split("=", 1)[0] not in given]
    p = subprocess.run([sys.executable, "train.py", *base, *ovs, *QUIET,
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
    if c is None:
        pytest.skip("this kernel accounts no run delay (/proc/thread-self/schedstat's second field stays 0)")
    # measured, not assumed: the actors' waits for a CPU dwarf their CPU time (a broken reading gives 0 or noise)
    assert c["actors_wait_s"] > 5 * c["actors_cpu_s"] > 0, c
    assert c["starved"] and c["actor_nice"] == 19 and c["learner_wait_frac"] >= STARVED_IDLE, c
    assert 0 < c["run_cpu_share"] < STARVED_OWN and c["learner_cpu_s"] > 0, c
    assert "waited for a CPU" in out and "runner.actor_nice=0" in out
    f = next(f for f in diagnose(d)["findings"] if f["rule"] == "cpu")
    assert f["severity"] == "act" and f["overrides"] == ["runner.actor_nice=0"], f
    # the same busy processes, actors at the learner's priority: they get their share and nothing is said
    assert not fair["cpu"]["starved"], fair["cpu"]
    assert "waited for a CPU" not in fair_out
    assert fair["sps"] > 3 * s["sps"], (fair["sps"], s["sps"])


@pytest.mark.skipif(not LINUX, reason="the run delay is read from Linux's /proc/thread-self/schedstat")
def test_actors_that_oversubscribe_the_cpus_themselves_are_not_called_starved(tmp_path):
    # many sleeping actors on few CPUs: they wait for a CPU most of their ready time, and the learner waits for
    # data, but for each other: the run itself uses the CPUs (measured: 64 actors on 2 CPUs, waits 0.93-0.95)
    n = 32 * len(os.sched_getaffinity(0))
    _, s, out = _run(tmp_path, "many", "env=latency", "env.latency_ms=[2]", f"actors={n}", f"total_env_steps={n * 1024}")
    c = s["cpu"]
    assert c["actors_wait_frac"] > 0.5 and c["run_cpu_share"] > STARVED_OWN, c
    assert not c["starved"] and "waited for a CPU" not in out, c
