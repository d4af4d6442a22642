"""The body of one actor process (one incarnation). It never imports torch: inference is numpy, the snapshot
comes from a seqlocked shared-memory block, fragments go into this actor's shared-memory slots and a
fixed-layout header goes down its pipe. Chaos runs here too: a scripted kill is a real SIGKILL of this
process, a scripted hang stops its heartbeat until the supervisor kills it."""
from __future__ import annotations

import dataclasses

import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from .. import wire
from ..actor import Actor, run_delay_s, steps_per_rollout, throttle_state
from ..chaos import CORRUPTIONS, COUNTED, ChaosChannel, kinds_for

SLOT_CORRUPTIONS = tuple(k for k in CORRUPTIONS if k != "shape")  # a slot has the layout's shapes by construction
from ..config import Config
from ..fragment import Fragment
from ..inference import SnapshotCodec
from ..recurrent import policy_state_shape
from ..lifetime import STOP_SIGNALS, Bell, Lifeline, die_with_parent, forget_fork_server
from ..shm import FragmentLayout, SeqBlock, SharedCounter, SlotPool, StatusBlock


@dataclass
class Names:
    slots: str
    snapshot: str
    credits: str
    status: str
    budget: str


class _Books:
    """This incarnation's side of the ledger: produced, in hand, on its link (header not yet sent)."""

    def __init__(self, ch: ChaosChannel):
        self.ch = ch
        self.produced = 0
        self.in_hand = 0
        self.headered: Dict[Tuple[int, int], int] = {}  # fragments whose header went out, still on the link

    def link(self) -> int:
        keys = {}
        for f in self.ch.contents():
            key = (f.id.env_index, f.id.t_start)
            if key not in self.headered:
                keys[key] = f.length
        return sum(keys.values())

    def tidy(self) -> None:
        on_link = {(f.id.env_index, f.id.t_start) for f in self.ch.contents()}
        self.headered = {k: v for k, v in self.headered.items() if k in on_link}

    def tuple(self) -> Tuple[int, int, int]:
        return self.produced, self.in_hand, self.link()


_TERM: List[int] = []  # a SIGTERM arrived: stop at the next safe point, like a stop from the learner


def _redirect_output(log_path: Optional[str]) -> None:
    """Stdout and stderr go to the run's actor log, not to whatever the learner's caller gave it: a caller
    reading our output through a pipe (``subprocess.run(..., capture_output=True)``) must see EOF once the
    learner is gone, and third-party noise (env warnings) must not break the learner's console."""
    try:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if log_path else \
            os.open(os.devnull, os.O_WRONLY)
    except OSError:
        fd = os.open(os.devnull, os.O_WRONLY)
    for std in (1, 2):
        os.dup2(fd, std)
    os.close(fd)


def main(cfg: Config, actor_id: int, inc: int, names: Names, shapes, spec, per_actor: int, conn,
         bell_end, life_end, log_path: Optional[str] = None, environ: Optional[Dict[str, str]] = None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the learner's to handle; it stops us
    signal.signal(signal.SIGTERM, lambda *_: _TERM.append(1))  # a group SIGTERM: stop as at shutdown
    if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:  # (ignored under nohup: the learner ignores it too)
        signal.signal(signal.SIGHUP, lambda *_: _TERM.append(1))  # the terminal closed: as a SIGTERM
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # (blocked since our start)
    die_with_parent()  # SIGKILL from the kernel when our parent exits, wherever we are
    forget_fork_server()  # (under forkserver: the server must be free to exit with the learner)
    for c in (conn, bell_end, life_end):  # a subprocess an env starts must not hold our pipes open
        os.set_inheritable(c.fileno(), False)
    lifeline = Lifeline(child_end=life_end)
    if lifeline.gone():  # the parent died before we asked
        os._exit(0)
    _redirect_output(log_path)
    if environ is not None:  # the learner's environment at our start (a fork server's is as old as the server:
        os.environ.clear()  # in a sweep, the first job's), e.g. the run's log file for third-party noise
        os.environ.update(environ)
    if cfg.runner.actor_nice:
        try:
            os.nice(cfg.runner.actor_nice)  # the learner is the bottleneck it must not wait for a core
        except OSError:
            pass
    books: Optional[_Books] = None
    try:
        actor = Actor(cfg, actor_id, inc, expect=spec)  # (the learner's spec: the slots' layout is the learner's)
        layout = FragmentLayout(spec, cfg.actor.rollout_len, policy_state_shape(cfg.policy))
        obs_shape = spec.obs_shape
        pool = SlotPool(layout, cfg.actors, per_actor, names.slots, create_new=False)
        snap_block = SeqBlock(SnapshotCodec(shapes, obs_shape).size, "float32", names.snapshot, create_new=False)
        credits = SeqBlock(2 * cfg.actors, "int64", names.credits, create_new=False)
        status = StatusBlock(cfg.actors, names.status, create_new=False)
        budget = SharedCounter(names.budget, create_new=False, actors=cfg.actors)
        codec = SnapshotCodec(shapes, obs_shape)
        ch = ChaosChannel(cfg.chaos, cfg.seed, actor_id, inc,
                          kinds_for(spec.masked, SLOT_CORRUPTIONS, recurrent=actor.h is not None))
        books = _Books(ch)
        status.rows[actor_id, :] = 0.0  # the previous incarnation's row was read when it ended
        status.set(actor_id, beat=time.monotonic(), incarnation=inc, torch_loaded=float("torch" in sys.modules))
        conn.send_bytes(wire.started(inc))
    except BaseException:  # noqa: BLE001 - the learner fails the run with this text
        try:
            conn.send_bytes(wire.error(inc, (0, 0, 0), traceback.format_exc()))
        finally:
            os._exit(1)
    _Loop(cfg, actor_id, inc, actor, pool, snap_block, credits, status, budget, codec, ch, books, conn,
          Bell(wait_end=bell_end), lifeline).run()


class _Loop:
    def __init__(self, cfg, actor_id, inc, actor, pool, snap_block, credits, status, budget, codec, ch, books, conn, bell,
                 lifeline):
        self.cfg, self.actor_id, self.inc = cfg, actor_id, inc
        self.actor, self.pool, self.snap_block, self.credits = actor, pool, snap_block, credits
        self.status, self.budget, self.codec, self.ch, self.books = status, budget, codec, ch, books
        self.conn, self.bell, self.lifeline = conn, bell, lifeline
        self.version = -1
        self.padding = 0  # timesteps skipped past the steps taken (discarded rollouts): credit counts timesteps
        self.poll = min(0.002, cfg.runner.poll_s)
        self.idle_s = max(self.poll, cfg.runner.poll_s)  # longest wait for the bell (beats and checks in between)
        self.out: List[bytes] = []  # messages not yet sent (see flush)
        actor.heartbeat = self.beat
        self.cpu0 = time.process_time()  # (the process's CPU before its loop: imports, envs, attaching shm)
        self.wait0 = run_delay_s()  # (the same for its waits for a CPU)

    # ---- liveness -------------------------------------------------------------------------------------------
    def stopping(self) -> bool:
        """The learner asked us to stop, a SIGTERM came, or the learner is gone (reaped or not)."""
        return self.budget.stopped or bool(_TERM) or self.lifeline.gone()

    def beat(self) -> None:
        self.status.set(self.actor_id, beat=time.monotonic())

    def publish_stats(self) -> None:
        st, c = self.actor.stats, self.ch.counts
        st.cpu_s = time.process_time() - self.cpu0
        st.start_cpu_s = self.cpu0
        st.cpu_wait_s = run_delay_s() - self.wait0  # (the loop's thread: the one that steps, infers and sends)
        row = dataclasses.asdict(st)  # (every ActorStats field has its column in the status block)
        row.update(duplicated=c.duplicated, reordered=c.reordered, delayed=c.delayed, dropped_steps=c.dropped_steps,
                   kills=c.kills, hangs=c.hangs, first_step=self.actor.first_step_t or 0.0)
        for k in COUNTED:
            row[f"corrupted_{k}"] = c.corrupted.get(k, 0)
            row[f"corrupted_steps_{k}"] = c.corrupted_steps.get(k, 0)
        self.status.set(self.actor_id, **row)

    def wait_for_news(self) -> None:
        """Block until the learner rings (new credit, or stop), the learner dies or ``idle_s`` passes; then clear
        the rings that piled up, so each wait re-reads the state once. No sleep-polling: a throttled actor costs
        no CPU."""
        self.bell.wait(self.idle_s, self.lifeline)

    # ---- snapshots and credit -----------------------------------------------------------------------------
    def refresh(self) -> None:
        """Load the newest snapshot if there is a newer one and ``actor.sync_min_lag`` says to."""
        newest = self.snap_block.version()
        if newest > self.version and self.actor.wants(newest):
            t0 = time.perf_counter()
            version, flat = self.snap_block.read(alive=lambda: not self.stopping())
            snap = self.codec.decode(version, flat)
            self.actor.load(snap, fetch_s=time.perf_counter() - t0)
            self.version = version

    def credit(self) -> Dict[int, int]:
        _, c = self.credits.read(alive=lambda: not self.stopping())
        inc, value = int(c[2 * self.actor_id]), int(c[2 * self.actor_id + 1])
        return {inc: value}

    # ---- sending --------------------------------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        """Queue a message; :meth:`flush` sends what is queued as one bundle."""
        self.out.append(data)

    def flush(self) -> None:
        """Send the queued messages (before every wait, at the end of each rollout, before a scripted fault)."""
        if self.out:
            data, self.out = wire.bundle(self.out), []
            self.conn.send_bytes(data)

    def drain(self) -> None:
        """Write what leaves the link into free slots of this actor and send their headers."""
        ch, books = self.ch, self.books
        while ch.outbox:
            f = ch.outbox[0]
            slot = self.pool.free_slot(self.actor_id)
            if slot is None:  # every slot of ours is still being read: wait (the learner is behind)
                self.flush()
                t0 = time.perf_counter()
                while slot is None:
                    if self.stopping():
                        raise SystemExit(0)
                    self.beat()
                    time.sleep(self.poll)
                    slot = self.pool.free_slot(self.actor_id)
                self.actor.stats.blocked_s += time.perf_counter() - t0
            k = self.pool.write(slot, f)
            ch.outbox.pop(0)
            books.headered[(f.id.env_index, f.id.t_start)] = f.length
            self.send(wire.frag(self.inc, books.tuple(), slot, f.id, k))
        books.tidy()

    def send_fragment(self, f: Fragment) -> None:
        self.books.in_hand -= f.length
        self.ch.send(f)
        self.send(wire.sent(self.inc, self.books.tuple(), f.id.env_index, f.id.t_end, f.length))
        self.drain()

    # ---- the loop -------------------------------------------------------------------------------------------
    def run(self) -> None:
        cfg, ch, books, actor = self.cfg, self.ch, self.books, self.actor
        per_rollout = steps_per_rollout(cfg)
        max_lead = cfg.actor.max_lead_steps
        try:
            while not self.stopping():
                self.beat()
                self.bell.clear()  # rings for news this iteration reads anyway
                self.refresh()
                pause, _ = throttle_state(books.produced + self.padding, self.credit(), self.inc, max_lead)
                if pause and self.budget.has_room(per_rollout):
                    ch.flush()
                    self.drain()
                    self.flush()
                    t0 = time.perf_counter()
                    while pause and self.budget.has_room(per_rollout) and not self.stopping():
                        self.beat()
                        self.wait_for_news()
                        pause, _ = throttle_state(books.produced + self.padding, self.credit(), self.inc, max_lead)
                    actor.stats.throttle_s += time.perf_counter() - t0
                    continue
                if not self.budget.reserve(self.actor_id, per_rollout):  # (given back by the learner if this
                    break                                              # process dies before reporting it)
                try:
                    ro = actor.collect(newest=self.snap_block.version)
                except BaseException:
                    self.budget.release(self.actor_id, per_rollout)
                    raise
                if not ro.fragments:  # the snapshot went stale mid-rollout (actor.refresh_lag): thrown away
                    self.budget.release(self.actor_id, per_rollout - ro.steps)
                    books.produced += ro.steps
                    self.padding += ro.padding
                    if ro.steps:
                        self.send(wire.discarded(self.inc, books.tuple(), ro.steps, ro.skipped[0][1],
                                                 [(e.env_index, e.ret, e.length) for e in ro.episodes]))
                    self.publish_stats()
                    continue  # (the loop's top loads the newest)
                books.produced += ro.steps
                books.in_hand += ro.steps
                self.send(wire.produced(self.inc, books.tuple(),
                                        [(e.env_index, e.ret, e.length) for e in ro.episodes]))
                self.publish_stats()
                self.beat()
                if ch.hang_at is not None and books.produced >= ch.hang_at:
                    ch.counts.hangs += 1
                    ch.hang_at = None
                    self.publish_stats()
                    self.status.set(self.actor_id, lost_held_steps=books.link())  # dies with the process
                    self.flush()
                    while not self.stopping():  # no heartbeat: the supervisor will kill this process
                        time.sleep(0.05)
                    raise SystemExit(0)
                frags = ro.fragments
                kill_after = len(frags)
                if ch.kill_at is not None and books.produced >= ch.kill_at:
                    kill_after = int(ch.rng.integers(len(frags)))
                for k, f in enumerate(frags):
                    if k == kill_after:
                        ch.counts.kills += 1
                        self.publish_stats()
                        self.status.set(self.actor_id, lost_held_steps=books.link())  # dies with the process
                        self.flush()
                        os.kill(os.getpid(), signal.SIGKILL)
                    self.send_fragment(f)
                self.flush()
            ch.flush()
            self.drain()
            self.publish_stats()
            self.send(wire.done(self.inc, books.tuple()))
            self.flush()
        except (SystemExit, BrokenPipeError, EOFError, ConnectionError):
            pass  # stopping, or the learner is gone
        except BaseException:  # noqa: BLE001 - report, then exit with an error
            try:
                self.publish_stats()
                self.send(wire.error(self.inc, books.tuple(), traceback.format_exc()))
                self.flush()
            except Exception:  # noqa: BLE001
                pass
            os._exit(1)
        finally:
            try:
                self.publish_stats()
                actor.close()
            except Exception:  # noqa: BLE001
                pass
        os._exit(0)
