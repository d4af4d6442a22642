"""The learner driver, the same for every runner: admission -> lag filter -> KL filter -> batch -> (tagged
audit) -> update -> publish -> checkpoint -> log, with the transport's books checked at every update."""
from __future__ import annotations

import collections
import dataclasses
import logging
import os
import time
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np

from .. import timeline
from ..console import cpu_starved, starved_text
from ..accounting import Balance, Budget, Ledger, merged
from ..actor import ActorStats
from ..admission import Admission
from ..config import Config, machine_cpu_ticks, usable_cpus
from ..fragment import Fragment
from ..config import batch_fragments
from ..learner import Learner, lag_ok
from ..policy import Snapshot
from ..tagged import TAGGED_ID
from ..tracking import Tracker
from .supervisor import ActorFailed, check_stop, wait_unless_stopped

log = logging.getLogger("laglab")


def machine_busy_s(ours: Optional[bool] = None) -> Optional[float]:
    """CPU seconds the whole machine has been busy since boot (:func:`laglab.config.machine_cpu_ticks`), or None
    where that is not the run's machine to read: not Linux, or fewer usable CPUs than the machine counts (a
    container's cpuset or quota on a bigger host, whose other tenants /proc/stat would count too). ``ours``: that
    judgement, if already made (it reads cgroup files)."""
    try:
        if not (ours if ours is not None else usable_cpus() == os.cpu_count()):
            return None
        return machine_cpu_ticks()[1] / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class LearnerDriver:
    """``link_steps()`` is what the runner's links still hold (steps of fragments handed over whose first copy
    has not arrived) and ``queue_steps()`` the first-copy steps in its queue (both read under the ledger's lock); ``gauges()`` adds the runner's own readings (queue depth,
    bytes) and ``actors()`` its actors' stats, at each update."""

    def __init__(self, cfg: Config, learner: Learner, tracker: Tracker, budget: Budget, admission: Admission,
                 ledger: Ledger, publish: Callable[[Snapshot], None],
                 link_steps: Callable[[], int] = lambda: 0,
                 queue_steps: Callable[[], int] = lambda: 0,
                 gauges: Optional[Callable[[], Dict[str, float]]] = None,
                 actors: Optional[Callable[[], Mapping[int, ActorStats]]] = None,
                 checkpoint_dir: Optional[Path] = None,
                 raise_actors: Optional[Callable[[int], Optional[str]]] = None):
        self.cfg = cfg
        self.learner = learner
        self.tracker = tracker
        self.budget = budget
        self.admission = admission
        self.ledger = ledger
        self.publish = publish
        self.link_steps = link_steps
        self.queue_steps = queue_steps
        self.gauges = gauges or (lambda: {})
        self.actors = actors or (lambda: {})
        self.checkpoint_dir = checkpoint_dir
        self.need = batch_fragments(cfg)
        self.tagged = cfg.env.id == TAGGED_ID
        self.pending: List[Tuple[Fragment, bool]] = []  # (fragment, is the first copy) staged for the next batch
        self.trained = 0  # first-copy transitions trained on
        self.dropped: Dict[str, int] = collections.Counter()  # lag, shutdown (staging)
        self.misattributed = 0
        self.coverage: Dict[str, int] = collections.Counter()  # "actor/env" -> admitted steps
        self.worst_unaccounted = 0
        self._ages: List[float] = []
        self._kept = 0
        self._lag_dropped = 0
        self._kl_dropped = 0
        self._kl_offered: List[float] = []  # KL(behavior || current) of the fragments offered since the last update
        self.kl_publications = 0  # publications forced by learner.max_kl_behavior between broadcast_every's
        self._published = learner.version  # the newest version published
        self._acting = learner.version  # the version the actors are given (history[0] under actor.fixed_lag)
        self._t_last = time.perf_counter()
        self.wait_s = 0.0
        self._offer_s = 0.0  # since the last update
        self.compute_s = 0.0
        self.stalls = 0
        self._cpu_first: Optional[Tuple[float, ...]] = None  # the first update's CPU reading (see _cpu_reading)
        self._machine_ours = usable_cpus() == os.cpu_count()  # (judged once: the machine is read at every update)
        self._cpu_mark: Optional[Tuple[float, ...]] = None  # the last check's
        self.offer_total = 0.0  # the learner's time taking fragments in, over the run
        self.cpu_warned = False  # starved actors were reported (see _watch_cpu)
        # the niceness the actors run at now: runner.actor_nice for process actors (Ray's runner sets what its
        # workers report: Ray starts them at 15); starved, they are raised to the learner's where the OS allows it
        # (raise_actors(nice): None when done, else why not)
        self.raise_actors = raise_actors
        self.actor_nice = int(cfg.runner.actor_nice) if cfg.runner.name.value == "process" else 0
        self.raised: Optional[Dict[str, object]] = None  # what _watch_cpu did about starved actors (summary's cpu)
        # actor.fixed_lag=k: actors get the snapshot k publications behind the newest (with the newest credits)
        self._history = collections.deque([learner.snapshot()], maxlen=(cfg.actor.fixed_lag or 0) + 1)

    def offer(self, frag: Fragment, first: Optional[bool], age_s: float = 0.0) -> Optional[Dict[str, float]]:
        """Hand one arrived fragment to the learner; returns the update's metrics row when it completed a batch.
        The time spent on fragments outside updates (admission, books, staging) is ``learner/offer_s``."""
        t0 = time.perf_counter()
        full = self._stage(frag, first, age_s)
        self._offer_s += time.perf_counter() - t0
        return self._update() if full else None

    def _stage(self, frag: Fragment, first: Optional[bool], age_s: float) -> bool:
        """Admit and stage one fragment (or refuse or drop it, booked); True when the batch is complete."""
        timeline.mark("first_fragment")
        reason = self.admission.admit(frag, first, self.learner.version)
        if reason not in (None, "charged"):
            return False  # refused (counted by admission) or an ignored duplicate
        first = reason is None
        fid = frag.id
        if first:
            self.coverage[f"{fid.actor_id}/{fid.env_index}"] += frag.length
        lag = self.learner.take(frag) if first else self.learner.version - fid.behavior_version
        if not lag_ok(self.cfg, lag):
            if first:
                self.dropped["lag"] += frag.length
                self._lag_dropped += frag.length
            return False
        cap = self.cfg.learner.max_kl_behavior
        if cap is not None:  # seed 004's staleness cap: data too far from the current policy is not trained on
            kl = self.learner.fragment_kl(frag)
            self._kl_offered.append(kl)
            if kl > cap:
                if first:
                    self.dropped["kl"] += frag.length
                    self._kl_dropped += frag.length
                if self._acting < self.learner.version:  # seed 004: past the cap, sync the actors at once
                    self.kl_publications += 1
                    self._publish(sync=True)
                return False
        self._kept += frag.length
        self.pending.append((frag, first))
        self._ages.append(age_s)
        return len(self.pending) >= self.need

    def starved_credits(self) -> Dict[int, int]:
        """Throttle credit while the learner waits for data: per incarnation, what it has received (its
        watermark) or, if more, everything the incarnation handed to its link. With nothing queued, what was
        sent and not received met its fate on the way (lost, refused) or is still held on a link; without this,
        an actor whose newest fragments were all lost would pause for credit that never comes."""
        with self.ledger.lock:
            sent = self.ledger.sent_by_incarnation()
        out = dict(self.learner.consumed)
        for inc, n in sent.items():
            if n > out.get(inc, 0):
                out[inc] = n
        return out

    def staging_steps(self) -> int:
        return sum(f.length for f, first in self.pending if first)

    def balance(self) -> Balance:
        """Read the books (one consistent state, under the ledger's lock)."""
        led = self.ledger
        with led.lock:
            link = self.link_steps()
            queue = self.queue_steps()
            lost = led.lost(link)
            return Balance(
                produced=led.produced, admitted=self.trained,
                dropped=merged(led.dropped, self.dropped, {"lost_in_transit": lost}),
                rejected=merged(led.rejected, self.admission.stats.rejected),
                in_flight={"in_hand": led.in_hand, "link": link, "queue": queue, "staging": self.staging_steps()})

    def _update(self) -> Dict[str, float]:
        check_stop()  # a stop requested while the batch was staged: no update starts (the batch stays staged)
        before = self.balance()  # learner progress for the lr schedule: transitions that met a fate so far
        progress = before.admitted + sum(before.dropped.values()) + sum(before.rejected.values())
        pending, ages = self.pending, self._ages  # staged until trained (an interrupt mid-update drops them)
        frags = [f for f, _ in pending]
        t0 = time.perf_counter()
        wait = t0 - self._t_last
        lags = self.learner.version - np.array([f.id.behavior_version for f in frags])
        started = self.tracker.wall()
        m = self.learner.update(frags, progress, audit=self.tagged)
        timeline.mark("first_update")
        self.misattributed += int(m.pop("transport/audit_misattributed", 0))
        compute = time.perf_counter() - t0
        self.wait_s += wait
        self.compute_s += compute
        self.trained += sum(f.length for f, first in pending if first)
        self.pending, self._ages = [], []
        m["lag/kept_frac"] = self._kept / max(1, self._kept + self._lag_dropped + self._kl_dropped)
        cap = self.cfg.learner.max_kl_behavior
        if cap is not None:
            m["lag/kl_dropped_frac"] = self._kl_dropped / max(1, self._kept + self._lag_dropped + self._kl_dropped)
            m["lag/kl_offered_mean"] = float(np.mean(self._kl_offered)) if self._kl_offered else 0.0
            m["lag/kl_offered_max"] = float(np.max(self._kl_offered)) if self._kl_offered else 0.0
        self._kept = self._lag_dropped = self._kl_dropped = 0
        m["transport/age_s_mean"] = float(np.mean(ages))
        m["transport/age_s_max"] = float(np.max(ages))
        st, led = self.admission.stats, self.ledger
        m["transport/admitted"] = float(self.trained)
        m["transport/admitted_fragments"] = float(st.admitted_fragments)
        m["transport/bytes_admitted"] = float(st.bytes_admitted)
        m["transport/duplicates"] = float(led.duplicates)
        m["transport/misattributed"] = float(self.misattributed)
        bal = self.balance()
        self.worst_unaccounted = max(self.worst_unaccounted, abs(bal.unaccounted))
        m.update(bal.metrics())
        m["learner/wait_s"] = wait
        m["learner/compute_s"] = compute
        m["learner/offer_s"] = self._offer_s
        self.offer_total += self._offer_s
        self._offer_s = 0.0
        m["learner/wait_frac"] = self.wait_s / max(self.wait_s + self.compute_s, 1e-9)
        m["learner/updates_per_s"] = self.learner.updates / max(self.tracker.wall(), 1e-9)
        m.update(self.gauges())
        # cumulative CPU seconds (an analysis takes differences over a window, as laglab.sim --calibrate does over
        # the steady middle half): the learner's process, every thread; the whole machine, where it is the run's
        m["cpu/learner_s"] = time.process_time()
        busy = machine_busy_s(self._machine_ours)
        m["cpu/machine_busy_s"] = busy if busy is not None else float("nan")
        self._kl_offered = []
        if cap is not None:
            m["learner/kl_publications"] = float(self.kl_publications)
        # the update's start and the end of its publication on the run's clock (calls.parquet's clock: what
        # benchmarks/phase_profile.py places each Ray call against)
        m["learner/started_t"], m["learner/published_t"] = started, float("nan")
        m["learner/closed_by"] = float(frags[-1].id.incarnation)  # (whose fragment completed the batch)
        if self.learner.updates % self.cfg.learner.broadcast_every == 0:
            self._publish()
            m["learner/published_t"] = self.tracker.wall()
        every = self.cfg.learner.checkpoint_every
        if every and self.checkpoint_dir is not None and self.learner.updates % every == 0:
            self.learner.save_checkpoint(self.checkpoint_dir / "latest.pt", self.budget.used)
        # per-transition version lag (fragments have equal length, so per-fragment values weigh the same)
        hists = {"lag/version_lag": lags, "transport/age_s": np.asarray(ages),
                 # coverage: admitted steps so far per env instance (a skew shows which envs data is lost from)
                 "transport/coverage": np.fromiter(self.coverage.values(), dtype=np.float64)}
        stats = self.actors()
        row = self.tracker.log_update(m, self.budget.used, hists, stats)
        self._watch_cpu(stats)
        ch = self.cfg.chaos
        if ch.stall_every_updates and self.learner.updates % ch.stall_every_updates == 0 and ch.stall_s > 0:
            self.stalls += 1
            wait_unless_stopped(ch.stall_s)  # the injected fault: a learner that stops consuming for a while
        self._t_last = time.perf_counter()
        return row

    CPU_WINDOW_S = 5.0  # starved actors are judged on windows at least this long (from one update to a later one)

    def _cpu_reading(self, stats: Mapping[int, ActorStats]) -> Tuple[float, ...]:
        """(time, the actors' CPU seconds and CPU waits, the learner's waits for data less its time taking
        fragments in, this process's CPU seconds), cumulative."""
        return (time.perf_counter(), sum(getattr(s, "cpu_s", 0.0) for s in stats.values()),
                sum(getattr(s, "cpu_wait_s", 0.0) for s in stats.values()), self.wait_s - self.offer_total,
                time.process_time(), machine_busy_s(self._machine_ours))

    def _cpu_window(self, a: Tuple[float, ...], b: Tuple[float, ...]) -> Optional[Dict[str, float]]:
        """What happened between two readings; None when an actor's counters went back (a restarted actor
        counts from 0) or there is no span."""
        span = b[0] - a[0]
        cpu, wait, idle, own = (y - x for x, y in zip(a[1:5], b[1:5]))
        if span <= 0 or cpu < 0 or wait < 0:
            return None
        # the run's own share of the CPUs it may use; unknown for a Ray cluster (actors on other hosts' CPUs)
        local = self.cfg.runner.name.value != "ray" or getattr(self.cfg.runner, "address", None) in (None, "", "local")
        # what every other process on the machine computed meanwhile (Ray's own: raylet, GCS, the snapshot board;
        # or another job's load), where the machine's CPUs are the run's (/proc/stat counts them all). Signed: on
        # this VM /proc/stat's ticks read 5-9% below the processes' own CPU clocks, so a quiet process run reads < 0
        others = b[5] - a[5] - cpu - own if local and a[5] is not None and b[5] is not None else None
        return {"span_s": span, "actors_cpu_s": cpu, "actors_wait_s": wait, "learner_wait_frac": idle / span,
                "learner_cpu_s": own, "run_cpu_share": (cpu + own) / (span * usable_cpus()) if local else None,
                "others_cpu_s": others}

    def _watch_cpu(self, stats: Mapping[int, ActorStats]) -> None:
        """Say once, while it happens, when other processes starve the actors of CPU (console.cpu_starved: the
        actors waited for a core most of the time they were ready to run while the learner waited for data and
        the run itself used under half of the CPUs)."""
        if not stats:
            return
        if self._cpu_first is None:
            self._cpu_first = self._cpu_mark = self._cpu_reading(stats)
            return
        if self.cpu_warned or time.perf_counter() - self._cpu_mark[0] < self.CPU_WINDOW_S:
            return  # (nothing is read between checks)
        mark = self._cpu_reading(stats)
        w = self._cpu_window(self._cpu_mark, mark)
        self._cpu_mark = mark
        frac = cpu_starved(w["actors_cpu_s"], w["actors_wait_s"], w["learner_wait_frac"], w["run_cpu_share"]) \
            if w else None
        if frac is not None:
            self.cpu_warned = True
            nice = self.actor_nice
            refused = None
            if nice > 0 and self.raise_actors is not None:
                mine = os.getpriority(os.PRIO_PROCESS, 0)  # (the learner's thread)
                refused = self.raise_actors(mine)
                self.raised = {"at_s": round(mark[0] - self._cpu_first[0], 2), "wait_frac": round(frac, 4),
                               "learner_wait_frac": round(w["learner_wait_frac"], 4),
                               "from_nice": nice, "to_nice": None if refused else mine, "refused": refused}
                if not refused:
                    self.actor_nice = mine
            log.warning("laglab: %s", starved_text(frac, w["learner_wait_frac"], self.cfg.runner.name.value, nice,
                                                  raised=self.raised))

    def cpu_summary(self) -> Optional[Dict[str, object]]:
        """summary.json's ``cpu``, judged as the live check judges a window, over the run from its first update
        to now (process and Ray runners; null where no actor measured a wait for a CPU, or an actor restarted)."""
        if self.cfg.runner.name.value not in ("process", "ray") or self._cpu_first is None:
            return None
        try:  # (a failed or interrupted run's books are read once its runner has released the actors' stats)
            stats = self.actors()
        except Exception:  # noqa: BLE001 - the figure is left out; the books must still be written
            return None
        w = self._cpu_window(self._cpu_first, self._cpu_reading(stats)) if stats else None
        if not w or w["actors_wait_s"] <= 0:
            return None
        cpu, wait = w["actors_cpu_s"], w["actors_wait_s"]
        return {**{k: round(v, 4) if isinstance(v, float) else v for k, v in w.items()},
                "actors_wait_frac": wait / (cpu + wait),
                "actor_nice": self.actor_nice, "raised": self.raised,
                "starved": cpu_starved(cpu, wait, w["learner_wait_frac"], w["run_cpu_share"]) is not None}

    def _publish(self, sync: bool = False) -> None:
        """Publish the learner's policy. The actors get it, or under ``actor.fixed_lag=k`` the snapshot k
        publications back; ``sync`` (a fragment past ``learner.max_kl_behavior``): the actors get the newest
        whatever ``fixed_lag`` says, and the lag then grows back to k over the next publications (under a fixed
        lag a cap that only dropped data would starve the learner: nothing fresher would ever come). Publishing a
        version again (no update since) ships the same weights and statistics."""
        with self.ledger.lock:  # throttle credit is for live incarnations: forget the retired ones'
            gone = [i for i in self.learner.consumed if i not in self.ledger.owner]
        for inc in gone:
            del self.learner.consumed[inc]
        newest = self.learner.publish_snapshot()
        self._published = newest.version
        if sync:
            self._history.clear()
        self._history.append(newest)
        acting = self._history[0]
        self._acting = acting.version
        self.publish(acting if acting is newest else dataclasses.replace(acting, consumed=newest.consumed))

    def close(self) -> Balance:
        """Final books, once no actor can produce any more: what is still staged is dropped (shutdown)."""
        n = self.staging_steps()
        if n:
            self.dropped["shutdown"] += n
        self.pending, self._ages = [], []
        return self.balance()

    def summary(self, bal: Balance, restarts: int, chaos: Dict[str, object],
                extra: Optional[Dict[str, object]] = None) -> Dict[str, object]:
        """The ``transport``, ``chaos`` and ``actor_restarts`` entries of summary.json."""
        t = bal.as_dict()
        st, led = self.admission.stats, self.ledger
        t.update({"misattributed": self.misattributed, "coverage": dict(sorted(self.coverage.items())),
                  "duplicates_detected": led.duplicates, "duplicate_steps_admitted": st.duplicate_steps_admitted,
                  "too_old": led.too_old, "unattributed": led.unattributed, "bytes_admitted": st.bytes_admitted,
                  "admitted_fragments": st.admitted_fragments, "worst_unaccounted_at_update": self.worst_unaccounted})
        if self.cfg.learner.max_kl_behavior is not None:
            t["kl_forced_publications"] = self.kl_publications
        t.update(extra or {})
        chaos = dict(chaos)
        chaos["stalls"] = self.stalls
        # ``actors`` stays the actor count in summary.json; restarts get their own key
        return {"transport": t, "chaos": chaos, "actor_restarts": restarts, "cpu": self.cpu_summary()}


def serve(queue, driver: LearnerDriver, supervise: Callable[[], bool], grant: Callable[[Dict[int, int]], None],
          cfg: Config) -> None:
    """The learner's loop for runners with a queue: take what arrives, and while starved, credit the actors'
    throttle with what the learner has received since the last snapshot or grant (else paused actors wait for
    credit only the next update would give) and supervise; end once no actor can produce and the queue is
    empty; fail when no data arrives for ``runner.actor_timeout_s``."""
    poll = cfg.runner.poll_s
    granted = dict(driver.learner.consumed)
    last_data = time.monotonic()
    while True:
        check_stop()
        item = queue.get(poll)
        if item is None:
            credits = driver.starved_credits()
            if credits != granted:
                granted = credits
                grant(granted)
            if not supervise() and queue.depth == 0:
                return
            if time.monotonic() - last_data > cfg.runner.actor_timeout_s:
                raise ActorFailed(f"no data from any actor for {cfg.runner.actor_timeout_s}s (runner.actor_timeout_s)")
            continue
        last_data = time.monotonic()
        driver.offer(*item)
        supervise()
