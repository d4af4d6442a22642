"""The learner driver on its own: a scripted learner, tracker and clock around the real admission and ledger, so
each figure the driver reports (kept and dropped fractions, wait and compute time, update rate, the lag
histogram, the lr schedule's progress), each publication, stall and checkpoint can be checked exactly. The
runs in test_books / test_staleness_controls / test_protocol check the same driver end to end."""
import dataclasses
from types import SimpleNamespace
from typing import Dict

import numpy as np
import pytest
from omegaconf import OmegaConf

from laglab import timeline
from laglab.accounting import Budget, Ledger
from laglab.admission import Admission
from laglab.config import Config, Duplicates, validate
from laglab.runners import driver as drv
from laglab.runners.supervisor import ActorFailed
from laglab.tagged import TAGGED_ID
from test_admission import DISCRETE, frag

T = 4  # rollout_len (test_admission's fragments are 4 steps long)


@dataclasses.dataclass
class Snap:
    version: int
    consumed: Dict[int, int]


class Clock:
    """perf_counter and monotonic, advanced only by the test."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


class ScriptedLearner:
    """What the driver asks of a learner: ``kl`` maps a fragment's t_start to its KL(behavior || current);
    an update takes ``update_s`` on the clock and makes a new version."""

    def __init__(self, clock, kl=None, update_s=0.25, take_s=0.0):
        self.clock, self.kl, self.update_s, self.take_s = clock, kl or {}, update_s, take_s
        self.version = 0
        self.updates = 0
        self.consumed: Dict[int, int] = {}
        self.calls = []  # (t_starts, progress, audit) per update
        self.saved = []  # updates at each checkpoint

    def snapshot(self):
        return Snap(self.version, dict(self.consumed))

    publish_snapshot = snapshot

    def take(self, f):
        self.clock.t += self.take_s
        self.consumed[f.id.incarnation] = max(self.consumed.get(f.id.incarnation, 0), f.id.t_end + 1)
        return self.version - f.id.behavior_version

    def fragment_kl(self, f):
        return self.kl.get(f.id.t_start, 0.0)

    def update(self, frags, progress, audit=False):
        self.calls.append(([f.id.t_start for f in frags], progress, audit))
        self.clock.t += self.update_s
        self.updates += 1
        self.version += 1
        return {}

    def save_checkpoint(self, path, used):
        self.saved.append(self.updates)


class Tracker:
    def __init__(self, wall=4.0):
        self._wall = wall
        self.hists = []
        self.actors = []

    def wall(self):
        return self._wall

    def log_update(self, m, env_steps, hists=None, actors=None):
        self.hists.append(hists)
        self.actors.append(actors)
        return dict(m)


def cfg_of(**over) -> Config:
    base = {"actors": 2, "total_env_steps": 4096,
            "actor": {"envs_per_actor": 4, "rollout_len": T}, "learner": {"batch_size": 2 * T, "minibatches": 1},
            "tracking": {"console_every_s": 1e9, "wandb": {"mode": "disabled"}}}
    return validate(OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.create(base), OmegaConf.create(over)))


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(drv, "time", SimpleNamespace(perf_counter=c, monotonic=c, process_time=c))
    monkeypatch.setattr(timeline, "_marks", dict(timeline._marks))  # (the driver marks first fragment / update)
    return c


def make(clock, cfg=None, kl=None, checkpoint_dir=None, gauges=None, actors=None, duplicates="ignore"):
    cfg = cfg or cfg_of()
    learner = ScriptedLearner(clock, kl)
    published = []
    d = drv.LearnerDriver(cfg, learner, Tracker(), Budget(cfg.total_env_steps),
                          Admission(DISCRETE, 2, 4, Duplicates(duplicates), rollout_len=T), Ledger(T, 4),
                          publish=published.append, gauges=gauges, actors=actors, checkpoint_dir=checkpoint_dir)
    return d, learner, published


def f(t, version=0, env=3, inc=0):
    """The fragment of env ``env`` at timestep ``t`` (a multiple of T), acted on by ``version``."""
    return frag(t_start=t, t_end=t + T - 1, episode_t0=0, behavior_version=version, env_index=env, incarnation=inc)


def test_the_batch_is_complete_at_exactly_the_fragments_it_needs(clock):
    d, ln, _ = make(clock)  # batch_size 2T: two fragments
    assert d.offer(f(0), True) is None and ln.updates == 0
    row = d.offer(f(T), True)
    assert ln.updates == 1 and ln.calls[0][0] == [0, T] and isinstance(row, dict) and "lag/kept_frac" in row
    assert d.trained == 2 * T and d.pending == []


def test_a_dropped_or_refused_fragment_never_completes_a_batch(clock):
    d, ln, _ = make(clock, cfg_of(learner={"batch_size": 2 * T, "minibatches": 1, "max_policy_lag": 0,
                                           "max_kl_behavior": 0.5}), kl={8 * T: 0.9})
    ln.version = 2
    assert d.offer(f(0, version=1), True) is None  # lag 1 > 0: dropped
    assert d.offer(f(8 * T, version=2), True) is None  # KL 0.9 > 0.5: dropped
    assert d.offer(f(16 * T, version=3), True) is None  # from the future: refused by admission
    assert d.offer(f(24 * T, version=2), True) is None  # the first kept one
    assert ln.updates == 0 and len(d.pending) == 1
    assert d.dropped == {"lag": T, "kl": T} and d.admission.stats.rejected == {"future_version": T}


def test_kept_and_dropped_fractions_count_the_steps_offered_since_the_last_update(clock):
    cfg = cfg_of(learner={"batch_size": 2 * T, "minibatches": 1, "max_policy_lag": 1, "max_kl_behavior": 0.5})
    d, ln, _ = make(clock, cfg, kl={t * T: 0.9 for t in (10, 11)})
    ln.version = 3
    d.offer(f(0, version=0), True)  # lag 3: dropped
    d.offer(f(10 * T, version=3), True)  # KL over the cap: dropped
    d.offer(f(11 * T, version=3), True)  # KL over the cap: dropped
    d.offer(f(2 * T, version=2), True)  # kept (lag 1)
    row = d.offer(f(3 * T, version=3), True)  # kept: the batch
    assert row["lag/kept_frac"] == pytest.approx(2 / 5)
    assert row["lag/kl_dropped_frac"] == pytest.approx(2 / 5)
    assert row["lag/kl_offered_max"] == pytest.approx(0.9)
    assert row["lag/kl_offered_mean"] == pytest.approx((0.9 + 0.9 + 0 + 0) / 4)
    row = d.offer(f(4 * T, version=4), True) or d.offer(f(5 * T, version=4), True)  # the next batch: all kept
    assert row["lag/kept_frac"] == 1.0 and row["lag/kl_dropped_frac"] == 0.0 and row["lag/kl_offered_max"] == 0.0


def test_a_fragment_exactly_at_the_kl_cap_is_kept(clock):
    d, ln, _ = make(clock, cfg_of(learner={"batch_size": 2 * T, "minibatches": 1, "max_kl_behavior": 0.25}),
                    kl={0: 0.25, T: 0.25})
    assert d.offer(f(0), True) is None
    assert d.offer(f(T), True) is not None and "kl" not in d.dropped


def test_the_version_lag_histogram_is_the_learners_version_minus_each_behavior_version(clock):
    d, ln, _ = make(clock)
    ln.version = 5
    d.offer(f(0, version=2), True)
    d.offer(f(T, version=5), True)
    np.testing.assert_array_equal(d.tracker.hists[0]["lag/version_lag"], [3, 0])


def test_the_lr_schedule_is_told_every_step_that_met_a_fate(clock):
    """progress = admitted + dropped + rejected before the update (the learner anneals on it)."""
    d, ln, _ = make(clock, cfg_of(learner={"batch_size": 2 * T, "minibatches": 1, "max_policy_lag": 0}))
    d.offer(f(0), True)
    d.offer(f(T), True)  # update 1: progress 0
    d.offer(f(2 * T, version=0), True)  # version is 1 now: lag 1, dropped
    d.offer(f(3 * T, version=2), True)  # from the future: rejected
    d.offer(f(4 * T, version=1), True)
    d.offer(f(5 * T, version=1), True)  # update 2
    assert [c[1] for c in ln.calls] == [0, 2 * T + T + T]


def test_wait_compute_and_offer_time_and_the_update_rate(clock):
    d, ln, _ = make(clock)
    ln.take_s = 0.125  # staging a fragment takes 1/8 s on the clock (counted as offer time, and as waiting)
    clock.t += 1.0  # the learner waits a second for its first fragment
    d.offer(f(0), True)
    clock.t += 0.25
    row = d.offer(f(T), True)  # the update takes 0.25 s on the clock
    assert row["learner/wait_s"] == pytest.approx(1.5) and row["learner/compute_s"] == pytest.approx(0.25)
    assert row["learner/offer_s"] == pytest.approx(0.25)  # both fragments' staging, since the last update
    assert row["learner/wait_frac"] == pytest.approx(1.5 / 1.75)
    ln.take_s = 0.0
    assert row["learner/updates_per_s"] == pytest.approx(1 / 4.0)  # one update in the tracker's 4 s
    clock.t += 0.25
    d.offer(f(2 * T), True)
    row = d.offer(f(3 * T), True)
    assert row["learner/wait_s"] == pytest.approx(0.25)  # counted from the end of the last update
    assert row["learner/offer_s"] == 0.0  # reset at each update
    assert d.wait_s == pytest.approx(1.75) and d.compute_s == pytest.approx(0.5)
    assert row["learner/wait_frac"] == pytest.approx(1.75 / 2.25)
    assert row["learner/updates_per_s"] == pytest.approx(2 / 4.0)


def test_the_learner_stalls_after_every_nth_update(clock, monkeypatch):
    stalls = []
    monkeypatch.setattr(drv, "wait_unless_stopped", stalls.append)
    d, ln, _ = make(clock, cfg_of(chaos={"stall_every_updates": 2, "stall_s": 0.5}))
    for t in range(10):  # 5 updates
        d.offer(f(t * T), True)
    assert ln.updates == 5 and d.stalls == 2 and stalls == [0.5, 0.5]
    d, ln, _ = make(clock, cfg_of(chaos={"stall_every_updates": 1, "stall_s": 0.0}))
    for t in range(4):
        d.offer(f(t * T), True)
    assert ln.updates == 2 and d.stalls == 0  # a stall of 0 s is no stall


def test_checkpoints_every_nth_update_only_with_a_directory(clock, tmp_path):
    d, ln, _ = make(clock, cfg_of(learner={"batch_size": 2 * T, "minibatches": 1, "checkpoint_every": 2}),
                    checkpoint_dir=tmp_path)
    for t in range(10):
        d.offer(f(t * T), True)
    assert ln.saved == [2, 4]
    for every, where in ((2, None), (0, tmp_path)):
        d, ln, _ = make(clock, cfg_of(learner={"batch_size": 2 * T, "minibatches": 1, "checkpoint_every": every}),
                        checkpoint_dir=where)
        for t in range(6):
            d.offer(f(t * T), True)
        assert ln.updates == 3 and ln.saved == []


def test_a_kl_forced_publication_gives_the_actors_the_newest_snapshot_whatever_the_fixed_lag(clock):
    cfg = cfg_of(actor={"envs_per_actor": 4, "rollout_len": T, "fixed_lag": 2},
                 learner={"batch_size": 2 * T, "minibatches": 1, "max_kl_behavior": 0.5})
    d, ln, pub = make(clock, cfg, kl={100 * T: 0.9})
    inc = d.ledger.new_incarnation(1)  # a live incarnation of actor 1 (the retired ones' credit is forgotten)
    for t in range(6):  # 3 updates, a publication after each: versions 1, 2, 3; the actors get 2 back
        d.offer(f(t * T, version=ln.version, inc=inc), True)
    assert [s.version for s in pub] == [0, 0, 1] and d.kl_publications == 0
    # the actors get an old version with the newest throttle credit (what the learner has received by now)
    assert pub[-1].consumed == ln.consumed == {inc: 6 * T} and pub[0].consumed == {inc: 2 * T}
    d.offer(f(100 * T, version=1, inc=inc), True)  # over the cap
    assert d.kl_publications == 1 and pub[-1].version == ln.version == 3
    assert pub[-1].consumed == ln.consumed


def test_no_forced_publication_when_the_actors_already_act_on_the_newest(clock):
    d, ln, pub = make(clock, cfg_of(learner={"batch_size": 2 * T, "minibatches": 1, "max_kl_behavior": 0.5}),
                      kl={0: 0.9})
    d.offer(f(0), True)  # over the cap, but version 0 is what the actors have
    assert d.kl_publications == 0 and pub == [] and d.dropped["kl"] == T


def test_a_charged_duplicate_is_trained_on_again_at_its_own_lag(clock):
    cfg = cfg_of(learner={"batch_size": 2 * T, "minibatches": 1, "max_policy_lag": 1}, transport={"duplicates": "charge"})
    d, ln, _ = make(clock, cfg, duplicates="charge")
    ln.version = 3
    first = f(0, version=3)
    assert d.offer(first, True) is None
    assert d.offer(first, False) is not None  # the charged copy completes the batch
    assert d.trained == T  # only the first copy counts as trained (books)
    assert ln.calls[0][0] == [0, 0]
    ln.version = 6
    d.offer(f(T, version=4), False)  # a charged copy two versions old: past max_policy_lag, not staged
    assert d.pending == [] and "lag" not in d.dropped  # a duplicate's steps are not booked again


@pytest.mark.parametrize("env_id,audit", [("CartPole-v1", False), (TAGGED_ID, True)])
def test_the_tagged_env_turns_on_the_audit(clock, env_id, audit):
    d, ln, _ = make(clock, cfg_of(env={"id": env_id}))
    d.offer(f(0), True)
    d.offer(f(T), True)
    assert ln.calls[0][2] is audit


def test_the_runners_gauges_and_actor_stats_reach_each_update(clock):
    stats = {0: "actor 0's stats"}
    d, ln, _ = make(clock, gauges=lambda: {"queue/depth": 7.0}, actors=lambda: stats)
    d.offer(f(0), True)
    row = d.offer(f(T), True)
    assert row["queue/depth"] == 7.0 and d.tracker.actors == [stats]


class ScriptedQueue:
    """Hands out ``items``, then nothing (a poll of ``poll`` s on the clock); ``depths``: what each look at its
    depth reads (then 0)."""

    def __init__(self, clock, items, depths=()):
        self.clock, self.items, self.depths, self.looks = clock, list(items), list(depths), 0

    def get(self, poll):
        if self.items:
            return self.items.pop(0)
        self.clock.t += poll
        return None

    @property
    def depth(self):
        self.looks += 1
        return self.depths.pop(0) if self.depths else 0


def test_serve_waits_exactly_the_timeout_before_it_gives_up_on_the_actors(clock):
    cfg = cfg_of(runner={"name": "sync", "poll_s": 0.5, "actor_timeout_s": 2.0})
    d, ln, _ = make(clock, cfg)
    polls = []

    def supervise():
        polls.append(clock.t)
        return True  # actors alive, sending nothing
    with pytest.raises(ActorFailed, match="actor_timeout_s"):
        drv.serve(ScriptedQueue(clock, [(f(0), True)]), d, supervise, lambda credits: None, cfg)
    # polls at +0.5 .. +2.0 after the last data (no give-up at exactly the timeout), then the fifth gives up
    assert [round(t - 1000.0, 3) for t in polls[1:]] == [0.5, 1.0, 1.5, 2.0, 2.5]


def test_serve_returns_once_no_actor_can_produce_and_the_queue_is_empty(clock):
    cfg = cfg_of(runner={"name": "sync", "poll_s": 0.5, "actor_timeout_s": 100.0})
    d, ln, _ = make(clock, cfg)
    q = ScriptedQueue(clock, [(f(0), True), (f(T), True)], depths=[3])  # 3 still queued at the first empty poll
    alive = iter([True, True, False, False])  # alive while the two fragments come, then gone
    drv.serve(q, d, lambda: next(alive), lambda credits: None, cfg)
    assert ln.updates == 1  # both fragments were offered before it returned
    assert q.looks == 2  # with 3 queued it went on; it returned at the next empty poll, with none


def test_serve_grants_the_starving_actors_credit_once_per_change(clock):
    cfg = cfg_of(runner={"name": "sync", "poll_s": 0.5, "actor_timeout_s": 100.0})
    d, ln, _ = make(clock, cfg)
    d.ledger.new_incarnation(1)  # incarnation 1 of actor 1, its stream on env 3
    d.ledger.mark_sent(1, 3, 2 * T - 1)  # it sent two rollouts; the learner received none yet
    polls = iter([True, True, True, False])
    grants = []
    drv.serve(ScriptedQueue(clock, []), d, lambda: next(polls), grants.append, cfg)
    assert grants == [{1: 2 * T}]  # granted once on the first empty poll; the same credit is not sent again


def test_start_up_marks_the_first_and_the_last_actor_slots_first_env_step(monkeypatch):
    # first_env_step: the earliest slot's; all_actors_stepping: once every slot has stepped, the latest slot's
    # first step; a slot's later sighting (a restarted life) changes neither, and 0 (not stepped yet) is no step
    monkeypatch.setattr(timeline, "_marks", {"process_start": 0.5})
    monkeypatch.setattr(timeline, "_actors", {})
    seen = timeline.FirstSteps(3)
    seen.saw(0, 5.0, {"born": 2.0, "booted": 3.0, "built": 4.0})
    seen.saw(1, 3.0)
    seen.saw(2, 0.0, {"born": 1.0, "built": 2.0})
    assert timeline.get("first_env_step") == 3.0 and timeline.get("all_actors_stepping") is None
    seen.saw(0, 9.0, {"born": 8.0, "built": 8.5})  # slot 0 again (a new life): not a start
    seen.saw(2, 7.0, {"born": 6.0, "built": 6.5, "stray": 6.8})
    assert timeline.get("all_actors_stepping") == 7.0 and timeline.get("first_env_step") == 3.0
    seen.saw(1, 1.0)  # (slot 1 stepped already)
    assert timeline.get("first_env_step") == 3.0 and timeline.get("all_actors_stepping") == 7.0
    # each slot's start, from the life that stepped first, counted from the process's start (0.5); what a runner
    # does not know (slot 1's birth) is left out, and so is what is not a moment of a start
    assert timeline.actor_starts() == {"born": {"0": 1.5, "2": 5.5}, "booted": {"0": 2.5}, "built": {"0": 3.5, "2": 6.0},
                                       "first_env_step": {"0": 4.5, "1": 2.5, "2": 6.5}}
    timeline.reset()
    assert timeline.actor_starts() == {}
