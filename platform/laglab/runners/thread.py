"""Actor threads, learner in the calling thread, a bounded fragment queue between them, and a supervisor.

Each actor thread: read the newest snapshot; pause while ``max_lead_steps`` says it is too far ahead;
reserve a rollout from the budget; collect; send its fragments (through chaos, if configured) to the queue.
The learner loop also supervises: an actor that crashed, or showed no heartbeat for
``runner.heartbeat_timeout_s``, is restarted with a new incarnation after a backoff, up to
``runner.actors_max_restarts`` times per slot; then the run stops with the actor's error — never a hang.
"""
from __future__ import annotations

import collections
import itertools
import threading
import time
import traceback
from typing import Any, Dict, List, Optional

from ..actor import ActorStats, steps_per_rollout, throttle_state
from ..admission import Admission
from ..config import Config
from ..envs import EnvSpec
from ..learner import Learner
from ..tracking import Tracker
from ..transport import Closed, FragmentQueue, PolicyStore
from .base import Budget, Incarnation, LearnerDriver, SharedCounts, counters, transport_summary


class ActorFailed(RuntimeError):
    pass


class Slot:
    """One actor position: its current incarnation's thread and its restart history."""

    def __init__(self, actor_id: int):
        self.actor_id = actor_id
        self.inc: Optional[Incarnation] = None
        self.thread: Optional[threading.Thread] = None
        self.restarts = 0
        self.start_at = 0.0
        self.finished = False  # the budget ran out: no restart
        self.error: Optional[str] = None
        self.stats = ActorStats()


def run(cfg: Config, learner: Learner, tracker: Tracker, spec: EnvSpec, budget: Budget, run_dir) -> Dict[str, Any]:
    store = PolicyStore(learner.snapshot())
    admission = Admission(spec, cfg.actors, cfg.actor.envs_per_actor, cfg.transport.duplicates,
                          cfg.transport.dedup_window, cfg.actor.rollout_len)
    queue = FragmentQueue(cfg.transport.capacity, cfg.transport.max_bytes, cfg.transport.policy,
                          on_discard=admission.discard)
    stop = threading.Event()
    counts = SharedCounts()
    incarnations = itertools.count(1)
    max_lead = cfg.actor.max_lead_steps
    per_rollout = steps_per_rollout(cfg)
    poll = cfg.runner.poll_s
    slots: List[Slot] = [Slot(i) for i in range(cfg.actors)]
    abandoned: List[threading.Thread] = []

    def actor_main(slot: Slot, inc: Incarnation) -> None:
        def send(frag) -> None:
            t0 = time.perf_counter()
            queue.put(frag, poll, on_wait=inc.beat)
            inc.stats.blocked_s += time.perf_counter() - t0

        def wait_hung() -> None:  # a scripted hang: no heartbeat until the supervisor gives up on us
            while not (inc.abandoned.is_set() or stop.is_set()):
                inc.abandoned.wait(poll)

        try:
            while not stop.is_set() and not inc.abandoned.is_set():
                inc.beat()
                gen = store.generation
                pause, _ = throttle_state(inc.produced, store.credits(), inc.incarnation, max_lead)
                # with the budget spent there is nothing to wait for: go on to finish (waiting for credit
                # here could wait forever once the others have finished and the learner lacks a full batch)
                if pause and budget.has_room(per_rollout):
                    inc.release_held(send)
                    t0 = time.perf_counter()
                    while pause and not stop.is_set() and budget.has_room(per_rollout):
                        inc.beat()
                        store.wait_change(gen, poll, stop.is_set)
                        gen = store.generation
                        pause, _ = throttle_state(inc.produced, store.credits(), inc.incarnation, max_lead)
                    inc.stats.throttle_s += time.perf_counter() - t0
                    continue
                snap = store.latest()
                if not inc.produce(snap, budget, tracker, send, wait_hung):
                    inc.finish(send)
                    if slot.inc is inc:
                        slot.finished = True
                    return
            inc.finish(send)
        except Closed:
            inc.close()
        except BaseException:  # noqa: BLE001 - reported to the supervisor (the learner thread)
            if slot.inc is inc:  # an abandoned incarnation no longer speaks for its slot
                slot.error = f"actor {inc.actor_id} (incarnation {inc.incarnation}) failed:\n{traceback.format_exc()}"
            inc.close()

    def start(slot: Slot) -> None:
        slot.error = None
        inc = Incarnation(cfg, slot.actor_id, next(incarnations), counts)
        slot.inc, slot.stats = inc, inc.stats
        slot.thread = threading.Thread(target=actor_main, args=(slot, inc), name=f"actor-{slot.actor_id}",
                                       daemon=True)
        slot.thread.start()

    def schedule_restart(slot: Slot, why: str) -> None:
        rc = cfg.runner
        if slot.restarts >= rc.actors_max_restarts:
            raise ActorFailed(f"actor {slot.actor_id} stopped {slot.restarts + 1} times "
                              f"(runner.actors_max_restarts={rc.actors_max_restarts}); last: {why}")
        slot.start_at = time.monotonic() + rc.restart_backoff_s * (2 ** slot.restarts)
        slot.restarts += 1
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
                slot.inc.abandoned.set()  # the old thread drops what it holds if it ever wakes up
                abandoned.append(slot.thread)
                schedule_restart(slot, f"no heartbeat for {cfg.runner.heartbeat_timeout_s}s "
                                       "(runner.heartbeat_timeout_s)")
        return live

    def gauges() -> Dict[str, float]:
        q_dropped, q_rejected = queue.counts()
        with counts.lock:
            dropped = collections.Counter(counts.dropped)
        dropped.update(q_dropped)
        dropped["lag"] += driver.acct.dropped.get("lag", 0)
        return {"transport/queue_depth": float(queue.depth), "transport/queue_bytes": float(queue.bytes),
                **counters("transport/dropped", dropped), **counters("transport/refused_by_queue", q_rejected)}

    driver = LearnerDriver(cfg, learner, tracker, budget, admission, publish=store.publish, gauges=gauges,
                           actors=lambda: {s.actor_id: s.stats for s in slots},
                           checkpoint_dir=run_dir / "checkpoints")
    for slot in slots:
        start(slot)
    try:
        last_data = time.monotonic()
        while True:
            item = queue.get(poll)
            if item is None:
                if driver.pending:  # starved with a partial batch: credit the actors with what arrived
                    store.grant(learner.consumed)
                if not supervise() and queue.depth == 0:
                    break
                if time.monotonic() - last_data > cfg.runner.actor_timeout_s:
                    raise ActorFailed(f"no data from any actor for {cfg.runner.actor_timeout_s}s "
                                      "(runner.actor_timeout_s)")
                continue
            last_data = time.monotonic()
            driver.offer(*item)
            supervise()
    finally:
        stop.set()
        store.wake()
        queue.close()
        for t in [s.thread for s in slots if s.thread is not None] + abandoned:
            t.join(timeout=30)
    acct = driver.close(counts)
    restarts = sum(s.restarts for s in slots)
    queue_info = {"max_depth": queue.stats.max_depth, "max_bytes": queue.stats.max_bytes,
                  "blocked_s": queue.stats.blocked_s, "capacity": queue.capacity, "max_bytes_bound": queue.max_bytes}
    out = transport_summary(acct, admission, counts.chaos, restarts, {"queue": queue_info})
    out["chaos"]["stalls"] = driver.stalls
    out.update({"accounting": acct, "actor_stats": {s.actor_id: s.stats for s in slots}, "env_steps": budget.used})
    return out
