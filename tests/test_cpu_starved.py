"""Actors starved of CPU by other processes: the process runner's actors run at nice 19 so that the learner keeps
its core, which also hands the cores to any busy process of the same session. A run measures its actors' waits for
a CPU (the kernel's run delay), says so while it happens and in its footer and summary.json, and the doctor
names the override; where the OS lets it lower a niceness (root, CAP_SYS_NICE, RLIMIT_NICE) the process runner raises
its starved actors to the learner's niceness itself. Real busy processes here, one per usable CPU, in this test's
session (as a job started from the same shell): with them the default actors get ~1% of a CPU; at
runner.actor_nice=0 (or once raised) they compete fairly."""
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from laglab.console import STARVED_IDLE, STARVED_OWN, STARVED_WAIT, cpu_starved, footer
from laglab.runners.driver import machine_busy_s

ROOT = Path(__file__).resolve().parents[1]
QUIET = ["tracking.wandb.mode=disabled", "tracking.console_every_s=1e9", "tracking.progress=false"]
LINUX = sys.platform.startswith("linux") and os.path.exists("/proc/thread-self/schedstat")
# lowering a process's niceness to 0 takes root (CAP_SYS_NICE) or an RLIMIT_NICE of 20
CAN_RAISE = os.geteuid() == 0 or resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20


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
    # Ray starts its workers at nice 15 (its worker_niceness, not runner.actor_nice): no override to name
    ray = footer({**base, "runner": "ray", "cpu": {**cpu, "actor_nice": 15}}, "/r")
    assert "waited for a CPU" in ray and "actor_nice" not in ray and "free the CPUs" in ray
    # starved, then raised by the run itself: said even when the whole run no longer reads as starved
    raised = {"at_s": 5.2, "wait_frac": 0.98, "learner_wait_frac": 0.91, "from_nice": 19, "to_nice": 0,
              "refused": None}
    text = footer({**base, "cpu": {**cpu, "starved": False, "actors_wait_frac": 0.4, "actor_nice": 0,
                                   "raised": raised}}, "/r")
    assert "waited for a CPU 98% of the time" in text and "raised them to nice 0" in text and "5.2 s" in text
    assert "the learner for data 91% of its time" in text  # (the starved window's, not the whole run's 97.6%)
    assert "over the whole run they waited 40%" in text
    # the OS refused: the remedy as before, and why the run could not apply it itself
    refused = {**raised, "to_nice": None, "refused": "setpriority: Permission denied (...)"}
    text = footer({**base, "cpu": {**cpu, "raised": refused}}, "/r")
    assert "runner.actor_nice=0" in text and "could not raise them itself: setpriority: Permission denied" in text


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


def _rate(run_dir, t0, t1=None):
    """Env steps per second from ``t0`` to ``t1`` seconds after the first update (to the last update if None;
    metrics.parquet's update rows, the run's clock)."""
    import pandas as pd

    m = pd.read_parquet(run_dir / "metrics.parquet")[["wall_time", "env_steps"]].dropna()
    t = m.wall_time - m.wall_time.iloc[0]
    a = m[t <= t0].iloc[-1]
    b = m[t >= t1].iloc[0] if t1 is not None else m.iloc[-1]
    return (b.env_steps - a.env_steps) / (b.wall_time - a.wall_time)


@pytest.mark.skipif(not LINUX, reason="the run delay is read from Linux's /proc/thread-self/schedstat")
def test_busy_processes_of_the_session_starve_nice_actors_and_the_run_says_so(tmp_path):
    from analysis.doctor import diagnose

    hogs = _busy(len(os.sched_getaffinity(0)))
    try:
        # long enough that the starved window (>= 5 s from the first update, ~1k SPS) ends well before the budget
        d, s, out = _run(tmp_path, "nice19", "total_env_steps=20000")
        _, fair, fair_out = _run(tmp_path, "nice0", "runner.actor_nice=0")
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    c = s["cpu"]
    if c is None:
        pytest.skip("this kernel accounts no run delay (/proc/thread-self/schedstat's second field stays 0)")
    assert "waited for a CPU" in out and "runner.actor_nice=0" in out
    f = next(f for f in diagnose(d)["findings"] if f["rule"] == "cpu")
    assert f["overrides"] == ["runner.actor_nice=0"], f
    r = c["raised"]
    assert r is not None and r["from_nice"] == 19 and r["wait_frac"] >= STARVED_WAIT, c
    if CAN_RAISE:  # the run raised its actors to the learner's niceness, and they then got their share
        assert r["refused"] is None and r["to_nice"] == os.getpriority(os.PRIO_PROCESS, 0) == c["actor_nice"], c
        assert "raised them to nice" in out and f["severity"] == "watch", (out[-2000:], f)
        before, after = _rate(d, 0.0, r["at_s"]), _rate(d, r["at_s"])  # (measured: ~1.3k, then ~14k SPS)
        assert after > 3 * before, (before, after)
    else:  # refused: the actors stay starved for the whole run, measured, not assumed
        assert r["refused"] and "could not raise them itself" in out, c
        assert c["actors_wait_s"] > 5 * c["actors_cpu_s"] > 0, c
        assert c["starved"] and c["actor_nice"] == 19 and c["learner_wait_frac"] >= STARVED_IDLE, c
        assert 0 < c["run_cpu_share"] < STARVED_OWN and c["learner_cpu_s"] > 0, c
        assert f["severity"] == "act", f
    if machine_busy_s() is not None:  # the busy processes' CPU is the others' (it was not the run's)
        assert c["others_cpu_s"] > 0.3 * c["span_s"], c
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
    if machine_busy_s() is not None:  # nothing else ran: the others' CPU is the machine's noise, not the run's
        assert c["others_cpu_s"] < 0.25 * (c["actors_cpu_s"] + c["learner_cpu_s"]), c


def test_the_machine_busy_reading_counts_this_process_computing(monkeypatch):
    from laglab.runners import driver

    a = machine_busy_s()
    if a is None:
        pytest.skip("this machine's /proc/stat is not the run's CPUs to read")
    t0 = time.process_time()
    while time.process_time() - t0 < 0.3:
        pass
    assert machine_busy_s() - a >= 0.25  # (this process's 0.3 s, whatever else ran)
    monkeypatch.setattr(driver, "usable_cpus", lambda: (os.cpu_count() or 1) + 1)  # a cpuset or quota: not ours
    assert machine_busy_s() is None


def test_raise_actors_renices_every_thread_of_every_live_actor_or_says_why_not(monkeypatch):
    # the process runner's half of it, on real processes: actor lives at nice 19 (one with a second thread),
    # raised to this process's niceness; later lives start there; a refusal is returned, not raised
    import dataclasses
    import types

    from laglab.preflight import compose
    from laglab.runners.process import _Runner

    cfg = compose(["actors=2"])
    assert cfg.runner.actor_nice == 19
    code = ("import os, threading, time; os.nice(19); threading.Thread(target=time.sleep, args=(60,)).start(); "
            "time.sleep(60)")
    kids = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(2)]
    try:
        tasks = lambda p: [int(t) for t in os.listdir(f"/proc/{p.pid}/task")]  # noqa: E731
        for p in kids:  # wait until both threads run at 19
            for _ in range(500):
                if len(tasks(p)) == 2 and all(os.getpriority(os.PRIO_PROCESS, t) == 19 for t in tasks(p)):
                    break
                time.sleep(0.01)
        slots = [types.SimpleNamespace(child=types.SimpleNamespace(proc=p)) for p in kids]
        slots.append(types.SimpleNamespace(child=None))  # a slot between two lives
        runner = types.SimpleNamespace(cfg=cfg, slots=slots, child_cfg=cfg)
        real = os.setpriority
        monkeypatch.setattr(os, "setpriority", lambda *a: (_ for _ in ()).throw(PermissionError(1, "denied")))
        me = os.getpriority(os.PRIO_PROCESS, 0)
        why = _Runner.raise_actors(runner, me)
        assert why and "denied" in why and runner.child_cfg is cfg
        monkeypatch.setattr(os, "setpriority", real)
        if not CAN_RAISE:
            return
        assert _Runner.raise_actors(runner, me) is None
        assert [os.getpriority(os.PRIO_PROCESS, t) for p in kids for t in tasks(p)] == [me] * 4
        assert runner.child_cfg.runner.actor_nice == 0
        assert dataclasses.replace(runner.child_cfg, runner=cfg.runner) == cfg  # nothing else changed
    finally:
        for p in kids:
            p.kill()
            p.wait()
