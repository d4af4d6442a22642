"""What every runner shares: the env-step budget, the transition accounting, and the learner side
(lag filter -> batch -> update -> publish -> log). Runners differ only in how they start actors and how
fragments reach :meth:`LearnerDriver.offer`."""
from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional

import numpy as np

from ..actor import ActorStats
from ..config import Config
from ..fragment import Fragment
from ..learner import Learner, batch_fragments, lag_ok
from ..policy import Snapshot
from ..tracking import Tracker


class Budget:
    """The run's env-step budget. Actors reserve a whole rollout before collecting it, so the steps
    produced never exceed ``total``."""

    def __init__(self, total: int):
        self.total = total
        self.used = 0
        self._lock = threading.Lock()

    def reserve(self, n: int) -> bool:
        with self._lock:
            if self.used + n > self.total:
                return False
            self.used += n
            return True


@dataclass
class Accounting:
    """Every transition produced ends up in exactly one bucket:
    produced == trained + sum(dropped) + sum(rejected) + in_flight."""

    produced: int = 0
    trained: int = 0
    dropped: Dict[str, int] = field(default_factory=collections.Counter)
    rejected: Dict[str, int] = field(default_factory=collections.Counter)
    in_flight: int = 0

    def as_dict(self) -> Dict[str, object]:
        return {
            "produced": self.produced,
            "admitted": self.trained,
            "dropped": dict(self.dropped),
            "rejected": dict(self.rejected),
            "in_flight": self.in_flight,
            "balanced": self.produced
            == self.trained + sum(self.dropped.values()) + sum(self.rejected.values()) + self.in_flight,
        }


class LearnerDriver:
    """The learner side of every runner. ``gauges()`` supplies the runner's transport readings
    (queue depth/bytes, counters by reason) and ``actors()`` its actors' stats, both read at each update."""

    def __init__(self, cfg: Config, learner: Learner, tracker: Tracker, budget: Budget,
                 publish: Callable[[Snapshot], None],
                 gauges: Optional[Callable[[], Dict[str, float]]] = None,
                 actors: Optional[Callable[[], Mapping[int, ActorStats]]] = None):
        self.cfg = cfg
        self.learner = learner
        self.tracker = tracker
        self.budget = budget
        self.publish = publish
        self.gauges = gauges or (lambda: {})
        self.actors = actors or (lambda: {})
        self.acct = Accounting()
        self.need = batch_fragments(cfg)
        self.pending: List[Fragment] = []
        self._ages: List[float] = []
        self._kept = 0
        self._lag_dropped = 0
        self._t_last = time.perf_counter()
        self.wait_s = 0.0
        self.compute_s = 0.0

    def offer(self, frag: Fragment, age_s: float = 0.0) -> Optional[Dict[str, float]]:
        """Hand one fragment to the learner; returns the update's metrics row when it completed a batch."""
        lag = self.learner.take(frag)
        if not lag_ok(self.cfg, lag):
            self.acct.dropped["lag"] += frag.length
            self._lag_dropped += frag.length
            return None
        self._kept += frag.length
        self.pending.append(frag)
        self._ages.append(age_s)
        if len(self.pending) < self.need:
            return None
        return self._update()

    def _update(self) -> Dict[str, float]:
        frags, ages = self.pending, self._ages
        self.pending, self._ages = [], []
        t0 = time.perf_counter()
        wait = t0 - self._t_last
        lags = self.learner.version - np.array([f.id.behavior_version for f in frags])
        m = self.learner.update(frags, self.budget.used)
        compute = time.perf_counter() - t0
        self.wait_s += wait
        self.compute_s += compute
        self.acct.trained += sum(f.length for f in frags)
        m["lag/kept_frac"] = self._kept / max(1, self._kept + self._lag_dropped)
        self._kept = self._lag_dropped = 0
        m["transport/age_s_mean"] = float(np.mean(ages))
        m["transport/age_s_max"] = float(np.max(ages))
        m["transport/admitted"] = float(self.acct.trained)
        m["learner/wait_s"] = wait
        m["learner/compute_s"] = compute
        m["learner/wait_frac"] = self.wait_s / max(self.wait_s + self.compute_s, 1e-9)
        m["learner/updates_per_s"] = self.learner.updates / max(self.tracker.wall(), 1e-9)
        m.update(self.gauges())
        if self.learner.updates % self.cfg.learner.broadcast_every == 0:
            self.publish(self.learner.snapshot())
        # per-transition version lag (fragments have equal length, so per-fragment values weigh the same)
        hists = {"lag/version_lag": lags, "transport/age_s": np.asarray(ages)}
        row = self.tracker.log_update(m, self.budget.used, hists, self.actors())
        self._t_last = time.perf_counter()
        return row

    def drop_pending(self, reason: str = "shutdown") -> None:
        n = sum(f.length for f in self.pending)
        if n:
            self.acct.dropped[reason] += n
        self.pending, self._ages = [], []


def counters(prefix: str, counts: Mapping[str, int]) -> Dict[str, float]:
    """``{prefix: total, prefix/<reason>: n}``: the total is always present, reasons once they occur."""
    out = {prefix: float(sum(counts.values()))}
    out.update({f"{prefix}/{reason}": float(n) for reason, n in counts.items()})
    return out
