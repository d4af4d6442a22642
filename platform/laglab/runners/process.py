"""Actor processes, learner in the main process, shared memory between them.

How actors start: one OS process per slot (``runner.start_method``: spawn or forkserver; numpy only, one
BLAS thread). How bytes move: an actor writes each fragment into one of its shared-memory slots and sends a
fixed-layout header down its pipe; the learner's receiver thread copies the slot out (then it is free again),
and the arrival enters the same bounded queue, admission, books and driver as the thread runner's. Snapshots
go the other way through a seqlocked, double-buffered shared-memory block; throttle credits through another.

Faults are real: a scripted kill is a SIGKILL, a scripted hang stops the heartbeat and the supervisor kills
the process. When an actor process is gone and its pipe drained, what it still had in hand is booked by
reason (``actor_crash``, ``abandoned``, ``shutdown``), what was on its link shows up as lost in transit, its
slots are reclaimed, and the slot restarts with a new incarnation within the restart intensity. A child that
fails before it starts fails the run at once with the child's error.
"""
from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import signal
import threading
import time
from multiprocessing.connection import wait as wait_conns
from typing import Any, Dict, List, Optional

import numpy as np

from .. import timeline, wire
from ..accounting import Budget, Ledger
from ..actor import ActorStats, Episode, steps_per_rollout
from ..admission import Admission
from ..recurrent import policy_state_shape
from ..chaos import COUNTED, ChaosCounts
from ..config import Config
from ..envs import EnvSpec
from ..inference import SnapshotCodec
from ..learner import Learner
from ..lifetime import STOP_SIGNALS, Bell, Lifeline
from ..policy import Snapshot
from ..shm import FragmentLayout, RunLife, SeqBlock, SharedCounter, SlotPool, StatusBlock, new_token, segment_name
from ..tracking import Tracker
from ..transport import FragmentQueue
from . import process_actor
from . import ACTOR_ENV, warm_up
from .driver import LearnerDriver, serve
from .slots import check_fits, slots_per_actor
from .endpoint import arrive_at_queue
from .supervisor import ActorFailed, RestartIntensity, stop_requested

__all__ = ["run", "ActorFailed", "slots_per_actor", "check_fits"]

class _Child:
    """One life of an actor slot as the learner sees it."""

    def __init__(self, actor_id: int, inc: int, proc, conn, bell: Bell, reserved0: int):
        self.actor_id, self.inc, self.proc, self.conn = actor_id, inc, proc, conn
        self.bell = bell  # rung when there is news (credit, stop): the child waits on it
        self.reserved0 = reserved0  # the slot's budget word when this life began
        self.exitcode: Optional[int] = None
        self.lock = threading.Lock()  # the receiver closes this life's ends under it; ring and kill look first
        self.closed = False
        self.books = (0, 0, 0)  # last reported: produced, in_hand, link
        self.started = False
        self.done = False
        self.error: Optional[str] = None
        self.abandoned = False
        self.finalized = threading.Event()
        self.t_start = time.monotonic()


class _Slot:
    def __init__(self, actor_id: int):
        self.actor_id = actor_id
        self.child: Optional[_Child] = None
        self.start_at = 0.0
        self.finished = False
        self.stats = ActorStats()


def run(cfg: Config, learner: Learner, tracker: Tracker, spec: EnvSpec, budget: Budget, run_dir) -> Dict[str, Any]:
    check_fits(cfg, spec)
    ctx = mp.get_context(cfg.runner.start_method)
    warm_up(cfg.runner)  # forkserver: the server imports the actor side once (each start is a fork); train.py
    # started it before importing torch
    token = new_token()
    names = process_actor.Names(*(segment_name(token, w) for w in ("slots", "snapshot", "credits", "status",
                                                                       "budget")))
    A, T = cfg.actors, cfg.actor.rollout_len
    per = slots_per_actor(cfg)
    shapes = {k: tuple(v.shape) for k, v in learner.model.state_dict().items()}
    codec = SnapshotCodec(shapes, spec.obs_shape)
    made: List[Any] = []
    try:
        made.append(RunLife(segment_name(token, "life")))  # first: the proof the run is alive, held to the end
        pool = SlotPool(FragmentLayout(spec, T, policy_state_shape(cfg.policy)), A, per, names.slots, True)
        made.append(pool)
        snap_block = SeqBlock(codec.size, "float32", names.snapshot, True)
        made.append(snap_block)
        credits = SeqBlock(2 * A, "int64", names.credits, True)
        made.append(credits)
        status = StatusBlock(A, names.status, True)
        made.append(status)
        counter = SharedCounter(names.budget, True, A, budget.total, budget.used)
        made.append(counter)
        lifeline = Lifeline(ctx)
        made.append(lifeline)
        return _Runner(cfg, learner, tracker, spec, budget, run_dir, ctx, names, shapes, per, pool, snap_block,
                       credits, status, counter, codec, lifeline).run()
    finally:
        for res in reversed(made):  # (the life file last)
            if isinstance(res, SharedCounter):
                budget.used = res.used
            if isinstance(res, Lifeline):
                res.close()
            else:
                res.close(unlink=True)


class _Runner:
    def __init__(self, cfg, learner, tracker, spec, budget, run_dir, ctx, names, shapes, per, pool, snap_block,
                 credits, status, counter, codec, lifeline):
        self.cfg, self.learner, self.tracker, self.spec = cfg, learner, tracker, spec
        self.lifeline = lifeline
        self.log_path = str(run_dir / "actors.log")
        self.ctx, self.names, self.shapes, self.per = ctx, names, shapes, per
        self.pool, self.snap_block, self.credits, self.status, self.counter = pool, snap_block, credits, status, counter
        self.codec = codec
        self.poll = cfg.runner.poll_s
        T = cfg.actor.rollout_len
        self.per_rollout = steps_per_rollout(cfg)
        self.ledger = Ledger(T, cfg.actor.envs_per_actor, cfg.transport.dedup_window, learner.allocate_incarnation)
        self.admission = Admission(spec, cfg.actors, cfg.actor.envs_per_actor, cfg.transport.duplicates, T,
                                   policy_state_shape(cfg.policy))
        self.queue = FragmentQueue(cfg.transport.capacity, cfg.transport.max_bytes, cfg.transport.policy,
                                   on_discard=lambda f, first, bucket, reason:
                                   self.ledger.book(bucket, reason, f.length) if first is True else None)
        self.intensity = RestartIntensity(cfg.runner.actors_max_restarts, cfg.runner.restart_window_s)
        self.slots = [_Slot(i) for i in range(cfg.actors)]
        self.first_steps = timeline.FirstSteps(cfg.actors)  # each slot's first env step (start-up)
        self.children: List[_Child] = []  # lives not yet finalized (a finalized one has released everything)
        self.by_conn: Dict[Any, _Child] = {}
        self.conn_lock = threading.Lock()
        self.chaos = ChaosCounts()
        self.reclaimed = 0
        self.budget_released = 0  # env steps reserved by lives that died before reporting them, given back
        self.malformed = 0
        self.receive_s = 0.0  # the receiver thread, per arrived message: reading the pipe, copying, handling
        self.stopping = threading.Event()
        self.receiver_error: Optional[BaseException] = None
        self.last_version = learner.version
        self.granted: Dict[int, int] = dict(learner.consumed)
        self.driver = LearnerDriver(cfg, learner, tracker, counter, self.admission, self.ledger,
                                    publish=self.publish, link_steps=self.link_steps,
                                    queue_steps=self.queue.first_steps, gauges=self.gauges,
                                    actors=self.actor_stats, checkpoint_dir=run_dir / "checkpoints",
                                    raise_actors=self.raise_actors)
        self.child_cfg = cfg  # what a new actor life starts with (its niceness raised once the actors starved)

    # ---- learner -> actors ------------------------------------------------------------------------------------
    def publish(self, snap: Snapshot) -> None:
        self.snap_block.publish(self.codec.encode(snap), snap.version)
        self.grant(snap.consumed)

    def grant(self, consumed) -> None:
        self.granted = dict(consumed)
        c = np.zeros(2 * self.cfg.actors, np.int64)
        for s in self.slots:
            if s.child is not None:
                c[2 * s.actor_id] = s.child.inc
                c[2 * s.actor_id + 1] = consumed.get(s.child.inc, 0)
        self.credits.publish(c, int(self.credits.version()) + 1)
        self.ring()

    def ring(self) -> None:
        """Wake every live child waiting for news (after the news is published, so no wake-up is lost)."""
        for s in self.slots:
            c = s.child
            if c is not None:
                with c.lock:
                    if not c.closed:
                        c.bell.ring()

    # ---- readings ---------------------------------------------------------------------------------------------
    def link_steps(self) -> int:
        with self.conn_lock:
            return sum(c.books[2] for c in self.children if not c.finalized.is_set())

    def gauges(self) -> Dict[str, float]:
        return {"transport/queue_depth": float(self.queue.depth), "transport/queue_bytes": float(self.queue.bytes),
                "transport/slots_in_use": float(np.count_nonzero(self.pool.state)),
                "transport/slots_reclaimed": float(self.reclaimed),
                "transport/receive_s": self.receive_s}  # the receiver's own time so far (reading, copying, books)

    def actor_stats(self) -> Dict[int, ActorStats]:
        out = {}
        for s in self.slots:
            r = self.status.row(s.actor_id)
            st = ActorStats(**{f.name: type(f.default)(r[f.name]) for f in dataclasses.fields(ActorStats)})
            if not st.loads:
                st.version = -1
            s.stats = st
            out[s.actor_id] = st
            self.first_steps.saw(s.actor_id, float(r["first_step"]))  # (start-up)
        return out

    def raise_actors(self, target: int) -> Optional[str]:
        """Starved actors (LearnerDriver._watch_cpu): give every live actor process, each of its threads, the
        niceness ``target`` (the learner's), and every later life the learner's too (it forks from the learner's
        niceness and adds none). None when done; else why the OS refused (lowering a niceness takes CAP_SYS_NICE,
        root, or an RLIMIT_NICE that allows it)."""
        for slot in self.slots:
            c = slot.child
            pid = c.proc.pid if c is not None else None
            if pid is None:
                continue
            try:
                tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
            except OSError:  # (gone, or no /proc: the process itself)
                tids = [pid]
            for tid in tids:
                try:
                    os.setpriority(os.PRIO_PROCESS, tid, target)
                except ProcessLookupError:
                    continue
                except PermissionError as e:
                    return f"setpriority: {e.strerror} (lowering a niceness takes root, CAP_SYS_NICE or RLIMIT_NICE)"
        self.child_cfg = dataclasses.replace(self.cfg, runner=dataclasses.replace(self.cfg.runner, actor_nice=0))
        return None

    # ---- children ---------------------------------------------------------------------------------------------
    def start(self, slot: _Slot) -> None:
        inc = self.ledger.new_incarnation(slot.actor_id)
        reserved0 = self.counter.reserved(slot.actor_id)  # (before the child can reserve anything)
        r, w = self.ctx.Pipe(duplex=False)
        bell = Bell(self.ctx)
        proc = self.ctx.Process(target=process_actor.main, name=f"laglab-actor-{slot.actor_id}",
                                args=(self.child_cfg, slot.actor_id, inc, self.names, self.shapes, self.spec,
                                      self.per, w, bell.wait_end, self.lifeline.child_end, self.log_path,
                                      {**os.environ, **ACTOR_ENV}),
                                daemon=True)
        spawn = self.cfg.runner.start_method == "spawn"  # (a fork server has ACTOR_ENV since its start)
        saved = {v: os.environ.get(v) for v in ACTOR_ENV} if spawn else {}
        # Ctrl-C and SIGTERM reach the whole process group, also a child that is still importing, before it can
        # ignore them (a KeyboardInterrupt traceback on the user's terminal): it starts with both blocked (the
        # mask survives fork and exec) and unblocks them once it handles them itself. Blocked, not ignored: a
        # signal for the learner in this window waits instead of being lost.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # (SIGHUP too: a closed terminal)
        try:
            if spawn:
                os.environ.update(ACTOR_ENV)  # one BLAS thread in the child: it must be there when numpy loads
            else:
                warm_up(self.cfg.runner)  # (a server that died mid-run restarts as warm_up starts it)
            proc.start()
        except BaseException:
            r.close()
            bell.close_ring_end()
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            w.close()  # the child holds the only write end: its exit is our EOF
            bell.close_wait_end()  # and the only end it waits on
            for v, old in saved.items():
                if old is None:
                    os.environ.pop(v, None)
                else:
                    os.environ[v] = old
        child = _Child(slot.actor_id, inc, proc, r, bell, reserved0)
        with self.conn_lock:
            self.children.append(child)
            self.by_conn[r] = child
        slot.child = child
        self.grant(self.granted)  # the credit block names the new incarnation (no credit yet)

    def apply_books(self, child: _Child, books) -> None:
        """Take the sender's reported books (under the ledger's lock)."""
        p0, h0, _ = child.books
        led = self.ledger
        led.produced += books[0] - p0
        led.in_hand += books[1] - h0
        child.books = tuple(books)

    def handle(self, child: _Child, data: bytes) -> None:
        try:
            m = wire.parse(data)
        except ValueError:
            self.malformed += 1
            return
        led = self.ledger
        if m.kind == wire.FRAG:
            if m.slot not in self.pool.partition(child.actor_id) or self.pool.state[m.slot] != 1:
                self.malformed += 1  # not a slot this actor filled: nothing to read (its books come next)
                with led.lock:
                    self.apply_books(child, m.books)
                return
            frag = self.pool.read(m.slot, m.fid, m.k)
            arrive_at_queue(led, self.queue, frag, lambda: child.abandoned, lambda: self.apply_books(child, m.books),
                            lambda _: None, self.poll)
            return
        with led.lock:
            self.apply_books(child, m.books)
            if m.kind == wire.SENT:
                env_index, t_end, _ = m.sent
                led.mark_sent(child.inc, env_index, t_end)
            elif m.kind == wire.DISCARDED:  # its steps came as produced with these books: booked in the same hold
                led.book("dropped", "refresh", m.discarded)
                for env_index in range(self.cfg.actor.envs_per_actor):
                    led.skip(child.inc, env_index, m.skip_to)
        if m.kind in (wire.PRODUCED, wire.DISCARDED):
            self.tracker.add_episodes([Episode(child.actor_id, int(e["env_index"]), float(e["ret"]), int(e["length"]))
                                       for e in m.episodes], self.counter.used)
        elif m.kind == wire.STARTED:
            child.started = True
        elif m.kind == wire.DONE:
            child.done = True
        elif m.kind == wire.ERROR:
            child.error = m.text

    def finalize(self, child: _Child) -> None:
        """The child's pipe is drained (EOF): book what died with it, release the budget it reserved and never
        reported, reclaim its slots (once it is surely gone), merge its chaos counts, and release what this life
        held (its process handle and bell: a run with thousands of restarts holds only its live children's)."""
        child.proc.join(timeout=5)
        if child.proc.is_alive():
            child.proc.kill()
            child.proc.join(timeout=5)
        # a life that ended while the run was asked to stop ended with it (a group SIGTERM reaches the actors too,
        # some before they can act on it): shutdown, whatever its exit
        reason = ("shutdown" if child.done or self.stopping.is_set() or stop_requested() else
                  "abandoned" if child.abandoned else "actor_crash")
        led = self.ledger
        with led.lock:
            led.unsent(child.books[1], reason)
            child.books = (child.books[0], 0, 0)  # what was on its link is gone: detected as lost in transit
            self.reclaimed += self.pool.reclaim(child.actor_id)
        unreported = self.counter.reserved(child.actor_id) - child.reserved0 - max(0, child.books[0])
        if unreported > 0:
            self.counter.release(child.actor_id, unreported)  # reserved for a rollout that never reached us
            self.budget_released += unreported
        r = self.status.row(child.actor_id)
        if int(r["incarnation"]) == child.inc:
            c = ChaosCounts(duplicated=int(r["duplicated"]), reordered=int(r["reordered"]), delayed=int(r["delayed"]),
                            dropped_steps=int(r["dropped_steps"]), kills=int(r["kills"]), hangs=int(r["hangs"]))
            for k in COUNTED:
                if r[f"corrupted_{k}"]:
                    c.corrupted[k] = int(r[f"corrupted_{k}"])
                    c.corrupted_steps[k] = int(r[f"corrupted_steps_{k}"])
            c.lost_held_steps = int(r["lost_held_steps"])
            self.chaos.merge(c)
        with child.lock:  # (its process handle is dropped with the life: multiprocessing reaps and frees it)
            child.exitcode = child.proc.exitcode
            child.bell.close_ring_end()
            child.closed = True
        with self.conn_lock:
            self.children.remove(child)
        led.retire(child.inc)  # its pipe is drained: nothing of it can arrive any more
        child.finalized.set()

    def receive(self) -> None:
        """The receiver thread: read every child's pipe in order; finalize a child at its EOF."""
        try:
            while True:
                with self.conn_lock:
                    conns = list(self.by_conn)
                if not conns:
                    if self.stopping.is_set():
                        return
                    time.sleep(self.poll)
                    continue
                for conn in wait_conns(conns, timeout=self.poll):
                    child = self.by_conn[conn]
                    t0, blocked0 = time.perf_counter(), self.queue.stats.blocked_s
                    try:
                        data = conn.recv_bytes(maxlength=1 << 24)
                    except (EOFError, OSError):
                        with self.conn_lock:
                            del self.by_conn[conn]
                        conn.close()
                        self.finalize(child)
                        continue
                    try:
                        parts = wire.split(data)
                    except ValueError:
                        self.malformed += 1
                        continue
                    for part in parts:
                        self.handle(child, part)
                    # its own work: the time waiting for room in a full queue is the queue's (blocked_s)
                    self.receive_s += time.perf_counter() - t0 - (self.queue.stats.blocked_s - blocked0)
        except BaseException as e:  # noqa: BLE001 - surfaces in the learner loop
            self.receiver_error = e

    def supervise(self) -> bool:
        if self.receiver_error is not None:
            raise RuntimeError("the process runner's receiver failed") from self.receiver_error
        if stop_requested():
            return True  # the run stops at its next safe point: no restarts, no failures of lives it stopped
        now = time.monotonic()
        live = False
        rc = self.cfg.runner
        for slot in self.slots:
            if slot.finished:
                continue
            live = True
            c = slot.child
            if c is None:
                if now >= slot.start_at:
                    self.start(slot)
                continue
            if c.finalized.is_set():
                if c.done:
                    if self.counter.has_room(self.per_rollout) and not stop_requested():
                        # it stopped while there is budget and nobody asked the run to stop: somebody sent it a
                        # SIGTERM. Its books say shutdown; the slot goes on with a new life (not a failure)
                        slot.child = None
                        slot.start_at = now + rc.restart_backoff_s
                        continue
                    slot.finished = True
                    continue
                if not c.started and (c.error or (c.exitcode or 0) >= 0):  # (killed by a signal: a crash)
                    raise ActorFailed(f"actor {slot.actor_id} could not start (exit code {c.exitcode}):\n"
                                      f"{c.error or 'no error text'}")
                why = c.error or ("abandoned: no heartbeat" if c.abandoned else f"exit code {c.exitcode}")
                self.intensity.record(slot.actor_id, why)
                slot.child = None
                slot.start_at = now + rc.restart_backoff_s
                continue
            if c.abandoned:
                continue  # killed; its EOF is on the way
            if not c.started:
                if now - c.t_start > rc.start_timeout_s:
                    raise ActorFailed(f"actor {slot.actor_id} did not start within {rc.start_timeout_s}s "
                                      "(runner.start_timeout_s)")
                continue
            if not c.done and now - self.status.get(slot.actor_id, "beat") > rc.heartbeat_timeout_s:
                c.abandoned = True
                self.kill(c)
        return live

    def kill(self, child: _Child) -> None:
        with child.lock:
            if child.closed:
                return
            try:
                child.proc.kill()  # SIGKILL (a no-op once reaped: the receiver reaps only after it looked here)
            except (ValueError, AttributeError, OSError):
                pass

    def run(self) -> Dict[str, Any]:
        self.publish(self.learner.snapshot())
        receiver = threading.Thread(target=self.receive, name="laglab-receiver", daemon=True)
        receiver.start()
        for slot in self.slots:
            self.start(slot)
        timeline.mark("actors_started")
        try:
            serve(self.queue, self.driver, self.supervise, self.grant, self.cfg)
        except BaseException as e:
            cpu = self.driver.cpu_summary()  # (now: the actors' stats are released before the books are read)
            e.laglab_books = lambda: {**self.driver.summary(self.driver.close(), self.intensity.total,
                                                            self.chaos.as_dict()), "cpu": cpu}
            raise
        finally:
            self.stopping.set()
            self.counter.stop()
            self.ring()
            with self.ledger.lock:
                self.queue.close()
            # every life ends by itself (stop flag, bell) and the receiver books it at its EOF; one that does not
            # within 10 s is killed. (Only the receiver joins and reaps: this thread just waits for its books.)
            deadline = time.monotonic() + 10
            with self.conn_lock:
                live = list(self.children)
            for c in live:  # (a second stop signal: stop now, kill what has not ended)
                while (not c.finalized.wait(0.05) and receiver.is_alive() and time.monotonic() < deadline
                       and stop_requested() < 2):
                    pass
            for c in live:
                if not c.finalized.is_set():
                    self.kill(c)
                    if receiver.is_alive():
                        c.finalized.wait(10)
                    else:  # (the receiver failed: nobody else will reap it)
                        c.proc.join(5)
            receiver.join(timeout=30)
        bal = self.driver.close()
        chaos = self.chaos.as_dict()
        queue_info = {"max_depth": self.queue.stats.max_depth, "max_bytes": self.queue.stats.max_bytes,
                      "blocked_s": self.queue.stats.blocked_s, "capacity": self.queue.capacity,
                      "max_bytes_bound": self.queue.max_bytes, "slots": self.pool.n,
                      "slots_reclaimed": self.reclaimed, "malformed_messages": self.malformed,
                      "budget_released": self.budget_released,
                      "actors_with_torch": int(sum(self.status.get(s.actor_id, "torch_loaded") for s in self.slots))}
        out = self.driver.summary(bal, self.intensity.total, chaos, {"queue": queue_info})
        out.update({"actor_stats": self.actor_stats(), "env_steps": self.counter.used})
        return out

