"""The books must be able to fail: a party that loses data without booking it shows up as unaccounted; the
in-flight parts are measured live; the tagged audit reaches through the assembled batch; restarts are
limited by intensity, not by a lifetime count; crashes and zombies leave the books closed."""
import dataclasses

import numpy as np
import pandas as pd
import pytest

from laglab import learner as learner_mod
from laglab.actor import Actor
from laglab.learner import Learner
from laglab.run import env_spec, run
from laglab.runners.driver import LearnerDriver
from laglab.runners.supervisor import ActorFailed, RestartIntensity
from laglab.tagged import TAGGED_ID

from test_protocol import balanced, cfg_of


def test_a_fragment_lost_without_booking_is_unaccounted(tmp_path, monkeypatch):
    real = LearnerDriver.offer
    calls = {"n": 0}

    def lossy(self, frag, first, age_s=0.0):  # staging silently loses every 7th fragment
        calls["n"] += 1
        if calls["n"] % 7 == 0:
            return None
        return real(self, frag, first, age_s)

    monkeypatch.setattr(LearnerDriver, "offer", lossy)
    s = run(cfg_of(runner={"name": "sync"}), tmp_path)
    t = s["transport"]
    assert not t["balanced"] and t["unaccounted"] == 16 * (calls["n"] // 7)
    assert t["worst_unaccounted_at_update"] > 0
    assert (pd.read_parquet(tmp_path / "metrics.parquet")["transport/unaccounted"] > 0).any()


def test_in_flight_is_measured_live_and_the_books_close_at_every_update(tmp_path):
    cfg = cfg_of(runner={"name": "thread"}, transport={"capacity": 8},
                 chaos={"name": "mix", "drop_p": 0.05, "duplicate_p": 0.1, "delay_p": 0.2, "delay_fragments": 3,
                        "stall_every_updates": 3, "stall_s": 0.1})
    s = run(cfg, tmp_path)
    df = pd.read_parquet(tmp_path / "metrics.parquet")
    assert (df["transport/unaccounted"] == 0).all()
    assert (df["transport/in_flight/queue"] > 0).any() and (df["transport/in_flight/link"] > 0).any()
    assert (df["transport/in_flight"] == df[[f"transport/in_flight/{k}" for k in ("in_hand", "link", "queue",
                                                                                   "staging")]].sum(axis=1)).all()
    assert balanced(s["transport"])
    assert s["transport"]["dropped"]["lost_in_transit"] == s["chaos"]["dropped_steps"]


# ---- the tagged audit reaches through the assembled batch -------------------------------------------------
@pytest.fixture(scope="module")
def batch_frags():
    cfg = cfg_of(env={"id": TAGGED_ID, "kwargs": {"horizon": 3}})
    spec = env_spec(cfg)
    learner = Learner(cfg, spec)
    actor = Actor(cfg, 1, 7)
    actor.load(learner.snapshot())
    frags = actor.collect().fragments + actor.collect().fragments  # 4 envs x 2 rollouts: 4 joined pairs
    assert any(f.truncated.any() for f in frags)
    return learner, frags


def test_an_honest_batch_passes_the_audit(batch_frags):
    learner, frags = batch_frags
    assert learner.audit(frags) == 0
    assert learner.audit(frags[::-1]) == 0  # order in the batch does not matter


@pytest.mark.parametrize("tamper", ["obs_columns", "reward_shift", "last_obs", "trunc_obs", "actions"])
def test_the_audit_catches_misaligned_assembly(batch_frags, monkeypatch, tamper):
    learner, frags = batch_frags
    real = learner_mod.stack

    def bad_stack(fr):
        s = real(fr)
        if tamper == "obs_columns":  # stacking put fragment n+1's observations in column n
            return s._replace(obs=np.roll(s.obs, 1, axis=1))
        if tamper == "reward_shift":  # rewards one step out of line with their observations
            return s._replace(rewards=np.roll(s.rewards, 1, axis=0))
        if tamper == "last_obs":  # the bootstrap observation of another fragment
            return s._replace(last_obs=np.roll(s.last_obs, 1, axis=0))
        if tamper == "trunc_obs":  # the final observation replaced by the reset observation that followed it
            t = s.trunc_pos // s.N
            return s._replace(trunc_obs=s.obs[np.minimum(t + 1, s.T - 1), s.trunc_pos % s.N].copy())
        return s._replace(actions=1 - s.actions)

    monkeypatch.setattr(learner_mod, "stack", bad_stack)
    assert learner.audit(frags) > 0


def test_the_audit_catches_a_wrong_join(batch_frags):
    learner, frags = batch_frags
    a, b = frags[0], frags[4]  # env 0: b continues a
    assert learner.audit([a, b]) == 0
    # b's first observation replaced by a different one with the right tags: only the join check sees it
    obs = b.obs.copy()
    obs[0, 0] = -obs[0, 0]
    rewards = b.rewards.copy()
    rewards[0] = float(int(b.actions[0]) == int(obs[0, 0] > 0))  # keep the reward consistent with the new cue
    b2 = dataclasses.replace(b, obs=obs, rewards=rewards)
    assert learner.audit([b2]) == 0 and learner.audit([a, b2]) == 1


# ---- restarts, crashes, zombies ---------------------------------------------------------------------------
def test_restart_intensity_counts_restarts_within_the_window_only():
    now = [0.0]
    ri = RestartIntensity(2, 10.0, clock=lambda: now[0])
    for t in (0.0, 5.0, 10.5, 16.0, 21.0, 26.5):  # never more than 2 within 10 s
        now[0] = t
        ri.record(0, "x")
    assert ri.total == 6
    now[0] = 27.0
    ri.record(1, "other slot")  # counted per slot
    with pytest.raises(ActorFailed, match="actors_max_restarts=2"):
        now[0] = 30.0
        ri.record(0, "third within 10 s")


def test_kills_spread_out_in_time_never_exhaust_the_restarts(tmp_path):
    s = run(cfg_of(runner={"name": "thread", "actors_max_restarts": 1, "restart_window_s": 0.05,
                           "restart_backoff_s": 0.2},
                   chaos={"name": "kill", "kill_every_steps": 512}), tmp_path)
    assert s["status"] == "completed" and s["actor_restarts"] == s["chaos"]["kills"] >= 4
    assert balanced(s["transport"])


def test_a_real_actor_exception_with_fragments_held_on_the_link_keeps_the_books(tmp_path, monkeypatch):
    real = Actor.collect
    calls = {"n": 0}

    def flaky(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] % 5 == 0:
            raise RuntimeError("simulated env crash")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Actor, "collect", flaky)
    s = run(cfg_of(runner={"name": "thread", "actors_max_restarts": 100, "restart_backoff_s": 0.0},
                   chaos={"name": "slow_link", "delay_p": 0.5, "delay_fragments": 6}), tmp_path)
    assert s["actor_restarts"] >= 3 and s["chaos"]["delayed"] > 0
    t = s["transport"]
    assert balanced(t) and "lost_in_transit" not in t["dropped"]  # the link delivered what it held


def test_a_hung_actor_that_wakes_up_is_refused_at_the_endpoint(tmp_path):
    s = run(cfg_of(runner={"name": "thread", "heartbeat_timeout_s": 0.5, "actors_max_restarts": 5},
                   chaos={"name": "hang", "hang_every_steps": 2000}), tmp_path)
    t = s["transport"]
    # each hang: the zombie's whole rollout (4 envs x 16 steps) is refused, none of it trained on
    assert s["chaos"]["hangs"] >= 1 and t["dropped"]["abandoned"] == 64 * s["chaos"]["hangs"]
    assert balanced(t) and t["misattributed"] == 0


def test_an_actor_whose_newest_fragments_are_all_lost_still_gets_credit(tmp_path):
    # one env per actor, at most one rollout of lead: a lost fragment used to stall its actor for good
    s = run(cfg_of(runner={"name": "thread", "actor_timeout_s": 20.0}, total_env_steps=4096,
                   actor={"envs_per_actor": 1, "rollout_len": 16, "max_lead_steps": 16},
                   learner={"batch_size": 32, "minibatches": 2, "epochs": 1},
                   chaos={"name": "lossy", "drop_p": 0.2}), tmp_path)
    assert s["status"] == "completed" and s["env_steps"] > 4096 - 2 * 16
    assert balanced(s["transport"]) and s["transport"]["dropped"]["lost_in_transit"] == s["chaos"]["dropped_steps"]


def test_a_link_that_loses_data_silently_is_caught_by_the_watermarks(tmp_path, monkeypatch):
    from laglab.chaos import ChaosChannel

    real = ChaosChannel.send
    silent = {"n": 0, "k": 0}

    def leaky(self, frag):  # loses every 7th fragment and tells nobody (no chaos counter)
        silent["k"] += 1
        if silent["k"] % 7 == 0:
            silent["n"] += 1
            return
        real(self, frag)

    monkeypatch.setattr(ChaosChannel, "send", leaky)
    s = run(cfg_of(runner={"name": "sync"}), tmp_path)
    t = s["transport"]
    assert s["chaos"]["dropped_steps"] == 0 and silent["n"] > 0
    assert t["dropped"]["lost_in_transit"] == 16 * silent["n"] and balanced(t)
