"""The synchronous baseline: the same actors and learner, one thread, strictly on-policy.

Every round, each actor loads the newest snapshot, collects its share of the batch, and the learner
updates on exactly that batch, so every transition has version lag 0. Deterministic for a given seed.
"""
from __future__ import annotations

import itertools
from typing import Any, Dict

from ..actor import Actor, steps_per_rollout
from ..config import Config
from ..envs import EnvSpec
from ..learner import Learner
from ..tracking import Tracker
from .base import Budget, LearnerDriver, counters


def run(cfg: Config, learner: Learner, tracker: Tracker, spec: EnvSpec) -> Dict[str, Any]:
    budget = Budget(cfg.total_env_steps)
    incarnations = itertools.count(1)
    actors = [Actor(cfg, i, next(incarnations)) for i in range(cfg.actors)]
    snap = [learner.snapshot()]
    driver = LearnerDriver(cfg, learner, tracker, budget, publish=lambda s: snap.__setitem__(0, s),
                           gauges=lambda: {"transport/queue_depth": 0.0, "transport/queue_bytes": 0.0,
                                           **counters("transport/dropped", driver.acct.dropped),
                                           **counters("transport/rejected", driver.acct.rejected)},
                           actors=lambda: {a.actor_id: a.stats for a in actors})
    per_rollout = steps_per_rollout(cfg)
    rounds = cfg.learner.batch_size // (cfg.actors * per_rollout)
    try:
        out_of_budget = False
        while not out_of_budget:
            for a in actors:
                a.load(snap[0])
            for _ in range(rounds):
                for a in actors:
                    if not budget.reserve(per_rollout):
                        out_of_budget = True
                        break
                    ro = a.collect()
                    driver.acct.produced += ro.steps
                    tracker.add_episodes(ro.episodes, budget.used)
                    for f in ro.fragments:
                        driver.offer(f)
                if out_of_budget:
                    break
        driver.drop_pending("shutdown")
    finally:
        for a in actors:
            a.close()
    return {"accounting": driver.acct, "actor_stats": {a.actor_id: a.stats for a in actors}, "env_steps": budget.used}
