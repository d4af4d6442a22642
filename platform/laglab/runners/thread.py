"""Actor threads, learner in the calling thread, a bounded fragment queue between them, and a supervisor.

How actors start: a thread per slot. How bytes move: fragment objects through a deque (``FragmentQueue``).
Each actor thread: read the newest snapshot; pause while ``max_lead_steps`` says it is too far ahead;
reserve a rollout from the budget; collect; send its fragments over its link to the queue. The learner loop
also supervises: an actor that crashed, or showed no heartbeat for ``runner.heartbeat_timeout_s``, is
restarted with a new incarnation after ``runner.restart_backoff_s``, within the restart intensity; past it
the run stops with the actor's error — never a hang.
"""
from __future__ import annotations

import threading
import time
import traceback
from typing import Any, Dict, List, Optional

from ..accounting import Budget, Ledger
from ..actor import ActorStats, steps_per_rollout, throttle_state
from ..admission import Admission
from ..recurrent import policy_state_shape
from ..chaos import ChaosCounts
from .. import timeline
from ..config import Config
from ..envs import EnvSpec
from ..fragment import Fragment
from ..learner import Learner
from ..tracking import Tracker
from ..transport import Closed, FragmentQueue, PolicyStore
from .driver import LearnerDriver, serve
from .endpoint import arrive_at_queue
from .supervisor import ActorFailed, RestartIntensity
from .worker import Abandoned, Incarnation

__all__ = ["run", "ActorFailed"]


class QueueEndpoint:
    """The receiving end of every actor thread's link: the bounded queue (see :func:`arrive_at_queue`)."""

    def __init__(self, ledger: Ledger, queue: FragmentQueue, poll_s: float):
        self.ledger, self.queue, self.poll = ledger, queue, poll_s

    def deliver(self, inc: Incarnation, frag: Fragment) -> str:
        t0 = time.perf_counter()
        try:
            return arrive_at_queue(self.ledger, self.queue, frag, inc.abandoned.is_set,
                                   lambda: inc.channel.outbox.pop(0), lambda _: inc.beat(), self.poll)
        finally:
            inc.stats.blocked_s += time.perf_counter() - t0


class Slot:
    """One actor position: its current incarnation's thread."""

    def __init__(self, actor_id: int):
        self.actor_id = actor_id
        self.inc: Optional[Incarnation] = None
        self.thread: Optional[threading.Thread] = None
        self.start_at = 0.0
        self.finished = False  # the budget ran out: no restart
        self.error: Optional[str] = None
        self.stats = ActorStats()


def run(cfg: Config, learner: Learner, tracker: Tracker, spec: EnvSpec, budget: Budget, run_dir) -> Dict[str, Any]:
    store = PolicyStore(learner.snapshot())
    ledger = Ledger(cfg.actor.rollout_len, cfg.actor.envs_per_actor, cfg.transport.dedup_window,
                    learner.allocate_incarnation)
    admission = Admission(spec, cfg.actors, cfg.actor.envs_per_actor, cfg.transport.duplicates, cfg.actor.rollout_len,
                          policy_state_shape(cfg.policy))
    queue = FragmentQueue(cfg.transport.capacity, cfg.transport.max_bytes, cfg.transport.policy,
                          on_discard=lambda f, first, bucket, reason:
                          ledger.book(bucket, reason, f.length) if first is True else None)
    stop = threading.Event()
    chaos_counts, chaos_lock = ChaosCounts(), threading.Lock()
    max_lead = cfg.actor.max_lead_steps
    per_rollout = steps_per_rollout(cfg)
    poll = cfg.runner.poll_s
    endpoint = QueueEndpoint(ledger, queue, poll)
    intensity = RestartIntensity(cfg.runner.actors_max_restarts, cfg.runner.restart_window_s)
    slots: List[Slot] = [Slot(i) for i in range(cfg.actors)]
    incarnations: List[Incarnation] = []  # every incarnation started (their links are read for the books)
    threads: List[threading.Thread] = []

    def actor_main(slot: Slot, inc: Incarnation) -> None:
        def wait_hung() -> None:  # a scripted hang: no heartbeat until the supervisor gives up on us
            while not (inc.abandoned.is_set() or stop.is_set()):
                inc.abandoned.wait(poll)

        reason = "shutdown"
        try:
            while not stop.is_set() and not inc.abandoned.is_set():
                inc.beat()
                gen = store.generation
                pause, _ = throttle_state(inc.produced + inc.padding, store.credits(), inc.incarnation, max_lead)
                # with the budget spent there is nothing to wait for: go on to finish (waiting for credit
                # here could wait forever once the others have finished and the learner lacks a full batch)
                if pause and budget.has_room(per_rollout):
                    inc.release_held(endpoint)
                    t0 = time.perf_counter()
                    while pause and not stop.is_set() and budget.has_room(per_rollout):
                        inc.beat()
                        store.wait_change(gen, poll, stop.is_set)
                        gen = store.generation
                        pause, _ = throttle_state(inc.produced + inc.padding, store.credits(), inc.incarnation, max_lead)
                    inc.stats.throttle_s += time.perf_counter() - t0
                    continue
                if not inc.produce(store.latest(), budget, tracker, endpoint, wait_hung,
                                   newest=lambda: store.latest().version):
                    inc.close("shutdown", endpoint)  # the link delivers what it holds before the slot is done
                    if slot.inc is inc:
                        slot.finished = True
                    return
        except Closed:
            reason = "shutdown"
        except Abandoned:
            reason = "abandoned"
        except BaseException:  # noqa: BLE001 - reported to the supervisor (the learner thread)
            reason = "abandoned" if inc.abandoned.is_set() else "actor_crash"
            if slot.inc is inc:  # an abandoned incarnation no longer speaks for its slot
                slot.error = f"actor {inc.actor_id} (incarnation {inc.incarnation}) failed:\n{traceback.format_exc()}"
        finally:
            inc.close("abandoned" if inc.abandoned.is_set() else reason, endpoint)

    def start(slot: Slot) -> None:
        slot.error = None
        inc = Incarnation(cfg, slot.actor_id, ledger, chaos_counts, chaos_lock, spec)
        incarnations.append(inc)
        slot.inc, slot.stats = inc, inc.stats
        slot.thread = threading.Thread(target=actor_main, args=(slot, inc), name=f"actor-{slot.actor_id}",
                                       daemon=True)
        threads.append(slot.thread)
        slot.thread.start()

    def schedule_restart(slot: Slot, why: str) -> None:
        intensity.record(slot.actor_id, why)
        slot.start_at = time.monotonic() + cfg.runner.restart_backoff_s
        slot.thread = None

    def supervise() -> bool:
        """Restart what died or hung; True while any actor may still produce."""
        now = time.monotonic()
        live = False
        for slot in slots:
            if slot.finished:
                continue
            live = True
            if slot.thread is None:
                if now >= slot.start_at:
                    start(slot)
            elif not slot.thread.is_alive():
                if slot.finished:  # it finished between the check above and now
                    continue
                schedule_restart(slot, slot.error or "exited")
            elif now - slot.inc.last_beat > cfg.runner.heartbeat_timeout_s:
                slot.inc.abandoned.set()  # what the old thread sends, if it ever wakes up, is refused
                schedule_restart(slot, f"no heartbeat for {cfg.runner.heartbeat_timeout_s}s "
                                       "(runner.heartbeat_timeout_s)")
        return live

    def gauges() -> Dict[str, float]:
        return {"transport/queue_depth": float(queue.depth), "transport/queue_bytes": float(queue.bytes),
                "transport/too_old": float(ledger.too_old)}

    driver = LearnerDriver(cfg, learner, tracker, budget, admission, ledger, publish=store.publish,
                           link_steps=lambda: ledger.link_steps(f for inc in incarnations if not inc.closed
                                                                for f in inc.link_contents()),
                           queue_steps=queue.first_steps, gauges=gauges,
                           actors=lambda: {s.actor_id: s.stats for s in slots},
                           checkpoint_dir=run_dir / "checkpoints")
    for slot in slots:
        start(slot)
    timeline.mark("actors_started")
    try:
        serve(queue, driver, supervise, store.grant, cfg)
    except BaseException as e:
        e.laglab_books = lambda: driver.summary(driver.close(), intensity.total, chaos_counts.as_dict())
        raise
    finally:
        stop.set()
        store.wake()
        with ledger.lock:
            queue.close()
        for t in threads:
            t.join(timeout=30)
    bal = driver.close()
    queue_info = {"max_depth": queue.stats.max_depth, "max_bytes": queue.stats.max_bytes,
                  "blocked_s": queue.stats.blocked_s, "capacity": queue.capacity, "max_bytes_bound": queue.max_bytes}
    out = driver.summary(bal, intensity.total, chaos_counts.as_dict(), {"queue": queue_info})
    out.update({"actor_stats": {s.actor_id: s.stats for s in slots}, "env_steps": budget.used})
    return out
