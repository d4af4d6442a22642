"""The process runner: shared-memory slots and the seqlocked snapshot block, real faults (SIGKILL, hangs),
exact books, bad input refused before any process starts, and nothing leaked on any exit path."""
import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from laglab.config import ConfigError
from laglab.run import env_spec, run
from laglab.shm import FragmentLayout, SeqBlock, SlotPool, leftover_segments, new_token, segment_name
from laglab.tagged import TAGGED_ID

from test_protocol import balanced, cfg_of

ROOT = Path(__file__).resolve().parents[1]


def pcfg(**over):
    over.setdefault("runner", {})
    over["runner"] = {"name": "process", **over["runner"]}
    return cfg_of(**over)


def children():
    return [p for p in mp.active_children() if p.name.startswith("laglab-actor")]


# ---- the wire ---------------------------------------------------------------------------------------------
def test_a_bundle_carries_each_kind_of_message_in_order_and_bad_bundles_are_refused():
    import struct

    from laglab import wire
    from laglab.fragment import FragmentId
    fid = FragmentId(actor_id=3, incarnation=9, env_index=2, episode_id=41, episode_t0=100, t_start=128, t_end=160,
                     behavior_version=17, schema_version=2)
    msgs = [wire.produced(9, (256, 256, 0), [(1, 12.5, 30), (5, -3.0, 7)]),
            wire.sent(9, (256, 224, 32), 2, 160, 32),
            wire.frag(9, (256, 224, 0), 4, fid, 1),
            wire.done(9, (256, 0, 0)),
            wire.discarded(9, (296, 0, 0), 40, 191, [(0, 4.0, 9)])]
    data = wire.bundle(msgs)
    # by hand: a 40-byte head of kind 7, then each message prefixed by its length as a little-endian uint32
    assert struct.unpack_from("<q", data, 0)[0] == 7
    assert len(data) == 40 + sum(4 + len(m) for m in msgs)
    parts = [wire.parse(p) for p in wire.split(data)]
    assert [p.kind for p in parts] == [1, 2, 3, 5, 8]
    assert (parts[4].discarded, parts[4].skip_to, parts[4].books) == (40, 191, (296, 0, 0))
    assert parts[4].episodes["length"].tolist() == [9]
    with pytest.raises(ValueError):
        wire.parse(msgs[4][:-1])  # a DISCARDED body of the wrong size
    assert parts[0].books == (256, 256, 0) and parts[0].episodes["ret"].tolist() == [12.5, -3.0]
    assert parts[0].episodes["length"].tolist() == [30, 7]
    assert parts[1].sent == (2, 160, 32) and parts[1].books == (256, 224, 32)
    assert parts[2].slot == 4 and parts[2].k == 1 and parts[2].fid == fid
    assert wire.bundle(msgs[:1]) == msgs[0] and wire.split(msgs[0]) == [msgs[0]]  # one message goes as itself
    for bad in (data[:-1], data[:42], data[:40] + struct.pack("<I", 10 ** 6) + msgs[0],
                data[:40] + struct.pack("<I", len(data)) + data):  # truncated (twice), a length past the end, nested
        with pytest.raises(ValueError):
            wire.split(bad)


def test_a_throttled_actor_waits_on_the_bell_and_clears_the_rings_that_piled_up():
    from laglab.lifetime import Bell, Lifeline
    from laglab.runners.process_actor import _Loop
    ctx = mp.get_context("spawn")
    bell, life = Bell(ctx), Lifeline(ctx)
    loop = _Loop.__new__(_Loop)
    loop.bell, loop.lifeline, loop.idle_s = bell, life, 30.0
    for _ in range(5):  # five updates published while the actor was busy
        bell.ring()
    t0 = time.monotonic()
    loop.wait_for_news()
    assert time.monotonic() - t0 < 20  # it did not wait out idle_s: there was news
    assert not bell.clear()  # and the next wait blocks until the next ring, instead of spinning 4 times
    bell.ring()
    loop.wait_for_news()
    assert not bell.clear()
    for _ in range(100_000):  # rings never block the learner, however many pile up (a full pipe has rung)
        bell.ring()
    assert bell.clear() and not bell.clear()
    assert not life.gone()
    life._learner_end.close()  # what the kernel does when the learner exits
    t0 = time.monotonic()
    loop.wait_for_news()  # a wait ends at the learner's death, not at idle_s
    assert time.monotonic() - t0 < 20 and life.gone()


def test_slots_round_trip_a_fragment_and_are_free_again_after_reading(tmp_path):
    from test_protocol import Actor, Learner

    cfg = cfg_of(env={"id": TAGGED_ID, "kwargs": {"horizon": 3}})
    spec = env_spec(cfg)
    actor = Actor(cfg, 1, 7)
    actor.load(Learner(cfg, spec).snapshot())
    frags = actor.collect().fragments
    pool = SlotPool(FragmentLayout(spec, 16), actors=2, per_actor=4, name=segment_name(new_token(), "t"),
                    create_new=True)
    try:
        f = next(f for f in frags if f.truncated.any())
        slot = pool.free_slot(1)
        assert slot in pool.partition(1)
        k = pool.write(slot, f)
        assert k == int(f.truncated.sum()) and pool.state[slot] == 1 and pool.free_slot(1) != slot
        g = pool.read(slot, f.id, k)
        assert pool.state[slot] == 0
        for name in ("obs", "actions", "rewards", "disc_return", "terminated", "truncated", "logp", "values",
                     "trunc_obs", "last_obs"):
            np.testing.assert_array_equal(getattr(g, name), getattr(f, name))
            assert not getattr(g, name).flags.writeable  # sealed, and a private copy
        pool.write(pool.free_slot(1), f)
        pool.write(pool.free_slot(1), f)
        assert pool.reclaim(1) == 2 and pool.free_slot(1) == 4  # a dead actor's partition comes back whole
    finally:
        pool.close(unlink=True)


def _hammer(name, n, rounds, pause):
    """Publish ``rounds`` versions (every value = the version), with random pauses averaging ``pause``: some
    gaps are longer than a slow read (it succeeds), some shorter (two publications overtake it)."""
    blk = SeqBlock(n, "float32", name, create_new=False)
    rng = np.random.default_rng(0)
    for v in range(1, rounds + 1):
        blk.publish(np.full(n, float(v), np.float32), v)
        time.sleep(rng.exponential(pause))
    blk.close(unlink=False)


def _slow_copy(dst, src, chunks=8):
    """A copy that a reader is descheduled in the middle of, several times."""
    step = -(-len(dst) // chunks)
    for i in range(0, len(dst), step):
        np.copyto(dst[i:i + step], src[i:i + step])
        time.sleep(0.0003)


def test_no_reader_ever_keeps_parameters_from_two_versions():
    n, rounds = 100_000, 800
    name = segment_name(new_token(), "seq")
    blk = SeqBlock(n, "float32", name, create_new=True)
    out = np.empty(n, np.float32)
    try:
        for check in (True, False):
            writer = mp.get_context("spawn").Process(target=_hammer, args=(name, n, rounds, 0.002))
            writer.start()
            versions, torn = set(), 0
            while writer.is_alive() or not versions:
                if check:
                    version, data = blk.read(out, copy=_slow_copy)
                else:  # the same slow copy of the active buffer, without the sequence check
                    version = int(blk.head[2])
                    _slow_copy(out, blk.bufs[int(blk.head[1])])
                    data = out
                if version > 0:
                    versions.add(version)
                    torn += int(data.min() != data.max() or (check and data[0] != version))
            writer.join()
            assert writer.exitcode == 0
            if check:
                assert torn == 0 and len(versions) > 5  # many versions read while the writer went on
            else:
                assert torn > 0  # without the seqlock the same reads tear: the check above can fail
    finally:
        blk.close(unlink=True)


# ---- the protocol, with real processes (faults, policies, resume: test_protocol.py runs on every runner) ------
def test_throttle_and_lag_filter_work_across_processes(tmp_path):
    s = run(pcfg(actor={"max_lead_steps": 128}, learner={"max_policy_lag": 1}, total_env_steps=16384), tmp_path)
    df = pd.read_parquet(tmp_path / "metrics.parquet")
    assert df["lag/max"].max() <= 1 and balanced(s["transport"])
    a = pd.read_parquet(tmp_path / "actors.parquet")
    assert set(a["actor"]) == {0, 1} and a["steps"].max() > 0 and (a["env_s"] > 0).any()
    assert s["transport"]["queue"]["actors_with_torch"] == 0  # actor processes run numpy only


# ---- refused before anything starts ----------------------------------------------------------------------
def test_a_slot_pool_that_cannot_work_is_refused_naming_the_key(tmp_path):
    from laglab.runners.slots import check_fits

    for over, needle in [({"slots_per_actor": 2}, "envs_per_actor"), ({"slots_per_actor": 4}, "one batch"),
                         ({"slots_per_actor": 10**9}, "/dev/shm")]:
        cfg = pcfg(runner=over, learner={"batch_size": 512})
        with pytest.raises(ConfigError, match=r"runner\.slots_per_actor"):
            check_fits(cfg, env_spec(cfg))
        with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
            check_fits(cfg, env_spec(cfg))
    assert not children() and not leftover_segments(os.getpid())


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_a_child_that_cannot_start_fails_the_run_with_its_error(tmp_path, start_method):
    from laglab.runners.supervisor import ActorFailed

    t0 = time.monotonic()
    with pytest.raises(ActorFailed, match="cannot start in an actor process"):
        run(pcfg(env={"id": "failing_env:FailInChild-v0"}, runner={"start_method": start_method}), tmp_path)
    assert time.monotonic() - t0 < 60  # quickly: no restarts of a child that never started (not a hang)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == "failed" and "could not start" in s["error"]
    assert not children() and not leftover_segments(os.getpid())


# ---- nothing leaks -----------------------------------------------------------------------------------------
def test_forkserver_actors_run_the_learners_code_not_the_installed_copy(tmp_path):
    """Two checkouts, one of them installed (editable): a run started from the other must fork its actors from
    its own code. Python 3.11's fork server ignores the parent's sys.path, so before the fix the actors imported
    the installed laglab: here its status rows have another layout, so the learner saw no heartbeat and the
    run failed restarting them."""
    copy = tmp_path / "checkout"
    shutil.copytree(ROOT / "platform", copy / "platform", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "conf", copy / "conf")
    shutil.copy(ROOT / "train.py", copy / "train.py")
    shm = copy / "platform" / "laglab" / "shm.py"
    text = shm.read_text()
    assert 'FIELDS = ("beat",' in text
    shm.write_text(text.replace('FIELDS = ("beat",', 'FIELDS = ("this_checkout", "beat",'))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "train.py", "runner=process", "runner.start_method=forkserver", "actors=2",
                          "total_env_steps=4096", "learner.batch_size=512", "tracking.wandb.mode=disabled",
                          "runner.actors_max_restarts=0", f"hydra.run.dir={tmp_path / 'run'}"],
                         cwd=copy, env=env, capture_output=True, text=True, timeout=300)
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert out.returncode == 0 and s["status"] == "completed", (s.get("error"), out.stderr[-2000:])
    assert s.get("actor_restarts", 0) == 0


def _train(tmp_path, *args):
    return subprocess.Popen([sys.executable, "train.py", "runner=process", "actors=4", "tracking.wandb.mode=disabled",
                             "tracking.flush_every_s=0", f"hydra.run.dir={tmp_path}", *args], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _descendants(pid):
    """Every process below ``pid``: children, and the fork server's children (the actors under forkserver)."""
    parent = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                parent[int(p.name)] = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError):
                continue
    out, todo = [], [pid]
    while todo:
        q = todo.pop()
        kids = [c for c, pp in parent.items() if pp == q]
        out += kids
        todo += kids
    return out


def _new_actor(pid, before) -> bool:
    """Whether an actor process not in ``before`` runs under ``pid`` (a restart); False while /proc changes under the
    look (a process gone between listing and reading)."""
    try:
        return bool(set(_actors(_descendants(pid))) - set(before))
    except OSError:
        return False


def _actors(kids):
    """The actor processes among ``kids``: spawned ones run spawn_main; forked ones are the fork server's
    children (the server runs forkserver's main and has the run's lifeline)."""
    cmd = {k: Path(f"/proc/{k}/cmdline").read_bytes() for k in kids if Path(f"/proc/{k}").exists()}
    servers = {k for k, c in cmd.items() if b"forkserver" in c}
    ppid = {k: int(Path(f"/proc/{k}/stat").read_text().rsplit(")", 1)[1].split()[1]) for k in cmd}
    return [k for k, c in cmd.items() if b"spawn_main" in c or ppid[k] in servers]


def _wait_for_metrics(p, run_dir):
    deadline = time.monotonic() + 180
    while not (run_dir / "metrics.parquet").exists():
        assert p.poll() is None, p.stderr.read()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.1)


@pytest.mark.parametrize("how,start_method", [("completed", "spawn"), ("sigterm", "spawn"), ("ctrl_c", "spawn"),
                                               ("sigkill_actor", "spawn"), ("completed", "forkserver"),
                                               ("sigterm", "forkserver"), ("sigkill_actor", "forkserver")])
def test_no_shared_memory_or_process_is_left_behind(tmp_path, how, start_method):
    budget = "total_env_steps=16384" if how == "completed" else "total_env_steps=50000000"
    p = _train(tmp_path, budget, f"runner.start_method={start_method}")
    kids = []
    try:
        if how != "completed":
            _wait_for_metrics(p, tmp_path)
            kids = _descendants(p.pid)
            actors = _actors(kids)
            assert len(actors) == 4, kids  # 4 actors (+ the resource tracker, the fork server)
            for a in actors:  # one BLAS thread, also when forked from a server started before the run
                assert b"OMP_NUM_THREADS=1\0" in Path(f"/proc/{a}/environ").read_bytes()
                assert len(os.listdir(f"/proc/{a}/task")) == 1, os.listdir(f"/proc/{a}/task")
            assert leftover_segments(p.pid)  # the run's segments exist while it runs
            if how == "sigterm":
                p.send_signal(signal.SIGTERM)
            elif how == "ctrl_c":
                os.killpg(p.pid, signal.SIGINT)  # the whole foreground group, as a terminal does
            else:
                before = set(_actors(kids))
                os.kill(next(iter(before)), signal.SIGKILL)
                deadline = time.monotonic() + 120  # the supervisor restarts it: wait for the new actor, not a time
                while not _new_actor(p.pid, before) and time.monotonic() < deadline and p.poll() is None:
                    time.sleep(0.05)
                kids += [k for k in _descendants(p.pid) if k not in kids]
                p.send_signal(signal.SIGTERM)
        p.wait(120)
    finally:
        if p.poll() is None:
            p.kill()
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == ("completed" if how == "completed" else "interrupted"), p.stderr.read()[-3000:]
    assert s["transport"]["balanced"]
    if how == "sigkill_actor":
        assert s["actor_restarts"] >= 1 and s["transport"]["dropped"].get("actor_crash", 0) >= 0
    assert not leftover_segments(p.pid)
    time.sleep(0.5)
    alive = [k for k in kids if Path(f"/proc/{k}").exists() and "Z" not in Path(f"/proc/{k}/stat").read_text().split()[2]]
    assert not alive, alive


def test_an_actors_cpu_is_its_whole_process_since_its_loop_started(monkeypatch):
    # process and Ray actors report their process's CPU from the start of their loop (laglab.sim calibrates the
    # actors' contention for cores from it): not their thread's time in rollouts, not the process's age
    import types

    from laglab.actor import ActorStats
    from laglab.chaos import ChaosCounts
    from laglab.runners import process_actor, ray_actor

    clock = {"cpu": 10.0, "wait": 1.0}
    monkeypatch.setattr(time, "process_time", lambda: clock["cpu"])
    # (the waits for a CPU likewise: the kernel's run delay since the loop started)
    monkeypatch.setattr(process_actor, "run_delay_s", lambda: clock["wait"])
    monkeypatch.setattr(ray_actor, "run_delay_s", lambda: clock["wait"])
    rows = {}
    status = types.SimpleNamespace(set=lambda actor, **row: rows.update(row))
    loop = object.__new__(process_actor._Loop)
    loop.actor = types.SimpleNamespace(stats=ActorStats(cpu_s=0.25), first_step_t=None)  # (0.25: a rollout's thread)
    loop.ch = types.SimpleNamespace(counts=ChaosCounts())
    loop.status, loop.actor_id, loop.cpu0, loop.wait0 = status, 0, 7.5, 0.5
    clock["cpu"], clock["wait"] = 11.0, 2.25
    loop.publish_stats()
    assert rows["cpu_s"] == pytest.approx(3.5) and loop.actor.stats.cpu_s == pytest.approx(3.5)
    assert rows["cpu_wait_s"] == pytest.approx(1.75)
    w = object.__new__(ray_actor.RolloutWorker)
    w.actor, w.cpu0, w.wait0 = types.SimpleNamespace(stats=ActorStats(cpu_s=0.25)), 2.0, 1.0
    clock["cpu"] = 6.0
    assert w._stats()["cpu_s"] == pytest.approx(4.0) and w._stats()["cpu_wait_s"] == pytest.approx(1.25)


def test_every_actor_stat_crosses_the_status_block(tmp_path, monkeypatch):
    # an actor process publishes its ActorStats into its status row; the learner reads them back: every field,
    # with its value and type (a field added to ActorStats and not to the status block fails here)
    import dataclasses
    import types

    from laglab import timeline
    from laglab.actor import ActorStats
    from laglab.chaos import ChaosCounts
    from laglab.runners import process, process_actor
    from laglab.shm import StatusBlock, segment_name, new_token

    block = StatusBlock(2, segment_name(new_token(), "status"), True)
    try:
        values = {f.name: type(f.default)(i + 3) for i, f in enumerate(dataclasses.fields(ActorStats))}
        loop = object.__new__(process_actor._Loop)
        loop.actor = types.SimpleNamespace(stats=ActorStats(**values), first_step_t=None)
        loop.ch = types.SimpleNamespace(counts=ChaosCounts())
        loop.status, loop.actor_id, loop.cpu0 = block, 1, time.process_time() + 1e6  # (cpu_s is measured: negative)
        loop.wait0 = 1e6  # (cpu_wait_s too)
        loop.publish_stats()
        runner = object.__new__(process._Runner)
        runner.status, runner.slots = block, [types.SimpleNamespace(actor_id=1, stats=None)]
        monkeypatch.setattr(timeline, "_marks", {})  # (its reading marks the start-up)
        runner.first_steps = timeline.FirstSteps(2)
        got = runner.actor_stats()[1]
        assert got.start_cpu_s == loop.cpu0  # (the process's CPU before its loop)
        for f in dataclasses.fields(ActorStats):
            measured = ("cpu_s", "cpu_wait_s", "start_cpu_s")
            want = getattr(loop.actor.stats, f.name) if f.name in measured else values[f.name]
            assert getattr(got, f.name) == pytest.approx(want) and type(getattr(got, f.name)) is type(f.default), f.name
        block.set(1, loads=0)
        assert runner.actor_stats()[1].version == -1  # (no snapshot loaded yet)
    finally:
        block.close(True)
