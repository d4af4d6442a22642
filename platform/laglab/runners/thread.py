"""Actor threads, learner in the calling thread, a bounded fragment queue between them.

Each actor thread: read the newest snapshot; pause while ``max_lead_steps`` says it is too far ahead;
reserve a rollout from the budget; collect; put its fragments on the queue. An actor failure stops the
run with the actor's traceback; the learner never waits forever (``runner.actor_timeout_s``).
"""
from __future__ import annotations

import collections
import itertools
import threading
import time
import traceback
from typing import Any, Dict, List

from ..actor import Actor, ActorStats, steps_per_rollout, throttle_state
from ..config import Config
from ..envs import EnvSpec
from ..learner import Learner
from ..tracking import Tracker
from ..transport import Closed, FragmentQueue, PolicyStore
from .base import Budget, LearnerDriver, counters


class ActorFailed(RuntimeError):
    pass


def run(cfg: Config, learner: Learner, tracker: Tracker, spec: EnvSpec) -> Dict[str, Any]:
    budget = Budget(cfg.total_env_steps)
    store = PolicyStore(learner.snapshot())
    queue = FragmentQueue(cfg.transport.capacity, cfg.transport.max_bytes, cfg.transport.policy)
    stop = threading.Event()
    errors: List[str] = []
    stats: Dict[int, ActorStats] = {}
    finished: List[int] = []
    produced_lock = threading.Lock()
    produced = [0]
    unsent = [0]
    incarnations = itertools.count(1)
    per_rollout = steps_per_rollout(cfg)
    max_lead = cfg.actor.max_lead_steps
    poll = cfg.runner.poll_s

    def actor_main(actor_id: int, incarnation: int) -> None:
        actor = None
        try:
            actor = Actor(cfg, actor_id, incarnation)
            stats[actor_id] = actor.stats
            mine = 0
            while not stop.is_set():
                snap = store.latest()
                pause, _ = throttle_state(mine, snap, actor_id, max_lead)
                if pause:
                    t0 = time.perf_counter()
                    while pause and not stop.is_set():
                        snap = store.wait_newer(snap.version, poll, stop.is_set)
                        pause, _ = throttle_state(mine, snap, actor_id, max_lead)
                    actor.stats.throttle_s += time.perf_counter() - t0
                    continue
                actor.load(snap)
                if not budget.reserve(per_rollout):
                    break
                ro = actor.collect()
                mine += ro.steps
                with produced_lock:
                    produced[0] += ro.steps
                tracker.add_episodes(ro.episodes, budget.used)
                t0 = time.perf_counter()
                for k, f in enumerate(ro.fragments):
                    try:
                        queue.put(f, poll)
                    except Closed:  # the run is stopping: the rest of this rollout is dropped, and counted
                        with produced_lock:
                            unsent[0] += sum(g.length for g in ro.fragments[k:])
                        return
                actor.stats.blocked_s += time.perf_counter() - t0
        except BaseException:  # noqa: BLE001 - reported to the learner thread, which fails the run
            errors.append(f"actor {actor_id} (incarnation {incarnation}) failed:\n{traceback.format_exc()}")
        finally:
            if actor is not None:
                actor.close()
            finished.append(actor_id)

    def gauges() -> Dict[str, float]:
        dropped = collections.Counter(driver.acct.dropped)
        dropped.update(queue.stats.dropped_steps)
        return {"transport/queue_depth": float(queue.depth), "transport/queue_bytes": float(queue.bytes),
                **counters("transport/dropped", dropped), **counters("transport/rejected", queue.stats.rejected_steps)}

    driver = LearnerDriver(cfg, learner, tracker, budget, publish=store.publish, gauges=gauges, actors=lambda: stats)
    threads = [threading.Thread(target=actor_main, args=(i, next(incarnations)), name=f"actor-{i}", daemon=True)
               for i in range(cfg.actors)]
    for t in threads:
        t.start()
    try:
        last_data = time.monotonic()
        while True:
            if errors:
                raise ActorFailed(errors[0])
            item = queue.get(poll)
            if item is None:
                if len(finished) == len(threads) and queue.depth == 0:
                    break
                if time.monotonic() - last_data > cfg.runner.actor_timeout_s:
                    raise ActorFailed(f"no data from any actor for {cfg.runner.actor_timeout_s}s "
                                      f"(runner.actor_timeout_s); actors finished: {sorted(finished)}")
                continue
            last_data = time.monotonic()
            driver.offer(*item)
    finally:
        stop.set()
        store.wake()
        queue.close()
        for t in threads:
            t.join(timeout=30)
        driver.drop_pending("shutdown")
        acct = driver.acct
        acct.produced = produced[0]
        if unsent[0]:
            acct.dropped["shutdown"] += unsent[0]
        for reason, n in queue.stats.dropped_steps.items():
            acct.dropped[reason] += n
        for reason, n in queue.stats.rejected_steps.items():
            acct.rejected[reason] += n
    return {"accounting": acct, "actor_stats": stats, "env_steps": budget.used,
            "queue": {"max_depth": queue.stats.max_depth, "max_bytes": queue.stats.max_bytes,
                      "blocked_s": queue.stats.blocked_s}}
