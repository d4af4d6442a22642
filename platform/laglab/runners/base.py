"""What every runner shares: the env-step budget, the transition accounting, one actor incarnation's
produce-and-send step (with chaos), and the learner side (admission -> audit -> lag filter -> batch ->
update -> publish -> log). Runners differ only in how they start and supervise actors and how fragments
reach :meth:`LearnerDriver.offer`."""
from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np

from ..actor import Actor, ActorStats, steps_per_rollout
from ..admission import Admission
from ..chaos import ActorKilled, ChaosChannel, ChaosCounts
from ..config import Config
from ..envs import TAGGED_ID, audit_tags
from ..fragment import Fragment
from ..learner import Learner, batch_fragments, lag_ok
from ..policy import Snapshot
from ..tracking import Tracker


class Budget:
    """The run's env-step budget. Actors reserve a whole rollout before collecting it, so the steps
    produced never exceed ``total``; a rollout that fails before it is produced gives its steps back."""

    def __init__(self, total: int, used: int = 0):
        self.total = total
        self.used = used
        self._lock = threading.Lock()

    def reserve(self, n: int) -> bool:
        with self._lock:
            if self.used + n > self.total:
                return False
            self.used += n
            return True

    def has_room(self, n: int) -> bool:
        with self._lock:
            return self.used + n <= self.total

    def release(self, n: int) -> None:
        with self._lock:
            self.used -= n


@dataclass
class Accounting:
    """Every transition produced ends in exactly one bucket:
    produced == admitted (trained on) + sum(dropped) + sum(rejected) + in_flight."""

    produced: int = 0
    trained: int = 0
    dropped: Dict[str, int] = field(default_factory=collections.Counter)
    rejected: Dict[str, int] = field(default_factory=collections.Counter)
    in_flight: int = 0
    misattributed: int = 0  # tagged envs: admitted transitions whose tags disagree with their identity
    coverage: Dict[str, int] = field(default_factory=collections.Counter)  # "actor/env" -> admitted steps

    def as_dict(self) -> Dict[str, object]:
        return {
            "produced": self.produced,
            "admitted": self.trained,
            "dropped": dict(self.dropped),
            "rejected": dict(self.rejected),
            "in_flight": self.in_flight,
            "misattributed": self.misattributed,
            "coverage": dict(sorted(self.coverage.items())),
            "balanced": self.produced
            == self.trained + sum(self.dropped.values()) + sum(self.rejected.values()) + self.in_flight,
        }


class SharedCounts:
    """Counters actor threads add to (produced steps, data lost on the actor side, chaos events)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.produced = 0
        self.dropped: Dict[str, int] = collections.Counter()
        self.chaos = ChaosCounts()

    def add_produced(self, n: int) -> None:
        with self.lock:
            self.produced += n

    def add_dropped(self, reason: str, n: int) -> None:
        if n:
            with self.lock:
                self.dropped[reason] += n

    def add_chaos(self, counts: ChaosCounts) -> None:
        with self.lock:
            self.chaos.merge(counts)


class Incarnation:
    """One life of an actor slot: the actor, its chaos channel, its own produced-steps counter."""

    def __init__(self, cfg: Config, actor_id: int, incarnation: int, counts: SharedCounts):
        self.cfg = cfg
        self.actor_id = actor_id
        self.incarnation = incarnation
        self.counts = counts
        self.channel = ChaosChannel(cfg.chaos, cfg.seed, actor_id, incarnation)
        self.actor = Actor(cfg, actor_id, incarnation)
        self.produced = 0
        self.last_beat = time.monotonic()
        self.abandoned = threading.Event()
        self._closed = False

    @property
    def stats(self) -> ActorStats:
        return self.actor.stats

    def beat(self) -> None:
        self.last_beat = time.monotonic()

    def produce(self, snap: Snapshot, budget: Budget, tracker: Tracker, send: Callable[[Fragment], None],
                wait_hung: Callable[[], None]) -> bool:
        """Collect one rollout under ``snap`` and send its fragments through the chaos channel.

        Returns False when the budget is exhausted. Raises :class:`ActorKilled` for a scripted crash, after
        counting the fragments it never sent as ``dropped.actor_crash``."""
        n = steps_per_rollout(self.cfg)
        self.actor.load(snap)
        if not budget.reserve(n):
            return False
        try:
            ro = self.actor.collect()
        except BaseException:
            budget.release(n)  # nothing was produced
            raise
        self.produced += ro.steps
        self.counts.add_produced(ro.steps)
        tracker.add_episodes(ro.episodes, budget.used)
        self.beat()
        ch = self.channel
        frags = ro.fragments
        if ch.hang_at is not None and self.produced >= ch.hang_at:
            ch.counts.hangs += 1
            ch.hang_at = None
            wait_hung()  # returns once the supervisor gave up on this incarnation (or the run stops)
            self.counts.add_dropped("abandoned", sum(f.length for f in frags) + ch.held_steps())
            raise ActorKilled("hung actor abandoned")
        kill_after = len(frags)
        if ch.kill_at is not None and self.produced >= ch.kill_at:
            kill_after = int(ch.rng.integers(len(frags)))  # crash part-way through sending this rollout
        for k, f in enumerate(frags):
            if k == kill_after:
                ch.counts.kills += 1
                self.counts.add_dropped("actor_crash", sum(g.length for g in frags[k:]) + ch.held_steps())
                raise ActorKilled(f"chaos: actor {self.actor_id} (incarnation {self.incarnation}) killed "
                                  f"after {self.produced} steps")
            try:
                _deliver(ch.send(f) if ch.active else [f], send)
            except _Undelivered as u:  # the run is stopping: what was not delivered is dropped, and counted
                self.counts.add_dropped("shutdown", u.steps + sum(g.length for g in frags[k + 1:]) + ch.held_steps())
                ch.flush()
                raise u.closed
        return True

    def release_held(self, send: Callable[[Fragment], None]) -> None:
        """Deliver what chaos holds back now (before the actor pauses: a delay must not last forever)."""
        try:
            _deliver(self.channel.flush(), send)
        except _Undelivered as u:
            self.counts.add_dropped("shutdown", u.steps)
            raise u.closed

    def finish(self, send: Callable[[Fragment], None]) -> None:
        """Normal end of this incarnation: deliver whatever chaos still holds back, then close."""
        from ..transport import Closed

        try:
            self.release_held(send)
        except Closed:
            pass  # counted as shutdown drops by release_held
        self.close()

    def close(self) -> None:
        """End this incarnation on any path (finished, crashed, abandoned, stopped): its chaos counts are
        merged into the run's exactly once, and its envs are closed."""
        if not self._closed:
            self._closed = True
            self.counts.add_chaos(self.channel.counts)
            self.actor.close()


class _Undelivered(Exception):
    def __init__(self, steps: int, closed: BaseException):
        self.steps, self.closed = steps, closed


def _deliver(deliveries: List[Fragment], send: Callable[[Fragment], None]) -> None:
    """Send each delivery; if the transport closes part-way, report the distinct fragments not delivered."""
    from ..transport import Closed

    delivered = set()
    for j, d in enumerate(deliveries):
        try:
            send(d)
        except Closed as e:
            lost = {id(x): x.length for x in deliveries[j:] if id(x) not in delivered}
            raise _Undelivered(sum(lost.values()), e) from e
        delivered.add(id(d))


class LearnerDriver:
    """The learner side of every runner. ``gauges()`` supplies the runner's transport readings
    (queue depth/bytes, counters by reason) and ``actors()`` its actors' stats, both read at each update."""

    def __init__(self, cfg: Config, learner: Learner, tracker: Tracker, budget: Budget, admission: Admission,
                 publish: Callable[[Snapshot], None],
                 gauges: Optional[Callable[[], Dict[str, float]]] = None,
                 actors: Optional[Callable[[], Mapping[int, ActorStats]]] = None,
                 checkpoint_dir: Optional[Path] = None):
        self.cfg = cfg
        self.learner = learner
        self.tracker = tracker
        self.budget = budget
        self.admission = admission
        self.publish = publish
        self.gauges = gauges or (lambda: {})
        self.actors = actors or (lambda: {})
        self.checkpoint_dir = checkpoint_dir
        self.acct = Accounting()
        self.need = batch_fragments(cfg)
        self.tagged = cfg.env.id == TAGGED_ID
        self.pending: List[Tuple[Fragment, bool]] = []  # (fragment, is a charged duplicate)
        self._ages: List[float] = []
        self._kept = 0
        self._lag_dropped = 0
        self._t_last = time.perf_counter()
        self.wait_s = 0.0
        self.compute_s = 0.0
        self.stalls = 0

    def offer(self, frag: Fragment, age_s: float = 0.0) -> Optional[Dict[str, float]]:
        """Hand one delivered fragment to the learner; returns the update's metrics row when it completed
        a batch."""
        reason = self.admission.admit(frag, self.learner.version)
        dup = reason == "charged"
        if reason is not None and not dup:
            return None  # refused (counted by admission) or an ignored duplicate
        fid = frag.id
        if not dup:
            if self.tagged:
                done = frag.terminated | frag.truncated
                self.acct.misattributed += audit_tags(frag.obs, fid.actor_id * self.cfg.actor.envs_per_actor
                                                      + fid.env_index, fid.episode_id, fid.episode_t0, done)
            self.acct.coverage[f"{fid.actor_id}/{fid.env_index}"] += frag.length
        lag = self.learner.take(frag) if not dup else self.learner.version - fid.behavior_version
        if not lag_ok(self.cfg, lag):
            if not dup:
                self.acct.dropped["lag"] += frag.length
                self._lag_dropped += frag.length
            return None
        self._kept += frag.length
        self.pending.append((frag, dup))
        self._ages.append(age_s)
        if len(self.pending) < self.need:
            return None
        return self._update()

    def _update(self) -> Dict[str, float]:
        pending, ages = self.pending, self._ages
        self.pending, self._ages = [], []
        frags = [f for f, _ in pending]
        t0 = time.perf_counter()
        wait = t0 - self._t_last
        lags = self.learner.version - np.array([f.id.behavior_version for f in frags])
        m = self.learner.update(frags, self.budget.used)
        compute = time.perf_counter() - t0
        self.wait_s += wait
        self.compute_s += compute
        self.acct.trained += sum(f.length for f, dup in pending if not dup)
        m["lag/kept_frac"] = self._kept / max(1, self._kept + self._lag_dropped)
        self._kept = self._lag_dropped = 0
        m["transport/age_s_mean"] = float(np.mean(ages))
        m["transport/age_s_max"] = float(np.max(ages))
        m["transport/admitted"] = float(self.acct.trained)
        m["transport/admitted_fragments"] = float(self.admission.stats.admitted_fragments)
        m["transport/bytes_admitted"] = float(self.admission.stats.bytes_admitted)
        m["transport/duplicates"] = float(self.admission.stats.duplicates_detected)
        m["transport/misattributed"] = float(self.acct.misattributed)
        m.update(counters("transport/rejected", self.admission.stats.rejected))
        m["learner/wait_s"] = wait
        m["learner/compute_s"] = compute
        m["learner/wait_frac"] = self.wait_s / max(self.wait_s + self.compute_s, 1e-9)
        m["learner/updates_per_s"] = self.learner.updates / max(self.tracker.wall(), 1e-9)
        m.update(self.gauges())
        if self.learner.updates % self.cfg.learner.broadcast_every == 0:
            self.publish(self.learner.snapshot())
        every = self.cfg.learner.checkpoint_every
        if every and self.checkpoint_dir is not None and self.learner.updates % every == 0:
            self.learner.save_checkpoint(self.checkpoint_dir / "latest.pt", self.budget.used)
        # per-transition version lag (fragments have equal length, so per-fragment values weigh the same)
        hists = {"lag/version_lag": lags, "transport/age_s": np.asarray(ages),
                 # coverage: admitted steps so far per env instance (a skew shows which envs data is lost from)
                 "transport/coverage": np.fromiter(self.acct.coverage.values(), dtype=np.float64)}
        row = self.tracker.log_update(m, self.budget.used, hists, self.actors())
        ch = self.cfg.chaos
        if ch.stall_every_updates and self.learner.updates % ch.stall_every_updates == 0 and ch.stall_s > 0:
            self.stalls += 1
            time.sleep(ch.stall_s)  # the injected fault: a learner that stops consuming for a while
        self._t_last = time.perf_counter()
        return row

    def drop_pending(self, reason: str = "shutdown") -> None:
        n = sum(f.length for f, dup in self.pending if not dup)
        if n:
            self.acct.dropped[reason] += n
        self.pending, self._ages = [], []

    def close(self, counts: SharedCounts) -> Accounting:
        """Final accounting, once no actor can produce any more."""
        self.drop_pending("shutdown")
        acct = self.acct
        acct.produced = counts.produced
        for reason, n in counts.dropped.items():
            acct.dropped[reason] += n
        for reason, n in self.admission.stats.rejected.items():
            acct.rejected[reason] += n
        for (bucket, reason), n in self.admission.stats.discarded.items():  # refused/evicted by the transport
            (acct.dropped if bucket == "dropped" else acct.rejected)[reason] += n
        acct.dropped["lost_in_transit"] += counts.chaos.dropped_steps
        acct.dropped = collections.Counter({k: v for k, v in acct.dropped.items() if v})
        acct.rejected = collections.Counter({k: v for k, v in acct.rejected.items() if v})
        return acct


def counters(prefix: str, counts: Mapping[str, int]) -> Dict[str, float]:
    """``{prefix: total, prefix/<reason>: n}``: the total is always present, reasons once they occur."""
    out = {prefix: float(sum(counts.values()))}
    out.update({f"{prefix}/{reason}": float(n) for reason, n in counts.items()})
    return out


def transport_summary(acct: Accounting, admission: Admission, chaos: ChaosCounts, restarts: int,
                      extra: Optional[Dict[str, object]] = None) -> Dict[str, object]:
    t = acct.as_dict()
    st = admission.stats
    t.update({"duplicates_detected": st.duplicates_detected, "duplicate_steps_admitted": st.duplicate_steps_admitted,
              "bytes_admitted": st.bytes_admitted, "admitted_fragments": st.admitted_fragments})
    t.update(extra or {})
    # ``actors`` stays the actor count in summary.json; restarts get their own key
    return {"transport": t, "chaos": chaos.as_dict(), "actor_restarts": restarts}
