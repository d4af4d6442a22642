"""The synchronous baseline: the same actors and learner, one thread, on-policy.

How actors start: all in the calling thread. How bytes move: straight from an actor's link to the learner.
For every batch, the env instances of all actors are visited round robin and exactly the fragments the batch
still lacks are collected under the newest snapshot (an actor contributes whole rollouts of some or all of
its envs), so any actor count and batch size work and every transition has version lag 0 — except
fragments that chaos delays past an update. Deterministic for a given seed (chaos included). A crashed
actor restarts in place with a new incarnation, within the restart intensity.
"""
from __future__ import annotations

import threading
from typing import Any, Dict, List, Tuple

from .. import timeline
from ..accounting import DUPLICATE, FIRST, TOO_OLD, Budget, Ledger
from ..admission import Admission
from ..recurrent import policy_state_shape
from ..chaos import ChaosCounts
from ..config import Config
from ..envs import EnvSpec
from ..fragment import Fragment
from ..learner import Learner
from ..tracking import Tracker
from .driver import LearnerDriver
from .supervisor import ActorFailed, RestartIntensity, check_stop
from .worker import OK, Incarnation

__all__ = ["run", "ActorFailed", "plan"]


class DirectEndpoint:
    """Arrivals go straight to the learner driver."""

    def __init__(self, ledger: Ledger, driver: LearnerDriver):
        self.ledger, self.driver = ledger, driver

    def deliver(self, inc: Incarnation, frag: Fragment) -> str:
        with self.ledger.lock:
            cls = self.ledger.classify(frag)
            self.ledger.arrive(frag, cls)
            inc.channel.outbox.pop(0)
        if cls != TOO_OLD:
            self.driver.offer(frag, {FIRST: True, DUPLICATE: False}.get(cls))
        return OK


def plan(start: int, n: int, actors: int, envs_per_actor: int) -> Tuple[List[Tuple[int, List[int]]], int]:
    """The next ``n`` env instances round robin from global instance ``start``, as rollouts to collect:
    [(actor, [env indices])...] (an env appears at most once per rollout), and where the next plan starts."""
    total = actors * envs_per_actor
    out: List[Tuple[int, List[int]]] = []
    for k in range(n):
        inst = (start + k) % total
        a, e = divmod(inst, envs_per_actor)
        if out and out[-1][0] == a and e not in out[-1][1]:
            out[-1][1].append(e)
        else:
            out.append((a, [e]))
    return out, (start + n) % total


def run(cfg: Config, learner: Learner, tracker: Tracker, spec: EnvSpec, budget: Budget, run_dir) -> Dict[str, Any]:
    ledger = Ledger(cfg.actor.rollout_len, cfg.actor.envs_per_actor, cfg.transport.dedup_window,
                    learner.allocate_incarnation)
    chaos_counts, chaos_lock = ChaosCounts(), threading.Lock()
    intensity = RestartIntensity(cfg.runner.actors_max_restarts, cfg.runner.restart_window_s)
    slots: List[Incarnation] = [Incarnation(cfg, i, ledger, chaos_counts, chaos_lock, spec) for i in range(cfg.actors)]
    timeline.mark("actors_started")  # (in-process actors, built: what a background W&B start waits for)
    snap = [learner.snapshot()]
    admission = Admission(spec, cfg.actors, cfg.actor.envs_per_actor, cfg.transport.duplicates, cfg.actor.rollout_len,
                          policy_state_shape(cfg.policy))
    driver = LearnerDriver(cfg, learner, tracker, budget, admission, ledger, publish=lambda s: snap.__setitem__(0, s),
                           link_steps=lambda: ledger.link_steps(f for s in slots for f in s.link_contents()),
                           gauges=lambda: {"transport/queue_depth": 0.0, "transport/queue_bytes": 0.0},
                           actors=lambda: {s.actor_id: s.stats for s in slots},
                           checkpoint_dir=run_dir / "checkpoints")
    endpoint = DirectEndpoint(ledger, driver)
    E = cfg.actor.envs_per_actor
    nxt = 0
    try:
        more = True
        while more:
            current = snap[0]
            rollouts, _ = plan(nxt, max(1, driver.need - len(driver.pending)), cfg.actors, E)
            for i, envs in rollouts:
                check_stop()
                nxt = (nxt + len(envs)) % (cfg.actors * E)
                try:
                    more = slots[i].produce(current, budget, tracker, endpoint, lambda: None,
                                            None if len(envs) == E else envs)
                except Exception as e:  # noqa: BLE001 - a scripted kill or a real crash: restart in place
                    slots[i].close("actor_crash", endpoint)
                    intensity.record(i, f"{type(e).__name__}: {e}")
                    slots[i] = Incarnation(cfg, i, ledger, chaos_counts, chaos_lock, spec)
                    more = True
                if not more or snap[0] is not current:
                    break  # budget spent, or a batch completed: the rest is collected under the new snapshot
        for s in slots:
            s.close("shutdown", endpoint)
    except BaseException as e:
        e.laglab_books = lambda: driver.summary(driver.close(), intensity.total, chaos_counts.as_dict())
        raise
    finally:
        for s in slots:
            s.close("shutdown", None)
    bal = driver.close()
    out = driver.summary(bal, intensity.total, chaos_counts.as_dict())
    out.update({"actor_stats": {s.actor_id: s.stats for s in slots}, "env_steps": budget.used})
    return out
