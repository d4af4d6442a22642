"""Fragments: identity, contiguity across rollouts, episode bookkeeping, truncation bootstrap."""
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from laglab.actor import Actor, throttle_state
from laglab.config import Config, validate
from laglab.learner import Learner
from laglab.policy import Snapshot
from laglab.run import env_spec


def small_cfg(**over) -> Config:
    base = OmegaConf.structured(Config)
    cfg = OmegaConf.merge(base, OmegaConf.create({"actors": 1, "total_env_steps": 4096,
                                                  "actor": {"envs_per_actor": 3, "rollout_len": 16},
                                                  "learner": {"batch_size": 48, "minibatches": 2}}),
                          OmegaConf.create(over))
    return validate(cfg)


def constant_value_snapshot(cfg, value=7.0, version=0):
    learner = Learner(cfg, env_spec(cfg))
    with torch.no_grad():
        learner.model.v[-1].weight.zero_()
        learner.model.v[-1].bias.fill_(value)
    return Snapshot.make(version, learner.model, np.zeros(4), np.ones(4))


def test_fragments_are_contiguous_and_identified():
    cfg = small_cfg(env={"max_episode_steps": 5})
    actor = Actor(cfg, actor_id=2, incarnation=9)
    actor.load(constant_value_snapshot(cfg))
    r1, r2 = actor.collect(), actor.collect()
    assert len(r1.fragments) == 3 and r1.steps == 48
    for e, (f1, f2) in enumerate(zip(r1.fragments, r2.fragments)):
        for f in (f1, f2):
            assert (f.id.actor_id, f.id.incarnation, f.id.env_index) == (2, 9, e)
            assert not f.obs.flags.writeable and not f.rewards.flags.writeable  # sealed once emitted
            assert f.length == 16 and f.id.length == 16 and f.id.behavior_version == 0
            assert not (f.terminated & f.truncated).any()
        assert f2.id.t_start == f1.id.t_end + 1
        dones = f1.terminated | f1.truncated
        assert f2.id.episode_id == f1.id.episode_id + int(dones.sum())
        if dones.any():
            assert f2.id.episode_t0 == 16 - 1 - int(np.flatnonzero(dones)[-1])
        else:
            assert f2.id.episode_t0 == f1.id.episode_t0 + 16
    # every episode ends by step 5, and the episode log agrees with the flags
    flags = sum(int((f.terminated | f.truncated).sum()) for f in r1.fragments)
    assert len(r1.episodes) == flags and all(ep.length <= 5 for ep in r1.episodes)


def test_truncations_carry_their_final_observation_and_returns_accumulate_per_episode():
    from laglab.tagged import TAGGED_ID, tags

    cfg = small_cfg(env={"id": TAGGED_ID, "kwargs": {"horizon": 2}}, algo={"advantage": {"gamma": 0.5}})
    actor = Actor(cfg, 0, 1)
    actor.load(constant_value_snapshot(cfg, value=7.0))
    frags = actor.collect().fragments + actor.collect().fragments
    n_trunc = 0
    for f in frags:
        ts = np.flatnonzero(f.truncated)
        assert f.trunc_obs.shape == (len(ts), 4)  # one final observation per truncated step, in time order
        for k, t in enumerate(ts):  # the final obs is the step after obs[t] in the same episode (t = horizon)
            before, final = tags(f.obs[t]), tags(f.trunc_obs[k])
            assert (final[0], final[1], final[2]) == (before[0], before[1], 2)
            if t + 1 < len(f.obs):  # ... while the next obs already belongs to the next episode
                assert tags(f.obs[t + 1])[1] == before[1] + 1 and tags(f.obs[t + 1])[2] == 0
        n_trunc += len(ts)
        # the discounted raw return of the running episode, reset after each end (gamma 0.5), by hand:
        acc, want = 0.0, []
        first_t = tags(f.obs[0])[2]
        acc = sum(0.5 ** (first_t - 1 - i) for i in range(first_t)) if first_t else 0.0  # earlier right steps
        for r, done in zip(f.rewards, f.terminated | f.truncated):
            acc = acc * 0.5 + r
            want.append(acc)
            acc = 0.0 if done else acc
        np.testing.assert_allclose(f.disc_return, want, rtol=1e-6)
    assert n_trunc > 0


def test_actor_runs_one_version_per_rollout():
    cfg = small_cfg()
    actor = Actor(cfg, 0, 1)
    actor.load(constant_value_snapshot(cfg, version=0))
    a = actor.collect()
    actor.load(constant_value_snapshot(cfg, version=5))
    b = actor.collect()
    assert {f.id.behavior_version for f in a.fragments} == {0}
    assert {f.id.behavior_version for f in b.fragments} == {5}
    assert actor.stats.loads == 2


def test_same_seed_same_fragments():
    cfg = small_cfg()
    snap = constant_value_snapshot(cfg)
    out = []
    for _ in range(2):
        actor = Actor(cfg, 1, 1)
        actor.load(snap)
        out.append(actor.collect().fragments)
    for f, g in zip(*out):
        np.testing.assert_array_equal(f.obs, g.obs)
        np.testing.assert_array_equal(f.actions, g.actions)
    other = Actor(cfg, 1, 2)  # a new incarnation explores differently
    other.load(snap)
    assert any(not np.array_equal(f.obs, g.obs) for f, g in zip(out[0], other.collect().fragments))


def test_throttle_rule():
    consumed = Snapshot(0, {}, np.zeros(1), np.ones(1), {3: 100}).consumed
    assert throttle_state(150, consumed, 3, None) == (False, 50)
    assert throttle_state(150, consumed, 3, 50) == (True, 50)
    assert throttle_state(149, consumed, 3, 50) == (False, 49)
    assert throttle_state(10, consumed, 4, 50) == (False, 10)  # nothing credited yet to incarnation 4


# ---- the episode log against the env's own ledger -------------------------------------------------------------
import gymnasium as gym  # noqa: E402

LEDGER_ID = "laglab_test/Ledger-v0"
LEDGER: dict = {}  # env instance -> [(return, length)] of every episode it finished, summed in the env itself
STEPS: dict = {}  # env instance -> per step: (episode index, its steps before this one, discounted return after, reward)


class LedgerEnv(gym.Env):
    """Episodes of random length (1..max_len; every third one truncated by the env, not terminated) with
    non-integer rewards; the env itself keeps the truth, per instance: each finished episode's return (a float64
    sum, step by step) and length, and per step the episode's index, its steps so far and its discounted return
    (gamma as the actor's). ``fail_after``: the instance raises on that step (counting from 1)."""

    def __init__(self, max_len: int = 40, gamma: float = 0.9, fail_after: int = 0):
        self.max_len, self.gamma, self.fail_after = max_len, gamma, fail_after
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.instance, self.episodes, self.steps = 0, 0, 0

    def set_instance(self, i: int) -> None:
        self.instance = i
        LEDGER[i], STEPS[i] = [], []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.len = int(self.np_random.integers(1, self.max_len + 1))
        self.t, self.ret, self.disc = 0, 0.0, 0.0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.steps += 1
        if self.steps == self.fail_after:
            raise RuntimeError("the simulator crashed")
        r = float(self.np_random.normal()) * 0.37 + 0.1 * int(action)
        self.disc = self.disc * self.gamma + r
        STEPS[self.instance].append((self.episodes, self.t, self.disc, r))
        self.t += 1
        self.ret += r
        end = self.t >= self.len
        if end:
            LEDGER[self.instance].append((self.ret, self.t))
            self.episodes += 1
        trunc = end and self.episodes % 3 == 0
        return np.full(2, self.t / self.max_len, np.float32), r, end and not trunc, trunc, {}


gym.register(LEDGER_ID, entry_point=LedgerEnv)


def _ledger_cfg(**kwargs):
    return small_cfg(env={"id": LEDGER_ID, "kwargs": {"gamma": 0.9, **kwargs}}, algo={"advantage": {"gamma": 0.9}},
                     actor={"envs_per_actor": 4, "rollout_len": 16, "refresh_lag": 1})


def test_episodes_and_fragments_are_the_envs_own_across_rollouts_subsets_and_discards():
    """The actor's episode log (return, length, which env) equals the ledger each env keeps itself, and every
    fragment's identity (episode, its step at the fragment's start) and running discounted return (what reward
    scaling reads) equal the env's own, for episodes that span rollouts, several that end in one rollout, rollouts
    of a subset of the envs (the sync runner's), and rollouts discarded part-way (actor.refresh_lag: their steps
    still belong to their episodes)."""
    cfg = _ledger_cfg()
    actor = Actor(cfg, actor_id=3, incarnation=1)
    actor.load(constant_value_snapshot(cfg))
    got = {e: [] for e in range(4)}
    pos = [0] * 4  # per env: the env steps before the next fragment's first
    discards = checked = 0
    for k in range(40):
        if k % 7 == 3:  # the newest moves 2 versions ahead at step 1 + k % 5: discarded there
            calls = []
            ro = actor.collect(newest=lambda: 0 if calls.append(1) or len(calls) <= 1 + k % 5 else 2)
            assert ro.discarded == 4 * (1 + k % 5) and ro.fragments == []
            pos = [p + ro.discarded // 4 for p in pos]
            discards += 1
        elif k % 4 == 1:
            ro = actor.collect(envs=[2, 0], newest=lambda: 0)
        else:
            ro = actor.collect(newest=lambda: 0)
        for f in ro.fragments:
            e = f.id.env_index
            truth = STEPS[12 + e][pos[e]:pos[e] + 16]
            assert (f.id.episode_id, f.id.episode_t0) == truth[0][:2]
            np.testing.assert_allclose(f.disc_return, [d for _, _, d, _ in truth], rtol=1e-6, atol=1e-6)
            pos[e] += 16
            checked += 1
        for ep in ro.episodes:
            assert ep.actor_id == 3
            got[ep.env_index].append((ep.ret, ep.length))
    assert discards >= 5 and checked >= 100
    for e in range(4):
        want = LEDGER[12 + e]
        assert len(want) >= 10 and len(got[e]) == len(want)
        assert [n for _, n in got[e]] == [n for _, n in want]
        np.testing.assert_allclose([r for r, _ in got[e]], [r for r, _ in want], rtol=1e-12, atol=1e-12)


def test_an_env_that_raises_mid_rollout_leaves_the_counters_at_the_last_whole_step():
    """Env 0 of the group raises part-way through a rollout: the actor's per-env counters (episode, its steps and
    return, the discounted return) are the envs' own after the steps that completed -- never a rollout's
    half-written state."""
    cfg = _ledger_cfg(fail_after=16 * 3 + 7)
    actor = Actor(cfg, actor_id=0, incarnation=1)
    actor.load(constant_value_snapshot(cfg))
    for _ in range(3):
        actor.collect()
    with pytest.raises(RuntimeError, match="crashed"):
        actor.collect()
    for e in range(4):
        assert len(STEPS[e]) == 16 * 3 + 6  # every env took the six whole steps (env 0 steps first)
        episode, t, disc, _ = STEPS[e][-1]
        ended = len(LEDGER[e]) > episode  # the last whole step ended its episode
        assert actor.t[e] == 16 * 3 + 6 and actor.episode_id[e] == len(LEDGER[e])
        assert actor.episode_t[e] == (0 if ended else t + 1)
        assert actor.disc_return[e] == pytest.approx(0.0 if ended else disc, abs=1e-12)
        running = [r for ep, _, _, r in STEPS[e] if ep == episode and not ended]
        assert actor.ep_return[e] == pytest.approx(sum(running), rel=1e-12, abs=1e-12)
