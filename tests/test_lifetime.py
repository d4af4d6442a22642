"""Lifetimes: nothing a run starts or names outlives it, however it dies — the learner SIGKILLed while nobody
reaps it, the whole process group SIGKILLed (what `timeout -s KILL`, the OOM killer's cgroup kill and
`scancel` do), hundreds of actor restarts, a SIGTERM or SIGHUP to the whole group, the terminal closing under a
running run, a learner crash followed by resume."""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from laglab.shm import leftover_segments

from test_process import _descendants, pcfg
from test_protocol import balanced

ROOT = Path(__file__).resolve().parents[1]


def _proc_state(pid):
    """The state letter of ``pid`` (R, S, Z, ...), or None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _alive(pids):
    return [p for p in pids if _proc_state(p) not in (None, "Z")]


def _wait_gone(pids, within_s=10.0):
    """The processes of ``pids`` still alive after ``within_s`` seconds (they exit when their learner does)."""
    deadline = time.monotonic() + within_s
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _alive(pids)


def _kill_if_running(p):
    """A test's run that is still running (the test failed before it ended): SIGKILL its group and reap it."""
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()


def _start(tmp_path, *args, runner="process", actors=4, **popen):
    """train.py as a benchmark or a notebook starts it: output captured through pipes."""
    return subprocess.Popen([sys.executable, "train.py", f"runner={runner}", f"actors={actors}",
                             "tracking.wandb.mode=disabled",
                             "tracking.flush_every_s=0", f"hydra.run.dir={tmp_path}", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


def _cmdline(pid) -> bytes:
    """A process's command line; empty once it has exited (actors come and go while we look: chaos kills)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _wait_for_actors(p, run_dir, n):
    """Until the run has written metrics (actors are producing) and ``n`` actor processes exist."""
    deadline = time.monotonic() + 180
    while True:
        assert p.poll() is None, p.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the run did not start"
        kids = _descendants(p.pid)
        actors = [k for k in kids if b"laglab" in _cmdline(k) or b"multiprocessing" in _cmdline(k)]
        if (run_dir / "metrics.parquet").exists() and len(actors) >= n:
            return kids
        time.sleep(0.1)


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_actors_exit_when_the_learner_is_killed_and_nobody_reaps_it(tmp_path, start_method):
    """The learner is SIGKILLed while its parent (this test) does not reap it: it stays a zombie, which
    `kill(pid, 0)` calls alive. Every process below it must still exit within seconds, release the caller's
    stdout (communicate() returns) and leave no named shared memory."""
    p = _start(tmp_path, f"runner.start_method={start_method}", "learner.epochs=40", "total_env_steps=50000000")
    try:
        kids = _wait_for_actors(p, tmp_path, 4)
        assert leftover_segments(p.pid)
        os.kill(p.pid, signal.SIGKILL)
        t0 = time.monotonic()
        left = _wait_gone(kids)
        print(f"every process below the killed learner was gone {time.monotonic() - t0:.2f} s after its death")
        assert _proc_state(p.pid) == "Z"  # not reaped: the case kill(pid, 0) cannot tell from a live learner
        assert not left, [(k, _proc_state(k), Path(f"/proc/{k}/cmdline").read_bytes()[:80]) for k in left]
        p.communicate(timeout=10)  # EOF: no orphan holds the caller's stdout or stderr
        assert not leftover_segments(p.pid)  # the resource tracker unlinked them once the last actor was gone
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_a_killed_process_group_leaves_segments_that_the_next_start_removes(tmp_path):
    """`kill -9 -- -<pgid>`: learner, actors and the resource tracker die at once, and nobody unlinks anything.
    No POSIX semaphore is left (the runner names none), and the next start removes the dead run's segments and
    says so, while the segments of a run that is alive are kept."""
    sems = lambda: sorted(n for n in os.listdir("/dev/shm") if n.startswith("sem."))  # noqa: E731
    sems_before = sems()
    pymp = lambda: sorted(n for n in os.listdir(tempfile.gettempdir()) if n.startswith("pymp-"))  # noqa: E731
    pymp_before = pymp()
    live = _start(tmp_path / "live", "total_env_steps=50000000", start_new_session=True)
    dead = _start(tmp_path / "dead", "total_env_steps=50000000", start_new_session=True)
    try:
        _wait_for_actors(live, tmp_path / "live", 4)
        kids = _wait_for_actors(dead, tmp_path / "dead", 4)
        os.killpg(dead.pid, signal.SIGKILL)
        dead.communicate(timeout=30)
        assert not _wait_gone(kids)
        left = leftover_segments(dead.pid)
        assert len(left) == 6, left  # what a group kill leaves: nobody was left to unlink
        assert sems() == sems_before  # and no semaphore: there are none to leave
        # nor multiprocessing's own temporary directory (the fork server's socket: pymp-* in /tmp, which only an
        # orderly exit removes), but one of laglab's, with the dead learner's pid in its name
        assert pymp() == pymp_before
        assert len(_mp_dirs(dead.pid)) == 1 and len(_mp_dirs(live.pid)) == 1
        from laglab.lifetime import MP_PREFIX, sweep_dirs
        from laglab.shm import sweep_stale
        removed = sweep_stale()
        assert set(left) <= set(removed) and not leftover_segments(dead.pid)
        assert len(leftover_segments(live.pid)) == 6  # a live run holds its life file's lock: kept
        sweep_dirs(MP_PREFIX)  # (whoever sweeps first, the dead run's goes and the live one's stays)
        assert not _mp_dirs(dead.pid) and len(_mp_dirs(live.pid)) == 1
        # the next start says what it removed
        os.killpg(live.pid, signal.SIGKILL)
        live.communicate(timeout=30)
        removed_by_another = not leftover_segments(live.pid)
        mp_removed_by_another = not _mp_dirs(live.pid)
        out = subprocess.run([sys.executable, "train.py", "runner=process", "tracking.wandb.mode=disabled",
                              "total_env_steps=2048", f"hydra.run.dir={tmp_path / 'next'}"], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        log = (tmp_path / "next" / "train.log").read_text()
        # (any laglab start removes a dead run's segments: on a machine where other runs start meanwhile, one of
        # them may have said it first; then only their absence can be checked here)
        if not removed_by_another:
            assert "shared-memory segment(s) left in /dev/shm by killed runs" in log and str(live.pid) in log, log
        if not mp_removed_by_another:
            assert re.search(rf"fork-server directory\(ies\) left in .* did not end in order \(pid [0-9, ]*\b{live.pid}\b",
                             log), log
        assert not leftover_segments(live.pid) and not _mp_dirs(live.pid)
        assert pymp() == pymp_before  # (the next run, ended in order, left nothing either)
    finally:
        for p in (live, dead):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()


def _mp_dirs(pid):
    """The temporary directories (the fork server's socket) laglab's learner ``pid`` made (lifetime.own_mp_tempdir)."""
    from laglab.lifetime import MP_PREFIX
    return sorted(n for n in os.listdir(tempfile.gettempdir()) if n.startswith(f"{MP_PREFIX}{pid}-"))


_OWNER = """
import sys, time
sys.path.insert(0, {root!r})
from laglab.lifetime import own_mp_tempdir
from multiprocessing import util
assert own_mp_tempdir() == util.get_temp_dir() == own_mp_tempdir()  # (multiprocessing's, and made once)
print(util.get_temp_dir(), flush=True)
{then}
"""


def test_the_fork_servers_directory_is_removed_by_the_next_start_once_its_learner_is_gone():
    """What :func:`own_mp_tempdir` makes: multiprocessing's temporary directory for the process. An orderly exit
    removes it; after a SIGKILL it stays until a start sweeps it, and a live owner's is never swept."""
    import laglab
    from laglab.lifetime import MP_PREFIX, sweep_dirs
    root = os.path.dirname(list(laglab.__path__)[0])
    done = subprocess.run([sys.executable, "-c", _OWNER.format(root=root, then="")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert not os.path.exists(done.stdout.strip())  # an orderly exit removed it
    procs = [subprocess.Popen([sys.executable, "-c", _OWNER.format(root=root, then="time.sleep(600)")],
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        dirs = [p.stdout.readline().strip() for p in procs]
        assert all(os.path.basename(d) == _mp_dirs(p.pid)[0] for d, p in zip(dirs, procs))
        assert not {os.path.basename(d) for d in dirs} & set(sweep_dirs(MP_PREFIX))  # both alive: kept
        procs[0].kill()
        procs[0].wait()
        assert os.path.isdir(dirs[0])  # a SIGKILL leaves it ...
        assert os.path.basename(dirs[0]) in sweep_dirs(MP_PREFIX)  # ... for the next sweep, which takes it
        assert not os.path.exists(dirs[0]) and os.path.isdir(dirs[1])  # (and keeps the live one's)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        sweep_dirs(MP_PREFIX)  # (the second one's, SIGKILLed last)


def test_the_fork_servers_directory_outlives_no_learner_in_the_ways_a_start_can_go_wrong(tmp_path, monkeypatch):
    """A child the learner started (exec'd: the life file's fd is close-on-exec) does not keep a SIGKILLed learner's
    directory alive; a TMPDIR too long for the fork server's socket, or a directory that cannot be made, leaves
    multiprocessing its own way (None); what a cut-short start left (a hidden directory) goes once it is old."""
    import laglab
    from laglab import lifetime
    root = os.path.dirname(list(laglab.__path__)[0])
    owner = subprocess.Popen([sys.executable, "-c", _OWNER.format(root=root, then=(
        "import subprocess; child = subprocess.Popen(['sleep', '600']); print(child.pid, flush=True); "
        "time.sleep(600)"))], stdout=subprocess.PIPE, text=True)
    child = None
    try:
        path = owner.stdout.readline().strip()
        child = int(owner.stdout.readline())
        owner.kill()
        owner.wait()
        assert _proc_state(child) not in (None, "Z")  # the child lives on, orphaned ...
        assert os.path.basename(path) in lifetime.sweep_dirs(lifetime.MP_PREFIX)  # ... lock-less
        assert not os.path.exists(path)
    finally:
        owner.kill()
        owner.wait()
        if child is not None:
            os.kill(child, signal.SIGKILL)
    from multiprocessing import process
    config = process.current_process()._config
    monkeypatch.setitem(config, "tempdir", None)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / ("x" * (lifetime.MP_DIR_MAX - len(str(tmp_path))))))
    os.makedirs(tempfile.tempdir)
    assert lifetime.own_mp_tempdir() is None and config["tempdir"] is None  # (too long: multiprocessing's own way)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "gone"))  # (no such directory: cannot be made)
    assert lifetime.own_mp_tempdir() is None and config["tempdir"] is None
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    fresh, stale = tmp_path / f".{lifetime.MP_PREFIX}fresh", tmp_path / f".{lifetime.MP_PREFIX}stale"
    for d in (fresh, stale):
        d.mkdir()
        (d / lifetime.LIFE).touch()
    os.utime(stale, (time.time() - 2 * lifetime.STALE_S,) * 2)
    assert lifetime.sweep_dirs(lifetime.MP_PREFIX) == []  # (not a learner's: not counted)
    assert fresh.exists() and not stale.exists()


def _sample_resources(monkeypatch):

    """Record, at every update, the learner's open fds, threads, /dev/shm segments, and the per-incarnation
    state it keeps (the ledger's streams, the throttle watermarks)."""
    from laglab.runners.driver import LearnerDriver
    samples = []
    update = LearnerDriver._update

    def sampled(self, *a, **kw):
        samples.append((len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task")),
                        len(leftover_segments(os.getpid())), len(self.ledger.streams), len(self.learner.consumed)))
        return update(self, *a, **kw)

    monkeypatch.setattr(LearnerDriver, "_update", sampled)
    return samples


def test_hundreds_of_restarts_hold_no_more_descriptors_than_a_few(tmp_path, monkeypatch):
    """Every actor life dies after its first rollout (a real SIGKILL): what each life held (its pipe, its
    process handle, its bell, its streams in the books, its throttle watermark) is released when it is
    finalized, so the learner's fds, threads, /dev/shm entries and per-incarnation state are as many after 300
    restarts as after 30."""
    from laglab.run import run
    samples = _sample_resources(monkeypatch)
    s = run(pcfg(runner={"start_method": "forkserver", "actors_max_restarts": 10**6},
                 chaos={"name": "kill", "kill_every_steps": 64}, total_env_steps=24576), tmp_path)
    assert s["status"] == "completed" and balanced(s["transport"])
    assert s["actor_restarts"] >= 300, s["actor_restarts"]
    # what the kills left on the links is still found lost, to the step, after its streams were retired
    assert s["transport"]["dropped"].get("lost_in_transit", 0) == s["chaos"]["dropped_steps"] + s["chaos"]["lost_held_steps"]
    fds, threads, shm, streams, watermarks = (np.array(x) for x in zip(*samples))
    print(f"{s['actor_restarts']} restarts; learner fds {fds[0]} -> {fds[-1]} (max {fds.max()}), threads "
          f"{threads[0]} -> {threads[-1]}, streams max {streams.max()}, watermarks max {watermarks.max()}")
    n = len(samples)
    early, late = slice(n // 10, n // 4), slice(3 * n // 4, n)
    # a leak of one descriptor per life would add hundreds; a sample may catch, per slot, a life whose death is
    # being booked and the next one starting (a pipe, a bell, a process sentinel each)
    # the floor: at most every slot caught in between (2 slots x 3), where a leak of one per life would add 300;
    # (+4 failed 2 of 9 runs here: the late samples all caught both slots restarting, 38 vs an early floor of 32)
    assert fds[late].min() <= fds[early].min() + 2 * 3, (fds[early], fds[late])
    assert fds[late].max() <= fds[early].max() + 12, (fds[early], fds[late])
    assert threads[late].max() <= threads[early].max()
    assert shm.max() == 6  # the run's six segments (five and its life file), whatever restarts
    envs = 4
    assert streams.max() <= 2 * 2 * envs  # two slots, each at most a dying and a new life
    # watermarks: the live lives', and those of lives that died since the last publication pruned them (here about
    # ten restarts per update): flat, not one per life ever
    assert watermarks[late].max() <= watermarks[early].max() + 4 and watermarks.max() < s["actor_restarts"] // 10


def test_a_reservation_is_whole_or_nothing_and_a_dead_holder_never_keeps_the_lock():
    """The budget word is the reservation: a process SIGKILLed while it holds the counter's lock leaves the
    lock free (the kernel drops a dead holder's flock), and the learner gives back exactly what a dead life
    reserved and never reported."""
    import multiprocessing as mp

    from laglab.shm import SharedCounter, new_token, segment_name
    name = segment_name(new_token(), "budget")
    c = SharedCounter(name, True, actors=2, total=1000, used=100)
    try:
        ctx = mp.get_context("spawn")
        r, w = ctx.Pipe(duplex=False)
        holder = ctx.Process(target=_reserve_and_hold, args=(name, w))
        holder.start()
        assert r.recv() == "holding"  # it reserved 64 and holds the lock
        holder.kill()
        holder.join()
        assert c.reserved(1) == 64 and c.used == 164
        done = []
        import threading
        t = threading.Thread(target=lambda: done.append(c.reserve(0, 32)), daemon=True)
        t.start()
        t.join(10)
        assert done == [True], "the dead holder's lock was not released"
        c.release(1, 64 - 0)  # the learner: reserved 64 since that life began, it reported 0
        assert c.used == 132 and c.reserved(1) == 0
        assert not c.reserve(1, 1000 - 132 + 1) and c.reserve(1, 1000 - 132) and c.used == 1000
    finally:
        c.close(unlink=True)


def _reserve_and_hold(name, conn):
    from laglab.shm import SharedCounter
    c = SharedCounter(name, False, actors=2)
    assert c.reserve(1, 64)
    with c._locked():
        conn.send("holding")
        time.sleep(600)


def _sigterm_the_group(tmp_path, actors, *args, sig=signal.SIGTERM):
    """Start a run in its own process group, send ``sig`` to the group once ``actors`` actors run; (summary,
    stderr, the processes below the learner at the signal, exit code, the learner's pid)."""
    # SIGHUP as a terminal's session leader has it, also when these tests run under nohup (which the run obeys)
    p = _start(tmp_path, *args, start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    try:
        kids = _wait_for_actors(p, tmp_path, actors)
        os.killpg(p.pid, sig)
        _, err = p.communicate(timeout=120)
    finally:
        _kill_if_running(p)
    return json.loads((tmp_path / "summary.json").read_text()), err.decode(errors="replace"), kids, p.returncode, p.pid


@pytest.mark.parametrize("sig,start_method", [(signal.SIGTERM, "forkserver"), (signal.SIGHUP, "forkserver"),
                                              (signal.SIGHUP, "spawn")], ids=["SIGTERM", "SIGHUP", "SIGHUP-spawn"])
def test_a_sigterm_to_the_whole_group_is_a_shutdown_not_actor_crashes(tmp_path, sig, start_method):
    """What `kill -TERM -- -<pgid>` and `scancel` do: every actor gets the SIGTERM too. The run stops at a safe
    point, books what the actors held as shutdown, restarts nothing. (A slow learner: the signal lands during an
    update, and the actors' ends reach the receiver long before the learner reaches a safe point.) SIGHUP — the
    terminal or ssh session the run was started from closed — the same (its default would end the learner at
    once, with no summary)."""
    s, err, kids, rc, pid = _sigterm_the_group(tmp_path, 4, "total_env_steps=50000000", "learner.epochs=40",
                                               f"runner.start_method={start_method}", sig=sig)
    assert s["status"] == "interrupted", err[-3000:]
    assert "Traceback" not in err and "resource_tracker" not in err, err[-3000:]  # (it is in the group too)
    t = s["transport"]
    assert balanced(t)
    assert "actor_crash" not in t["dropped"] and s["actor_restarts"] == 0, (t["dropped"], s["actor_restarts"])
    assert rc == 130 and not _wait_gone(kids) and not leftover_segments(pid)


@pytest.mark.parametrize("wandb", ["disabled", "offline"])
def test_a_closed_terminal_stops_the_run_with_its_summary(tmp_path, wandb):
    """The window closes or the ssh session drops while the run draws its bar: the kernel hangs up the terminal
    (SIGHUP to the run's session, every write to it an I/O error from then on). The run stops as for Ctrl-C:
    summary.json (interrupted), balanced books, the final checkpoint, no actor or segment left. (Before, the
    learner died of SIGHUP with no summary; with SIGHUP handled, the bar's next draw raised EIO, and so did
    closing it, before summary.json was written.)"""
    from terminal import run_in_terminal
    seen = {}

    def training_with_its_actors(screen, p):  # the processes below the learner, as the terminal closes
        seen.update(pid=p.pid, kids=_descendants(p.pid))
        up = wandb == "disabled" or "upload this run later" in screen  # (W&B wraps stdout once it is up)
        return up and screen.count(" sps ") >= 3 and len(seen["kids"]) >= 3  # (the fork server and two actors)

    rc, text = run_in_terminal(["train.py", "runner=process", "actors=2", "total_env_steps=50000000",
                                f"tracking.wandb.mode={wandb}", "tracking.console_every_s=0.2",
                                f"hydra.run.dir={tmp_path}"], controlling=True, timeout=120,
                               hang_up_when=training_with_its_actors)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == "interrupted" and balanced(s["transport"]), text[-3000:]
    assert not _wait_gone(seen["kids"]) and not leftover_segments(seen["pid"])
    assert s["actor_restarts"] == 0 and (tmp_path / "checkpoints" / "final.pt").exists()
    assert "laglab: completed" not in (tmp_path / "train.log").read_text()  # (the footer says interrupted)
    assert rc == 130


@pytest.mark.parametrize("to", ["group SIGTERM", "group SIGHUP", "learner SIGTERM", "learner SIGTERM as Ray starts"])
def test_a_signal_stops_a_ray_run_with_a_local_instance_at_a_safe_point(tmp_path, to):
    """runner=ray starting its own Ray instance: a SIGTERM or SIGHUP to the run's process group (a closed
    terminal, `kill -TERM -- -<pgid>`) stops it as it stops the other runners. Before, Ray's GCS and raylet were
    in the group and ended at once under the run, and even a SIGTERM to the learner alone met the handlers
    ray.init installs (SystemExit at any instant, then an abort with a C++ stack dump): status failed or no
    summary at all; a SIGTERM while ray.init ran failed the run with exit code 15). Afterwards no process the run
    started is left (Ray's included)."""
    pytest.importorskip("ray")
    sig = signal.SIGHUP if "SIGHUP" in to else signal.SIGTERM
    p = _start(tmp_path, "total_env_steps=50000000", runner="ray", actors=2, start_new_session=True,
               preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 180
        while True:  # until the run has written metrics and both Ray actors run (or, as Ray starts, its GCS runs)
            assert p.poll() is None, p.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the run did not start"
            kids = _descendants(p.pid)
            if "starts" in to:
                if any(b"gcs_server" in _cmdline(k) for k in kids):
                    break
            elif ((tmp_path / "metrics.parquet").exists()
                  and sum(b"RolloutWorker" in _cmdline(k) for k in kids) >= 2):
                break
            time.sleep(0.05)
        kids = _descendants(p.pid)  # the GCS, the raylet, its agents and workers
        roots = {m.group(1) for k in kids for m in [re.search(rb"--session-dir=(\S+?)/session_", _cmdline(k))] if m}
        (os.killpg if to.startswith("group") else os.kill)(p.pid, sig)
        _, err = p.communicate(timeout=120)
    finally:
        _kill_if_running(p)
    err = err.decode(errors="replace")
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == "interrupted", (s.get("error"), err[-3000:])
    assert "Traceback" not in err and "SIGTERM received" not in err, err[-3000:]
    if "transport" in s:
        assert balanced(s["transport"]) and s["actor_restarts"] == 0
    else:  # stopped before the runner's books began: nothing was produced
        assert "starts" in to and s["env_steps"] == 0
    assert p.returncode == 130 and not _wait_gone(kids, 30)
    # Ray's session was in the run's own root (not /tmp/ray, where Ray keeps one per run for good), now gone
    assert roots and all(os.path.basename(r).startswith(f"laglab-ray-{p.pid}-".encode()) for r in roots), roots
    assert not _ray_roots(p.pid) and not any(os.path.exists(r) for r in roots)


def _ray_roots(pid):
    """The roots of the local Ray instances laglab's learner ``pid`` started (runners.ray._own_root)."""
    from laglab.lifetime import RAY_PREFIX
    return sorted(n for n in os.listdir(tempfile.gettempdir()) if n.startswith(f"{RAY_PREFIX}{pid}-"))


def test_a_killed_ray_runs_instance_is_stopped_and_removed_by_the_next_start(tmp_path, monkeypatch):
    """`kill -9 -- -<pgid>` of a runner=ray run with its own local instance: the GCS and raylet die with the
    learner (the kernel's parent-death signal), but the raylet's agents outlive it by a minute (they wait on the
    dead GCS to report the raylet's death before they exit), and the instance's session directory stays. The next
    start (its sweep) stops the agents, keeps the run's Ray logs in its run dir and removes the directory."""
    pytest.importorskip("ray")
    import shutil

    from laglab.lifetime import RAY_PREFIX, sweep_dirs
    short = tempfile.mkdtemp(prefix="l", dir="/tmp")  # (a temporary directory of its own, short enough for Ray:
    # no other start's sweep can take the dead run's directory first)
    monkeypatch.setattr(tempfile, "tempdir", short)
    p = _start(tmp_path, "total_env_steps=50000000", runner="ray", actors=2, start_new_session=True,
               env={**os.environ, "TMPDIR": short})
    try:
        deadline = time.monotonic() + 180
        while not ((tmp_path / "metrics.parquet").exists()
                   and sum(b"RolloutWorker" in _cmdline(k) for k in _descendants(p.pid)) >= 2):
            assert p.poll() is None, p.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the run did not start"
            time.sleep(0.05)
        kids = _descendants(p.pid)
        roots = _ray_roots(p.pid)
        assert len(roots) == 1 and any(b"DashboardAgent" in _cmdline(k) for k in kids)
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
    finally:
        _kill_if_running(p)
    try:
        assert os.path.isdir(os.path.join(short, roots[0]))  # left behind ...
        assert roots[0] in sweep_dirs(RAY_PREFIX) and not _ray_roots(p.pid)  # ... for the next start, which takes it
        assert not _wait_gone(kids, 10)  # and what still ran of the instance
        [kept] = (tmp_path / "ray_logs").glob("session_*/raylet.out")  # (the killed run's Ray logs: in its run dir)
        assert kept.stat().st_size > 0
    finally:
        shutil.rmtree(short, ignore_errors=True)


def test_a_failed_ray_run_keeps_its_ray_logs_and_nothing_else(tmp_path, monkeypatch):
    """A runner=ray run that fails with its own local instance: Ray's logs (its processes' and each worker's
    output) are copied to the run dir before the instance's root is removed."""
    ray = pytest.importorskip("ray")
    from laglab.run import run
    from laglab.runners import ray as R
    if ray.is_initialized():  # (the tests' shared instance: this run starts its own)
        ray.shutdown()

    def fails(self):
        raise RuntimeError("the learner broke")

    monkeypatch.setattr(R._Runner, "run", fails)
    released = []
    monkeypatch.setattr(R, "release_dir", lambda root, real=R.release_dir: (
        released.append((root, sorted(os.listdir(root)))), real(root)))
    with pytest.raises(RuntimeError, match="the learner broke"):
        run(pcfg(runner={"name": "ray"}, actors=1, total_env_steps=2048), tmp_path)
    assert not ray.is_initialized()
    [(root, held)] = released
    assert os.path.basename(root).startswith(f"laglab-ray-{os.getpid()}-") and "session_latest" in held
    assert not os.path.exists(root) and not _ray_roots(os.getpid())
    [logs] = (tmp_path / "ray_logs").iterdir()  # (one session's)
    assert logs.name.startswith("session_") and (logs / "raylet.out").stat().st_size > 0
    assert (logs / "gcs_server.out").exists() and not list(logs.glob("python-core-*"))


def test_under_a_long_tmpdir_a_ray_run_keeps_its_session_in_tmp(tmp_path):
    """A TMPDIR too long for Ray's sockets (pytest's, 50-odd bytes: Ray's own layout broke the run with an OSError
    traceback): the run's Ray directory goes in /tmp, the log says so, and it goes with the run."""
    pytest.importorskip("ray")
    base = tmp_path / "t"
    base.mkdir()
    p = subprocess.Popen([sys.executable, "train.py", "runner=ray", "actors=1", "total_env_steps=2048",
                          "tracking.wandb.mode=disabled", f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "TMPDIR": str(base)})
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    said = re.search(r"Ray keeps this run's session in (/tmp/laglab-ray-\d+-\w+): the temporary directory",
                     (tmp_path / "run" / "train.log").read_text())
    assert said and os.path.basename(said.group(1)).startswith(f"laglab-ray-{p.pid}-")
    assert not os.path.exists(said.group(1)) and not (base / "ray").exists()


def test_a_life_file_is_claimed_only_once_its_owner_is_gone(tmp_path, monkeypatch):
    """:func:`lifetime.claim_if_dead`, which judges /dev/shm's runs and the temporary directories: a live
    owner's shared lock keeps it; a dead owner's is claimed, once; a file replaced between the open and the lock
    (another sweep removed it, something new took the name) is not; a missing one is not."""
    import fcntl

    from laglab import lifetime
    life = tmp_path / "life"
    life.touch()
    owner = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time; "
                              "fd = os.open(sys.argv[1], os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_SH); "
                              "print(1, flush=True); time.sleep(600)", str(life)],
                             stdout=subprocess.PIPE, text=True)
    try:
        owner.stdout.readline()
        assert lifetime.claim_if_dead(str(life)) is None  # alive
    finally:
        owner.kill()
        owner.wait()
    fd = lifetime.claim_if_dead(str(life))
    assert fd is not None
    try:
        assert lifetime.claim_if_dead(str(life)) is None  # (exclusive: a second claimant is refused)
    finally:
        os.close(fd)

    def replaced_meanwhile(fd, how, real=fcntl.flock):
        life.unlink()
        life.touch()
        real(fd, how)

    monkeypatch.setattr(lifetime.fcntl, "flock", replaced_meanwhile)
    assert lifetime.claim_if_dead(str(life)) is None
    monkeypatch.undo()
    assert lifetime.claim_if_dead(str(tmp_path / "none")) is None


_AFTER_RAY = """
import os, signal, sys, time
sys.path.insert(0, sys.argv[1])
import ray
from laglab.runners import ray as R
got = []
handlers = {signal.SIGTERM: lambda s, f: got.append(s)}
signal.signal(signal.SIGTERM, handlers[signal.SIGTERM])
with R._own_session(True), R._no_crash_handler():
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level="error",
             _temp_dir=sys.argv[2])
R._restore(handlers)
os.kill(os.getpid(), signal.SIGTERM)
ray.shutdown()
R._restore(handlers)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.2)
print(len(got))
"""


def test_the_stop_handler_takes_sigterm_while_ray_runs_and_after_it_shuts_down():
    """A second SIGTERM (or a sweep's next one) can come after ray.shutdown(): it must still reach the run's
    handler. (Ray's driver-side crash handler left SIGTERM at its default action when Ray shut down while Python's
    table still named the run's handler: the process died of the signal, with no summary.)"""
    pytest.importorskip("ray")
    import conftest
    p = subprocess.run([sys.executable, "-c", _AFTER_RAY, str(ROOT / "platform"), conftest.ray_root()],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.split()[-1] == "2", (p.returncode, p.stderr[-2000:])


def test_under_nohup_a_sighup_to_the_group_changes_nothing(tmp_path):
    """`nohup python train.py ...`: SIGHUP ignored by whoever started the run stays ignored by the learner and its
    actors, so closing the terminal neither stops the run nor its actors (nothing restarts)."""
    p = _start(tmp_path, "total_env_steps=150000", start_new_session=True,
               preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    try:
        _wait_for_actors(p, tmp_path, 4)
        os.killpg(p.pid, signal.SIGHUP)
        _, err = p.communicate(timeout=300)
    finally:
        _kill_if_running(p)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert p.returncode == 0 and s["status"] == "completed", err.decode(errors="replace")[-3000:]
    assert s["actor_restarts"] == 0 and balanced(s["transport"])


def test_process_runner_is_refused_where_stores_are_not_kept_in_order(monkeypatch):
    import platform

    from laglab.config import ConfigError
    from laglab.run import env_spec
    from laglab.runners.slots import check_fits
    cfg = pcfg()
    check_fits(cfg, env_spec(cfg))
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    with pytest.raises(ConfigError, match=r"runner=process.*x86-64.*aarch64.*runner=thread"):
        check_fits(cfg, env_spec(cfg))


_LOCAL_INSTANCE = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
import ray
from laglab.runners import ray as R
mine = lambda s, f: None
signal.signal(signal.SIGTERM, mine)
try:
    with R.local_instance(num_cpus=1):
        session = ray._private.worker._global_node.get_session_dir_path()
        @ray.remote
        def one():
            return os.getpid()
        print(session, os.path.isdir(session), ray.get(one.remote()), flush=True)
        if sys.argv[2] == "nested":  # a second one while this one runs: refused, this one left running
            try:
                with R.local_instance():
                    pass
            except RuntimeError:
                print("refused", ray.is_initialized(), flush=True)
        if sys.argv[2] == "raise":
            raise KeyError("the body failed")
except KeyError:
    print("raised", flush=True)
print("handler", signal.getsignal(signal.SIGTERM) is mine, flush=True)
"""


@pytest.mark.parametrize("how", ["ok", "raise", "nested"])
def test_a_tools_local_ray_instance_leaves_nothing(tmp_path, how):
    """benchmarks/throughput.py's Ray path (laglab.runners.ray.local_instance): the session in a directory of
    laglab's, as a run's, and nothing of it left after, however its body ends (a plain ray.init kept it in
    $TMPDIR/ray for good); the process's SIGTERM handler is its own again; inside another it is refused without
    shutting down the one that runs."""
    pytest.importorskip("ray")
    env = dict(os.environ, TMPDIR=str(tmp_path))
    env.pop("RAY_TMPDIR", None)
    p = subprocess.run([sys.executable, "-c", _LOCAL_INSTANCE, str(ROOT / "platform"), how], capture_output=True,
                       text=True, timeout=180, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    session, made, worker = lines[0].split()
    assert made == "True" and os.path.basename(os.path.dirname(session)).startswith("laglab-ray-"), session
    assert lines[1:] == {"ok": [], "raise": ["raised"], "nested": ["refused True"]}[how] + ["handler True"], lines
    assert not os.path.exists(os.path.dirname(session)), "the instance's directory outlived it"
    assert not (tmp_path / "ray").exists() and not os.path.exists(f"/proc/{worker}"), list(tmp_path.iterdir())


def test_ray_lets_go_of_each_dead_actor(tmp_path, monkeypatch):
    """runner=ray: a restarted slot's dead life is dropped (its handle, so Ray frees the actor), not kept for the
    rest of the run."""
    from conftest import ray_up
    ray_up()
    import laglab.runners.ray as R
    from laglab.run import run
    from test_protocol import on
    held = []
    supervise = R._Runner.supervise

    def counted(self):
        held.append(len(self.workers))
        return supervise(self)

    monkeypatch.setattr(R._Runner, "supervise", counted)
    s = run(on("ray", runner={"actors_max_restarts": 10**6}, chaos={"name": "kill", "kill_every_steps": 256},
               total_env_steps=8192), tmp_path)
    assert s["status"] == "completed" and balanced(s["transport"])
    assert s["actor_restarts"] >= 10, s["actor_restarts"]
    assert max(held) <= 2 + 2, max(held)  # two live lives, and at most one per slot whose death is being booked


def test_a_learner_crash_then_resume_admits_nothing_twice_and_repeats_no_incarnation(tmp_path):
    """Delivery semantics across a learner crash (process runner): SIGKILL the learner mid-run, after actor
    restarts it made since its last checkpoint; resume from that checkpoint. The dead run's actors are gone
    before the resume starts; the resumed run starts its budget at the checkpoint's env steps, its books count
    only what it produced, nothing is misattributed (the tagged env), and its incarnations continue past every
    one the dead run handed out."""
    import torch

    from laglab.learner import read_incarnation_mark
    dead_dir, new_dir = tmp_path / "dead", tmp_path / "resumed"
    common = ["env=tagged", "actors=2", "learner.checkpoint_every=4", "chaos.kill_every_steps=1024",
              "runner.actors_max_restarts=1000"]
    p = _start(dead_dir, *common, "total_env_steps=50000000")
    try:
        kids = _wait_for_actors(p, dead_dir, 2)
        latest = dead_dir / "checkpoints" / "latest.pt"
        deadline = time.monotonic() + 120
        while True:  # a checkpoint exists, and actors were restarted after it
            assert time.monotonic() < deadline and p.poll() is None
            if latest.exists():
                ck = torch.load(latest, weights_only=True)
                if int(ck["updates"]) >= 8:
                    break
            time.sleep(0.05)
        kids = _descendants(p.pid)  # (every life alive now: once the learner is gone they are reparented)
        os.kill(p.pid, signal.SIGKILL)
        assert not _wait_gone(kids)
    finally:
        if p.poll() is None:
            p.kill()
        p.communicate()
    ck = torch.load(latest, weights_only=True)
    mark = read_incarnation_mark(latest.parent)
    assert mark > int(ck["next_incarnation"])
    start_steps = int(ck["env_steps"])
    total = start_steps + 16384
    out = subprocess.run([sys.executable, "train.py", "runner=process", "tracking.wandb.mode=disabled",
                          f"hydra.run.dir={new_dir}", *common, f"resume={dead_dir}", f"total_env_steps={total}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    s = json.loads((new_dir / "summary.json").read_text())
    t = s["transport"]
    assert s["status"] == "completed" and balanced(t) and t["misattributed"] == 0
    assert s["start_env_steps"] == start_steps and s["env_steps"] == total
    assert t["produced"] == total - start_steps  # its books hold its own production only
    assert t["admitted"] <= t["produced"]
    final = torch.load(new_dir / "checkpoints" / "final.pt", weights_only=True)
    first_new = int(final["next_incarnation"]) - (2 + s["actor_restarts"])  # it handed out one per life
    assert first_new >= mark, (first_new, mark, int(ck["next_incarnation"]))


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_actors_inside_a_long_env_step_die_with_the_learner(tmp_path, start_method):
    """An actor that is inside a 1.5 s env step looks at no lifeline: the kernel's parent-death signal takes it
    (under forkserver through the fork server, which must itself go with the learner)."""
    p = _start(tmp_path, f"runner.start_method={start_method}", "env=latency", "env.latency_ms=[1500]",
               "actors=2", "total_env_steps=50000000")
    try:
        deadline = time.monotonic() + 120
        while True:
            assert p.poll() is None and time.monotonic() < deadline
            kids = _descendants(p.pid)
            if len(kids) >= 3 and (tmp_path / "actors.log").exists():  # (2 actors + the tracker or fork server)
                break
            time.sleep(0.1)
        time.sleep(3.0)  # well inside their rollouts of 1.5 s steps
        kids = _descendants(p.pid)
        os.kill(p.pid, signal.SIGKILL)
        t0 = time.monotonic()
        left = _wait_gone(kids, 10.0)
        print(f"{start_method}: every process below the learner gone {time.monotonic() - t0:.2f} s after its death")
        assert not left, [(k, Path(f"/proc/{k}/cmdline").read_bytes()[:80]) for k in left]
        p.communicate(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_a_run_in_another_pid_namespace_is_not_swept(tmp_path):
    """`docker --ipc=host` and `unshare -p`: another namespace sees our /dev/shm but not our pids. Whether a run
    is alive is decided by a lock its learner holds, not by its pid, so a sweep there leaves a live run alone."""
    import shutil
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-pf", "--mount-proc", "true"]).returncode:
        pytest.skip("unshare -p is not available here")
    live = _start(tmp_path, "total_env_steps=50000000", start_new_session=True)
    try:
        _wait_for_actors(live, tmp_path, 4)
        mine = leftover_segments(live.pid)
        out = subprocess.run(["unshare", "-pf", "--mount-proc", sys.executable, "-c",
                              "from laglab.shm import sweep_stale; print(sweep_stale())"],
                             capture_output=True, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT / "platform")})
        assert out.returncode == 0, out.stderr
        assert not set(mine) & set(eval(out.stdout)), out.stdout
        assert leftover_segments(live.pid) == mine and live.poll() is None
    finally:
        os.killpg(live.pid, signal.SIGTERM)
        live.communicate(timeout=120)


def test_a_group_sigterm_while_actors_restart_interrupts_the_run(tmp_path):
    """Actors die and restart all the time (a kill every rollout, no backoff), so the SIGTERM reaches some of them
    before they can act on it: the run still ends interrupted, not failed, and nothing restarts after it."""
    s, err, _, rc, _ = _sigterm_the_group(tmp_path, 2, "actors=2", "total_env_steps=50000000", "chaos.kill_every_steps=256",
                                       "runner.restart_backoff_s=0", "runner.actors_max_restarts=100000")
    assert s["status"] == "interrupted" and "error" not in s, (s.get("error"), err[-2000:])
    assert rc == 130 and balanced(s["transport"])


def test_budget_a_killed_actor_reserved_and_never_reported_is_given_back(tmp_path):
    """Actors SIGKILLed from outside while inside env steps (after reserving a rollout, before reporting it):
    the learner gives back exactly what they reserved, so the budget used is what was produced."""
    import multiprocessing as mp
    import random
    import threading

    from laglab.run import run
    stop, killed = threading.Event(), []

    def killer():
        rng = random.Random(0)
        while len(killed) < 5 and not stop.wait(1.5):
            kids = [c for c in mp.active_children() if c.name.startswith("laglab-actor") and c.pid]
            if kids:
                k = rng.choice(kids)
                try:
                    os.kill(k.pid, signal.SIGKILL)
                    killed.append(k.pid)
                except ProcessLookupError:
                    pass

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    try:
        s = run(pcfg(env={"id": "laglab/Latency-v0", "latency_ms": [5]}, actor={"envs_per_actor": 2, "rollout_len": 16},
                     learner={"batch_size": 64, "minibatches": 1, "epochs": 1},
                     runner={"actors_max_restarts": 10**6}, total_env_steps=3072), tmp_path)
    finally:
        stop.set()
        t.join()
    tr = s["transport"]
    assert s["status"] == "completed" and balanced(tr)
    assert len(killed) >= 3 and tr["queue"]["budget_released"] > 0, (len(killed), tr["queue"]["budget_released"])
    assert s["env_steps"] == tr["produced"]  # nothing reserved stays unaccounted for in the budget


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_ctrl_c_while_actors_start_prints_no_traceback(tmp_path, start_method):
    """Ctrl-C reaches the whole foreground group, also actors still importing (here they restart all the time):
    they start with it blocked and ignore it before unblocking, so no KeyboardInterrupt traceback reaches the
    terminal, and the run ends interrupted."""
    p = _start(tmp_path, "actors=2", "total_env_steps=50000000", "chaos.kill_every_steps=256",
               f"runner.start_method={start_method}", "runner.restart_backoff_s=0",
               "runner.actors_max_restarts=100000", start_new_session=True)
    try:
        _wait_for_actors(p, tmp_path, 2)
        end = time.monotonic() + 1.0
        while time.monotonic() < end:  # ^C after ^C at the actors (some are starting), not at the learner ...
            for k in _descendants(p.pid):
                try:
                    os.kill(k, signal.SIGINT)
                except ProcessLookupError:
                    pass
            time.sleep(0.005)
        os.killpg(p.pid, signal.SIGINT)  # ... then one for the whole group: the run stops
        _, err = p.communicate(timeout=120)
    finally:
        _kill_if_running(p)
    err = err.decode(errors="replace")
    assert "KeyboardInterrupt" not in err and "Traceback" not in err, err[-3000:]
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "interrupted"


def test_ray_keeps_its_own_way_where_the_user_chose_its_directory(monkeypatch):
    """RAY_TMPDIR names where Ray keeps its sessions (even empty, as Ray reads it): a run then leaves Ray's
    directory to Ray."""
    pytest.importorskip("ray")
    from laglab.runners import ray as R
    monkeypatch.setenv("RAY_TMPDIR", "/var/tmp/mine")
    assert R._own_root() == (None, False)  # (nor is the session Ray makes there removed)
    monkeypatch.setenv("RAY_TMPDIR", "")  # (set, if empty: Ray's choice all the same)
    assert R._own_root() == (None, False)
    monkeypatch.delenv("RAY_TMPDIR")
    monkeypatch.setattr(tempfile, "tempdir", "/tmp")
    root, theirs = R._own_root()
    try:
        assert not theirs
        assert root is not None and os.path.basename(root).startswith(f"laglab-ray-{os.getpid()}-")
    finally:
        R._leave({"root": root, "session": None})
    assert not os.path.exists(root)


def test_a_sweep_stops_only_the_dead_instances_ray_processes_and_follows_no_symlink(tmp_path, monkeypatch):
    """What a sweep of a dead learner's Ray directory stops: a process Ray named (ray::...) holding a file in it.
    Not a shell or sleep whose working directory is there, not a `tail` of its logs, not another start holding its
    life file open. A symlink named like one of ours, to a directory with a life file nobody locks, is left alone
    with all it points to (for both kinds of directories)."""
    from laglab import lifetime
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    root = tmp_path / f"{lifetime.RAY_PREFIX}4242-deadbeef"
    (root / "session_x" / "logs").mkdir(parents=True)
    (root / lifetime.LIFE).touch()
    log_file = root / "session_x" / "logs" / "raylet.out"
    log_file.write_text("x\n")
    procs = {
        "ray": subprocess.Popen(["bash", "-c", f"exec -a ray::DashboardAgent sleep 600 3<{log_file}"]),
        "cwd": subprocess.Popen(["sleep", "600"], cwd=root / "session_x"),
        "tail": subprocess.Popen(["tail", "-f", str(log_file)], stdout=subprocess.DEVNULL),
        "life": subprocess.Popen([sys.executable, "-c", "import sys, time; f = open(sys.argv[1]); time.sleep(600)",
                                  str(root / lifetime.LIFE)]),
    }
    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / lifetime.LIFE).touch()
    (victim / "sub" / "keep").touch()
    for prefix in (lifetime.RAY_PREFIX, lifetime.MP_PREFIX):
        (tmp_path / f"{prefix}1-cafecafe").symlink_to(victim)
    try:
        deadline = time.monotonic() + 10
        while not (_cmdline(procs["ray"].pid).startswith(b"ray::") and any(
                os.readlink(f"/proc/{procs['life'].pid}/fd/{f}") == str(root / lifetime.LIFE)
                for f in os.listdir(f"/proc/{procs['life'].pid}/fd"))):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert lifetime.sweep_dirs(lifetime.RAY_PREFIX) == [root.name] and not root.exists()
        assert lifetime.sweep_dirs(lifetime.MP_PREFIX) == []
        assert procs["ray"].wait(timeout=10) == -signal.SIGKILL
        assert all(p.poll() is None for k, p in procs.items() if k != "ray")  # the others live on
        assert (victim / "sub" / "keep").exists() and (victim / lifetime.LIFE).exists()
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def test_a_ray_run_whose_sockets_fit_nowhere_is_refused_with_what_to_set(tmp_path, monkeypatch):
    """Where laglab's directory cannot be made and Ray's own ($TMPDIR/ray) is too long for its socket paths, the
    run is refused with what to set (it was an OSError traceback from inside ray.init)."""
    ray = pytest.importorskip("ray")
    from laglab.config import ConfigError
    from laglab.run import run
    from laglab.runners import ray as R
    if ray.is_initialized():  # (the tests' shared instance: this run starts its own)
        ray.shutdown()
    long = tmp_path / ("x" * 60)
    long.mkdir()
    monkeypatch.setenv("TMPDIR", str(long))
    monkeypatch.setattr(R, "_own_root", lambda: (None, True))
    with pytest.raises(ConfigError, match=r"runner=ray: Ray's socket paths would be longer than 107 .*RAY_TMPDIR"):
        run(pcfg(runner={"name": "ray"}, actors=1, total_env_steps=2048), tmp_path / "run")
    assert not ray.is_initialized() and not (tmp_path / "run" / "ray_logs").exists()
