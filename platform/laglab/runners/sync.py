"""The synchronous baseline: the same actors and learner, one thread, strictly on-policy.

Every round, each actor loads the newest snapshot, collects its share of the batch, and the learner
updates on exactly that batch, so every transition has version lag 0. Deterministic for a given seed
(chaos included). A crashed actor restarts in place with a new incarnation.
"""
from __future__ import annotations

import itertools
from typing import Any, Dict, List

from ..actor import steps_per_rollout
from ..admission import Admission
from ..chaos import ActorKilled
from ..config import Config
from ..envs import EnvSpec
from ..learner import Learner
from ..tracking import Tracker
from .base import Budget, Incarnation, LearnerDriver, SharedCounts, counters, transport_summary


class ActorFailed(RuntimeError):
    pass


def run(cfg: Config, learner: Learner, tracker: Tracker, spec: EnvSpec, budget: Budget, run_dir) -> Dict[str, Any]:
    counts = SharedCounts()
    incarnations = itertools.count(1)
    slots: List[Incarnation] = [Incarnation(cfg, i, next(incarnations), counts) for i in range(cfg.actors)]
    restarts = [0] * cfg.actors
    snap = [learner.snapshot()]
    admission = Admission(spec, cfg.actors, cfg.actor.envs_per_actor, cfg.transport.duplicates,
                          cfg.transport.dedup_window, cfg.actor.rollout_len)
    driver = LearnerDriver(cfg, learner, tracker, budget, admission, publish=lambda s: snap.__setitem__(0, s),
                           gauges=lambda: {"transport/queue_depth": 0.0, "transport/queue_bytes": 0.0,
                                           **counters("transport/dropped", counts.dropped)},
                           actors=lambda: {s.actor_id: s.stats for s in slots},
                           checkpoint_dir=run_dir / "checkpoints")
    rounds = max(1, cfg.learner.batch_size // (cfg.actors * steps_per_rollout(cfg)))
    try:
        more = True
        while more:
            version = snap[0]
            for _ in range(rounds):
                for i in range(cfg.actors):
                    try:
                        more = slots[i].produce(version, budget, tracker, driver.offer, lambda: None)
                    except ActorKilled as e:
                        if restarts[i] >= cfg.runner.actors_max_restarts:
                            raise ActorFailed(f"actor {i} crashed {restarts[i] + 1} times "
                                              f"(runner.actors_max_restarts={cfg.runner.actors_max_restarts}): {e}") from e
                        restarts[i] += 1
                        slots[i].close()
                        slots[i] = Incarnation(cfg, i, next(incarnations), counts)
                        more = True
                    if not more:
                        break
                if not more:
                    break
        for s in slots:
            s.finish(driver.offer)
    finally:
        for s in slots:
            s.close()
    acct = driver.close(counts)
    out = transport_summary(acct, admission, counts.chaos, sum(restarts))
    out["chaos"]["stalls"] = driver.stalls
    out.update({"accounting": acct, "actor_stats": {s.actor_id: s.stats for s in slots}, "env_steps": budget.used})
    return out
